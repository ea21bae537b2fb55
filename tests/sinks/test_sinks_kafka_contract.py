"""The reusable sink contract, run against the Kafka sink on the test broker: what a
``read_committed`` consumer of the topic sees plays the part of the visible files,
and the sink's local staging directory the part of the output directory."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from sealstream.sinks import Sink
from sealstream.sinks.kafka import KafkaSink
from sealstream.testing.kafka_read import read_committed
from sealstream.testing.sink_contract import SinkContract


class _KafkaContract(SinkContract):
    kafka: Any

    @pytest.fixture(autouse=True)
    def _broker(self, kafka: Any) -> None:
        self.kafka = kafka
        self.topics: dict[Path, str] = {}

    def _topic(self, path: Path) -> str:
        if path not in self.topics:
            digest = hashlib.sha256(str(path).encode()).hexdigest()[:16]
            self.topics[path] = f"c-{digest}"
            from sealstream.testing.brokers import create_topic

            create_topic(self.kafka.bootstrap, self.topics[path], 2)
        return self.topics[path]

    def make_sink(self, path: Path, run_token: str) -> Sink:
        return KafkaSink(self.kafka.bootstrap, self._topic(path), self.role, run_token, path,
                         retry_s=20)

    def visible_rows(self, path: Path) -> list[dict[str, Any]]:
        return [json.loads(m.value) for m in read_committed(self.kafka.bootstrap,
                                                             self._topic(path))]


class TestKafkaResultsContract(_KafkaContract):
    role = "results"


class TestKafkaRecordsContract(_KafkaContract):
    role = "records"
