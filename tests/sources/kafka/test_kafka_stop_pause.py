"""``stop = "end"``: a partition read up to the position the run stops at is paused
in the shared consumer (``SharedPartition.stop_at``), so the client stops fetching
it while the run reads the others (against a broker that answers an empty fetch at
once, a partition at its end was fetched again and again: CPU on both sides).
Against a real broker."""

from __future__ import annotations

from typing import Any

import pytest
from test_kafka_shared import PLAN, N, _good, _produce, _read_all  # (this directory's helpers)

from sealstream.sources.kafka import KafkaSettings, KafkaSource

pytest.importorskip("confluent_kafka")


def test_a_partition_read_to_its_stop_is_fetched_no_more(kafka: Any) -> None:
    topic = kafka.new_topic(partitions=2)
    _produce(kafka.bootstrap, topic, 2, N)
    src = KafkaSource(KafkaSettings(kafka.bootstrap, topic), PLAN)
    parts = [src.open(n, None) for n in sorted(src.discover())]
    first, other = parts
    reader = first._reader
    assert other._reader is reader  # the shared consumer
    try:
        first.stop_at(N)  # the run reads partition 0 up to N; partition 1 goes on
        got = _read_all(parts, N, 50)
        assert _good(got[0]) == list(range(N))
        assert first._num in reader.paused and other._num not in reader.paused
        # what is produced since is fetched for partition 1 only
        _produce(kafka.bootstrap, topic, 2, N)
        _read_all([other], 2 * N, 50)
        assert other.position == 2 * N
        assert first._queued == 0 and first.position == N  # nothing fetched past its stop
        reader.drained(first)  # a drained queue does not resume it
        assert first._num in reader.paused
        # a seek back (a replay) fetches it again, and it is paused at its stop again
        first.seek(N - 10)
        assert first._num not in reader.paused
        again = _read_all([first], N, 50)
        assert _good(again[0])[:10] == list(range(N - 10, N))
        assert first._num in reader.paused
    finally:
        for part in parts:
            part.close()
    assert not reader.stops and not reader.paused
