"""Which sink a sink is, without importing the sinks a job does not use.

The engine treats database and Kafka sinks apart (transactions, job names). Their
modules are imported only by :func:`sealstream.sinks.open_sink` when a spec names
them, so a JSONL job never loads them: when a module is not loaded, no sink of
its class exists, and the answer is False without importing it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TypeGuard

if TYPE_CHECKING:
    from sealstream.sinks.database import DatabaseSink
    from sealstream.sinks.kafka import KafkaSink

_DATABASE = "sealstream.sinks.database"
_KAFKA = "sealstream.sinks.kafka"


def is_database_sink(sink: object) -> TypeGuard[DatabaseSink]:
    """Whether ``sink`` is a :class:`~sealstream.sinks.database.DatabaseSink`."""
    mod = sys.modules.get(_DATABASE)
    return mod is not None and isinstance(sink, mod.DatabaseSink)


def is_kafka_sink(sink: object) -> TypeGuard[KafkaSink]:
    """Whether ``sink`` is a :class:`~sealstream.sinks.kafka.KafkaSink`."""
    mod = sys.modules.get(_KAFKA)
    return mod is not None and isinstance(sink, mod.KafkaSink)
