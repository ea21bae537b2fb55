"""The NATS JetStream source against a real nats-server: positions are stream
sequences per subject, start modes, message metadata, quiet subjects, and expiry
(refused, never skipped)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from sealstream.errors import SourceChangedError, SourceExpiredError, SpecError
from sealstream.sources import FieldPlan
from sealstream.sources._base import Chunk
from sealstream.sources.nats import NatsPartition, NatsSettings, NatsSource

PLAN = FieldPlan(key="user", time="ts", fields={"amount": "numeric"})


def ev(i: int, user: str = "u") -> dict[str, Any]:
    return {"user": user, "ts": 1000 * i, "amount": i}


def source(url: str, stream: str, subjects: list[str], plan: FieldPlan = PLAN,
           **more: Any) -> NatsSource:
    settings = NatsSettings.from_table(
        {"servers": url, "stream": stream, "subjects": subjects, **more})
    return NatsSource(settings, plan)


@pytest.fixture
def opened() -> Iterator[list[NatsSource]]:
    sources: list[NatsSource] = []
    yield sources
    for s in sources:
        s.close()


def read_all(part: NatsPartition, limit: int = 100) -> list[Chunk]:
    """Poll until a poll brings nothing."""
    chunks = []
    for _ in range(limit):
        c = part.poll(1000, 300)
        assert c is not None
        if c.last_offset is None:
            return chunks
        chunks.append(c)
    raise AssertionError("the partition never ran dry")


def offsets(chunks: list[Chunk]) -> list[int]:
    return [o for c in chunks for o in c.events["__off"].to_list()]


def test_positions_are_stream_sequences_of_the_subject(jet: Any, opened: list[NatsSource]) -> None:
    jet.create(["a", "b"])
    seqs = jet.publish([("a" if i % 3 else "b", ev(i)) for i in range(12)])
    src = source(jet.url, jet.stream, [jet.s("a"), jet.s("b")])
    opened.append(src)
    assert src.discover() == [jet.s("a"), jet.s("b")]
    a = src.open(jet.s("a"), None)
    chunks = read_all(a)
    want = [s for i, s in enumerate(seqs) if i % 3]
    assert offsets(chunks) == want
    assert chunks[-1].position.offset == want[-1] + 1
    amounts = [x for c in chunks for x in c.events["__i:amount"].to_list()]
    assert amounts == [i for i in range(12) if i % 3]
    # resuming mid-way gives the rest, exactly; the lag is what JetStream counted
    a2 = src.open(jet.s("a"), want[3])
    first = a2.poll(1, 1000)
    assert first is not None and offsets([first]) == [want[3]]
    assert a2.cached_lag() == len(want) - 4 and a2.connected
    assert offsets(read_all(a2)) == want[4:] and a2.cached_lag() == 0
    assert a.earliest() == 1 and a.end() == seqs[-1] + 1


def test_bad_messages_carry_their_sequence(jet: Any, opened: list[NatsSource]) -> None:
    jet.create(["a"])
    seqs = jet.publish([("a", ev(1)), ("a", b"oops"), ("a", b""), ("a", {"user": "x"})])
    src = source(jet.url, jet.stream, [jet.s("a")])
    opened.append(src)
    chunks = read_all(src.open(jet.s("a"), None))
    assert offsets(chunks) == [seqs[0]]
    bad = [r for c in chunks for r in c.bad.select("_offset", "_reason").rows()]
    assert [o for o, _ in bad] == seqs[1:]
    assert "missing time field 'ts'" in bad[2][1]


def test_key_is_the_subject_and_time_is_the_stored_time(
    jet: Any, opened: list[NatsSource]
) -> None:
    jet.create(["orders.*"])
    before = int(time.time() * 1000)
    jet.publish([("orders.eu", {"amount": 1}), ("orders.us", {"amount": 2})])
    after = int(time.time() * 1000)
    plan = FieldPlan(key="@key", time="@timestamp", fields={"amount": "numeric"})
    src = source(jet.url, jet.stream, [jet.s("orders.*")], plan)
    opened.append(src)
    chunks = read_all(src.open(jet.s("orders.*"), None))
    rows = [r for c in chunks for r in c.events.select("__key", "__t").rows()]
    assert [k for k, _ in rows] == [jet.s("orders.eu"), jet.s("orders.us")]
    assert all(before - 1000 <= t <= after + 1000 for _, t in rows)


def test_start_latest_and_by_time(jet: Any, opened: list[NatsSource]) -> None:
    jet.create(["a"])
    jet.publish([("a", ev(i)) for i in range(3)])
    src = source(jet.url, jet.stream, [jet.s("a")], start="latest")
    opened.append(src)
    part = src.open(jet.s("a"), None)
    assert part.poll(100, 200) is not None and part.position == 4
    cut_ms = int(time.time() * 1000) + 1
    while int(time.time() * 1000) <= cut_ms:  # the stored times must pass the cut
        time.sleep(0.002)
    seqs = jet.publish([("a", ev(i)) for i in range(3, 5)])
    assert offsets(read_all(part)) == seqs
    by_time = source(jet.url, jet.stream, [jet.s("a")], start=cut_ms)
    opened.append(by_time)
    assert offsets(read_all(by_time.open(jet.s("a"), None))) == seqs


def test_a_quiet_subject_keeps_up_with_the_stream(jet: Any, opened: list[NatsSource]) -> None:
    jet.create(["a", "b"])
    jet.publish([("b", ev(0))])
    seqs = jet.publish([("a", ev(i)) for i in range(5)])
    src = source(jet.url, jet.stream, [jet.s("a"), jet.s("b")])
    opened.append(src)
    b = src.open(jet.s("b"), None)
    assert offsets(read_all(b)) == [1]
    deadline = time.monotonic() + 10
    while True:  # an empty poll moves it (at most every 0.5 s)
        c = b.poll(100, 100)
        assert c is not None and c.last_offset is None
        if c.position.offset == seqs[-1] + 1:
            break
        assert time.monotonic() < deadline, c.position
    assert b.position == seqs[-1] + 1


def test_expired_by_max_msgs_before_the_run(jet: Any, opened: list[NatsSource]) -> None:
    jet.create(["a"], max_msgs=5)
    jet.publish([("a", ev(i)) for i in range(9)])
    src = source(jet.url, jet.stream, [jet.s("a")])
    opened.append(src)
    with pytest.raises(SourceExpiredError) as e:
        src.open(jet.s("a"), 2)
    msg = str(e.value)
    assert repr(jet.s("a")) in msg and "saved position 2" in msg and "earliest available 5" in msg
    assert f"replay --from {jet.s('a')}=5" in msg and "--start-over" in msg
    assert offsets(read_all(src.open(jet.s("a"), 5))) == [5, 6, 7, 8, 9]


def test_expired_by_max_msgs_during_the_run(jet: Any, opened: list[NatsSource]) -> None:
    jet.create(["a"], max_msgs=5)
    jet.publish([("a", ev(i)) for i in range(3)])
    src = source(jet.url, jet.stream, [jet.s("a")])
    opened.append(src)
    part = src.open(jet.s("a"), None)
    c = part.poll(2, 500)
    assert c is not None and offsets([c]) == [1, 2]
    jet.publish([("a", ev(i)) for i in range(3, 10)])  # 3..7 pushed out before they are read
    with pytest.raises(SourceExpiredError, match="next position to read [34]"):  # 3: read ahead
        read_all(part)


def test_expired_by_max_age_before_and_during_the_run(
    jet: Any, opened: list[NatsSource]
) -> None:
    jet.create(["a"], max_age=1.0)
    jet.publish([("a", ev(i)) for i in range(4)])
    src = source(jet.url, jet.stream, [jet.s("a")])
    opened.append(src)
    during = src.open(jet.s("a"), None)
    c = during.poll(1, 500)
    assert c is not None and offsets([c]) == [1]
    deadline = time.monotonic() + 30
    while jet.state().messages:  # the server removes them by age
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with pytest.raises(SourceExpiredError, match="saved position 2"):
        src.open(jet.s("a"), 2)
    # the message after the first may have arrived before the server removed it (read
    # ahead): it is then read, and the refusal names the one after it
    with pytest.raises(SourceExpiredError, match="next position to read [23]"):
        read_all(during)


def test_a_deleted_message_of_the_subject_is_refused(jet: Any, opened: list[NatsSource]) -> None:
    jet.create(["a", "b"])
    jet.publish([("a", ev(i)) for i in range(6)])
    src = source(jet.url, jet.stream, [jet.s("a")])
    opened.append(src)
    part = src.open(jet.s("a"), None)
    jet.delete(4)
    c = part.poll(2, 500)
    assert c is not None and offsets([c]) == [1, 2]
    with pytest.raises(SourceExpiredError, match="stream sequence 4 was deleted"):
        read_all(part)
    resumed = src.open(jet.s("a"), 3)  # refused when reading reaches the deleted one
    with pytest.raises(SourceExpiredError, match="stream sequence 4 was deleted"):
        read_all(resumed)
    assert offsets(read_all(src.open(jet.s("a"), 5))) == [5, 6]


def test_a_recreated_stream_is_a_changed_source(jet: Any, opened: list[NatsSource]) -> None:
    jet.create(["a"])
    jet.publish([("a", ev(0))])
    src = source(jet.url, jet.stream, [jet.s("a")])
    opened.append(src)
    with pytest.raises(SourceChangedError, match="beyond the end"):
        src.open(jet.s("a"), 50)


def test_settings_are_checked() -> None:
    with pytest.raises(SpecError, match="subjects"):
        NatsSettings.from_table({"stream": "S", "subjects": []})
    with pytest.raises(SpecError, match="stream"):
        NatsSettings.from_table({"stream": "a.b", "subjects": ["a"]})
    with pytest.raises(SpecError, match="start"):
        NatsSettings.from_table({"stream": "S", "subjects": ["a"], "start": "soon"})
    s = NatsSettings.from_table({"stream": "S", "subjects": "a", "start": "1970-01-01T00:00:01Z",
                                 "servers": ["nats://h:1", "nats://h:2"]})
    assert s.start == 1000 and s.address == "nats://h:1,nats://h:2"
    assert np.int64(1)  # numpy stays imported for the typed helpers
