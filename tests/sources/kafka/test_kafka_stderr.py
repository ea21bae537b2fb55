"""What ``sealstream run`` of a Kafka source prints on stderr when the broker is not
there: librdkafka's log goes through Python logging (no ``%3|...|FAIL|`` flood), at
most one warning line per kind of broker error while retrying, then the error line."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_kafka_runs import kafka_source, run, write_spec

from sealstream.testing.brokers import free_port

pytest.importorskip("confluent_kafka")


def test_an_unreachable_broker_gives_a_few_lines_not_a_flood(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    spec = write_spec(tmp_path, kafka_source(address, "events", extra="fail_after_ms = 4000"))
    t0 = time.monotonic()
    r = run(spec)
    assert r.returncode == 1 and time.monotonic() - t0 < 120
    lines = r.stderr.strip().splitlines()
    assert not [ln for ln in lines if ln.startswith("%")], lines[:3]  # was ~75 lines
    warnings = lines[:-1]
    assert all(w.startswith("sealstream: warning: kafka source: the broker at "
                            f"{address} ") and w.endswith("; retrying") for w in warnings), lines
    assert 1 <= len(warnings) <= 3 and len(set(warnings)) == len(warnings), warnings
    assert lines[-1].startswith(f"sealstream: error: kafka broker {address} unreachable")
