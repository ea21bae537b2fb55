"""NATS server faults: unreachable at start (bounded, naming the address), lost and
back mid-run (nothing lost or repeated), lost for longer than fail_after_ms."""

from __future__ import annotations

import time
from typing import Any

import pytest

from sealstream.errors import SourceUnavailableError
from sealstream.sources import FieldPlan
from sealstream.sources.nats import NatsSettings, NatsSource
from sealstream.testing.brokers import free_port

PLAN = FieldPlan(key="user", time="ts", fields={"amount": "numeric"})


def test_unreachable_at_start_fails_in_bounded_time_naming_the_address() -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    settings = NatsSettings.from_table(
        {"servers": url, "stream": "S", "subjects": ["a"], "fail_after_ms": 800})
    t0 = time.monotonic()
    with pytest.raises(SourceUnavailableError, match=url) as e:
        NatsSource(settings, PLAN)
    assert time.monotonic() - t0 < 15
    assert "800 ms" in str(e.value)


def _restartable(own_nats: Any) -> Any:
    from _jet import Jet

    return Jet(own_nats.url, "RESTART")


def test_server_restart_mid_run_loses_and_repeats_nothing(own_nats: Any) -> None:
    jet = _restartable(own_nats)
    jet.create(["a"])
    first = jet.publish([("a", {"user": "u", "ts": i, "amount": i}) for i in range(5)])
    settings = NatsSettings.from_table({"servers": own_nats.url, "stream": jet.stream,
                                        "subjects": [jet.s("a")], "fail_after_ms": 60_000})
    src = NatsSource(settings, PLAN)
    try:
        part = src.open(jet.s("a"), None)
        c = part.poll(3, 1000)
        assert c is not None
        got = c.events["__off"].to_list()
        own_nats.stop()
        deadline = time.monotonic() + 20
        while src.connected:  # the client notices the server is gone
            assert time.monotonic() < deadline
            c = part.poll(100, 50)
            assert c is not None
            got += c.events["__off"].to_list()
        c = part.poll(100, 50)
        assert c is not None and c.last_offset is None  # nothing yet while it is away
        own_nats.start()
        more = jet.publish([("a", {"user": "u", "ts": i, "amount": i}) for i in range(5, 8)])
        deadline = time.monotonic() + 30
        while len(got) < len(first) + len(more):
            assert time.monotonic() < deadline, got
            c = part.poll(100, 200)
            assert c is not None
            got += c.events["__off"].to_list()
        assert got == first + more and src.connected and part.connected
    finally:
        src.close()


def test_lost_for_longer_than_fail_after_ms_fails_the_run(own_nats: Any) -> None:
    jet = _restartable(own_nats)
    jet.create(["a"])
    jet.publish([("a", {"user": "u", "ts": 1, "amount": 1})])
    settings = NatsSettings.from_table({"servers": own_nats.url, "stream": jet.stream,
                                        "subjects": [jet.s("a")], "fail_after_ms": 500})
    src = NatsSource(settings, PLAN)
    try:
        part = src.open(jet.s("a"), None)
        assert part.poll(10, 1000) is not None
        own_nats.stop()
        deadline = time.monotonic() + 30
        with pytest.raises(SourceUnavailableError, match=own_nats.url):
            while True:
                assert time.monotonic() < deadline
                part.poll(10, 100)
    finally:
        src.close()
