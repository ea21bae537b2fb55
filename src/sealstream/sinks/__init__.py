"""Output sinks: two-phase, per-epoch outputs (see :mod:`sealstream.sinks._base`).

* :class:`JsonlDirSink` - a directory of ``part-{epoch:012d}-{run}.jsonl`` files
  (results, late events, bad records); exactly once.
* :class:`ParquetDirSink` - a directory of ``part-{epoch:012d}-{run}.parquet``
  files (results only); exactly once. Column types may differ between files.
* :class:`StdoutSink` - prints at commit; for quick looks, not exactly once
  across crashes.
* :class:`~sealstream.sinks.database.DatabaseSink` - results upserted into a
  SQLite or PostgreSQL table; exactly once, in the checkpoint's own transaction
  when the checkpoint store is the same database.
* :class:`~sealstream.sinks.kafka.KafkaSink` - one message per row into a Kafka
  topic, each epoch in one transaction; exactly once for ``read_committed``
  consumers (needs confluent-kafka, the ``kafka`` extra).

:func:`open_sink` builds the sink of a spec's output.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sealstream._objects import ObjectStoreError, is_object_url
from sealstream.errors import SinkError
from sealstream.sinks._base import (
    JSON_LINE,
    RECORD_ID_COLUMNS,
    RESULT_ID_COLUMNS,
    CommittedFile,
    Sink,
    SinkRole,
    id_columns,
)
from sealstream.sinks._files import id_schema
from sealstream.sinks.jsonl import JsonlDirSink
from sealstream.sinks.parquet import ParquetDirSink
from sealstream.sinks.stdout import StdoutSink

if TYPE_CHECKING:
    from sealstream.pipeline import Output

__all__ = [
    "CommittedFile",
    "JSON_LINE",
    "JsonlDirSink",
    "ParquetDirSink",
    "RECORD_ID_COLUMNS",
    "RESULT_ID_COLUMNS",
    "Sink",
    "SinkRole",
    "StdoutSink",
    "id_columns",
    "id_schema",
    "open_sink",
]


def open_sink(output: Output, role: SinkRole, run_token: str,
              aggregates: dict[str, str] | None = None) -> Sink:
    """The sink for ``output`` in ``role``, staging under ``run_token``.

    ``jsonl`` -> :class:`JsonlDirSink`, ``parquet`` -> :class:`ParquetDirSink`
    (role ``"results"`` only), ``stdout`` -> :class:`StdoutSink`. Directory
    outputs are created if missing. Raises :class:`SinkError` for an unknown
    kind, parquet for records, or a directory that cannot be created, and
    :class:`~sealstream.errors.SpecError` for a directory output without a path.
    """
    if output.kind == "stdout":
        return StdoutSink(role)
    if output.kind in ("sqlite", "postgresql"):
        from sealstream.checkpoint.stores import redact, sqlite_path
        from sealstream.sinks.database import DatabaseSink

        if output.url is None or output.table is None:
            raise SinkError(f"a {output.kind} output needs url and table")
        target: str | Path = (sqlite_path(output.url, output.base_dir)
                              if output.kind == "sqlite" else output.url)
        return DatabaseSink(output.kind, target, output.table, aggregates or {}, run_token,
                            shown=redact(output.url), role=role)
    if output.kind == "kafka":
        from sealstream.sinks.kafka import KafkaSink

        if output.bootstrap is None or output.topic is None:
            raise SinkError("a kafka output needs bootstrap and topic")
        staging = (output.resolved if output.path
                   else output.base_dir / ".sealstream-staging" / f"kafka-{output.topic}")
        return KafkaSink(output.bootstrap, output.topic, role, run_token, staging,
                         dict(output.settings), shared_staging=not output.path)
    if output.kind in ("jsonl", "parquet") and output.path is not None \
            and is_object_url(output.path):
        return _object_sink(output, role, run_token)
    if output.kind == "jsonl":
        return JsonlDirSink(output.resolved, role, run_token)
    if output.kind == "parquet":
        if role != "results":
            raise SinkError(
                f'a parquet output can only hold results, not {role}; use kind = "jsonl"'
            )
        return ParquetDirSink(output.resolved, role, run_token)
    raise SinkError(f"unknown output kind {output.kind!r}; expected jsonl, parquet, stdout, "
                    "sqlite, postgresql or kafka")


#: (endpoint, bucket) pairs whose conditional writes were probed in this process
_PROBED: set[tuple[str | None, str]] = set()


def _object_sink(output: Output, role: SinkRole, run_token: str) -> Sink:
    """A jsonl or parquet output at ``s3://bucket/prefix`` (see
    :mod:`sealstream.sinks.objects`); the server's create-if-absent is probed first."""
    from sealstream._objects import open_objects
    from sealstream.sinks.objects import JsonlObjectSink, ParquetObjectSink

    assert output.path is not None
    if output.kind == "parquet" and role != "results":
        raise SinkError(f'a parquet output can only hold results, not {role}; use kind = "jsonl"')
    try:
        objects = open_objects(output.path, output.endpoint_url)
        seen = (getattr(objects, "endpoint_url", None), getattr(objects, "bucket", ""))
        if seen not in _PROBED:
            objects.probe()
            _PROBED.add(seen)
    except ObjectStoreError as exc:
        raise SinkError(f"cannot open the {role} output {output.path}: {exc}") from None
    if output.kind == "jsonl":
        return JsonlObjectSink(objects, role, run_token)
    return ParquetObjectSink(objects, role, run_token)
