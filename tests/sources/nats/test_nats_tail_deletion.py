"""Story: messages deleted at a JetStream stream's tail (JetStream keeps the stream's
last sequence at the deleted one, and no later delivery ever comes to settle it).

A live partition refuses within a bounded time, naming the subject and the sequences;
a ``stop = "end"`` backfill is not held by a deleted tail: it reaches its end, exits 0
and fires every final window, equal to a run over the files of what the stream held.
A refusal names the partition proven to have lost the message, not a neighbour."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sealstream.errors import SourceExpiredError
from sealstream.sources import FieldPlan
from sealstream.sources.nats import NatsPartition, NatsSettings, NatsSource

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
if str(SCENARIOS) not in sys.path:
    sys.path.insert(0, str(SCENARIOS))

from _story import committed, write_spec  # noqa: E402

PLAN = FieldPlan(key="user", time="ts", fields={"amount": "numeric"})
#: generous: the machine is shared; the refusal comes after one quiet check (0.5 s)
REFUSE_WITHIN_S = 60.0


def ev(i: int, user: str = "u") -> dict[str, Any]:
    return {"user": user, "ts": 1000 * i, "amount": i}


def _source(jet: Any, subjects: list[str]) -> NatsSource:
    return NatsSource(NatsSettings.from_table(
        {"servers": jet.url, "stream": jet.stream, "subjects": [jet.s(x) for x in subjects]}),
        PLAN)


def _read_until_refused(parts: list[NatsPartition]) -> tuple[list[int], SourceExpiredError]:
    """Poll the partitions in turn until one refuses (bounded); the offsets read."""
    got: list[int] = []
    deadline = time.monotonic() + REFUSE_WITHIN_S
    while time.monotonic() < deadline:
        for part in parts:
            try:
                c = part.poll(100, 100)
            except SourceExpiredError as e:
                return got, e
            assert c is not None
            got += c.events["__off"].to_list()
    raise AssertionError(f"no refusal within {REFUSE_WITHIN_S} s; read {got}")


def test_a_deleted_tail_of_the_subject_refuses_a_live_run(jet: Any) -> None:
    jet.create(["a", "b"])
    jet.publish([("a", ev(i)) for i in range(3)])  # 1..3
    src = _source(jet, ["a"])
    try:
        part = src.open(jet.s("a"), None)
        c = part.poll(10, 1000)  # less than a full batch: nothing asked for after it
        assert c is not None and c.events["__off"].to_list() == [1, 2, 3]
        assert jet.publish([("a", ev(3))]) == [4]
        jet.delete(4)  # the stream's last message, of the job's subject, never read
        got, e = _read_until_refused([part])
        assert got == []
        msg = str(e)
        assert msg.count("\n") == 0
        assert f"NATS partition {jet.s('a')!r}" in msg and "stream sequence 4 was deleted" in msg
        assert "next position to read 4" in msg
    finally:
        src.close()


def test_a_deleted_tail_of_another_subject_refuses_a_live_run(jet: Any) -> None:
    """JetStream keeps no subject for a deleted message: the job cannot prove it was
    not one of its own, so it refuses (as it does for a deletion in the middle)."""
    jet.create(["a", "b"])
    jet.publish([("a", ev(i)) for i in range(3)] + [("b", ev(9))])  # a: 1..3, b: 4
    src = _source(jet, ["a"])
    try:
        part = src.open(jet.s("a"), None)
        jet.delete(4)
        got, e = _read_until_refused([part])
        assert got == [1, 2, 3]
        assert "stream sequence 4 was deleted" in str(e) and repr(jet.s("a")) in str(e)
    finally:
        src.close()


def test_a_deletion_in_the_middle_names_the_subject_that_lost_it(jet: Any) -> None:
    """Subjects a and b interleaved; b's message at 6 is deleted after both partitions
    read their first messages (so each was told how many of its messages follow). The
    partition that meets the gap first is a; the line names b, whose message it was."""
    jet.create(["a", "b"])
    seqs = jet.publish([("a" if i % 2 == 0 else "b", ev(i)) for i in range(10)])
    assert seqs == list(range(1, 11))  # a: odd sequences, b: even ones
    src = _source(jet, ["a", "b"])
    try:
        a = src.open(jet.s("a"), None)
        b = src.open(jet.s("b"), None)
        ca, cb = a.poll(1, 1000), b.poll(1, 1000)
        assert ca is not None and cb is not None
        assert ca.events["__off"].to_list() == [1] and cb.events["__off"].to_list() == [2]
        jet.delete(6)
        with pytest.raises(SourceExpiredError) as e:
            for _ in range(50):
                c = a.poll(100, 200)
                assert c is not None
        msg = str(e.value)
        assert f"NATS partition {jet.s('b')!r}" in msg, msg
        assert "stream sequence 6 was deleted" in msg and "next position to read 3" in msg
        assert "earliest available 8" in msg and repr(jet.s("a")) not in msg
    finally:
        src.close()


# ------------------------------------------------------------------ stop = "end"
def _nats_spec(d: Path, jet: Any, names: list[str]) -> Path:
    spec = write_spec(d, names, every_events=50, batch_size=20)
    subjects = json.dumps([jet.s(f"p{i}") for i in range(len(names))])
    source = (f'kind = "nats"\nservers = "{jet.url}"\nstream = "{jet.stream}"\n'
              f'subjects = {subjects}\nstop = "end"')
    spec.write_text(re.sub(r'kind = "jsonl"\npaths = \[[^\]]*\]', source,
                           spec.read_text(), count=1))
    return spec


def _events(p: int, n: int) -> list[str]:
    t0 = 1_700_000_000_000
    return [json.dumps({"user": f"u{i % 3}", "ts": t0 + 700 * i + 100 * p, "amount": i,
                        "i": i}) for i in range(n)]


def _run(spec: Path) -> subprocess.CompletedProcess[str]:
    # a hang (the old code never reached its end) fails by the timeout
    return subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                          capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("tail_of", ["p1", "other"])
def test_a_backfill_reaches_its_end_over_a_deleted_tail(
    jet: Any, tmp_path: Path, tail_of: str
) -> None:
    """The tail (the job's subject p1, or a subject it does not read) is deleted before
    the backfill: it exits 0 and its output equals a files run over what the stream
    held, every final window fired."""
    jet.create(["p0", "p1", "other"])
    per = [_events(0, 40), _events(1, 40)]
    items: list[tuple[str, bytes | dict[str, Any]]] = []
    for i in range(40):
        items += [("p0", per[0][i].encode()), ("p1", per[1][i].encode())]
    jet.publish(items)
    tail = jet.publish([(tail_of, _events(1, 41)[-1].encode()) for _ in range(3)])
    for seq in tail:
        jet.delete(seq)
    st = jet.state()
    assert st.last_seq == tail[-1] and st.messages == 80

    d, f = tmp_path / "nats", tmp_path / "files"
    names = ["in/p0.jsonl", "in/p1.jsonl"]
    for where in (d, f):
        (where / "in").mkdir(parents=True)
        for p, name in enumerate(names):
            (where / name).write_text("\n".join(per[p]) + "\n")
    res = _run(_nats_spec(d, jet, names))
    assert res.returncode == 0, res.stderr
    res = _run(write_spec(f, names, every_events=50, batch_size=20))
    assert res.returncode == 0, res.stderr
    got, want = committed(d, "out"), committed(f, "out")
    key = ("key", "window_start")
    assert want and sorted(got, key=lambda r: tuple(map(str, (r[k] for k in key)))) == \
        sorted(want, key=lambda r: tuple(map(str, (r[k] for k in key))))
    # the last event's window fired: the end-of-input flush ran
    last_ts = 1_700_000_000_000 + 700 * 39 + 100
    assert any(r["window_start"] <= last_ts < r["window_end"] for r in got)


def test_a_backfill_refuses_when_a_record_it_must_read_was_deleted(
    jet: Any, tmp_path: Path
) -> None:
    jet.create(["p0", "p1"])
    ev0 = _events(0, 10)
    jet.publish([("p0", e.encode()) for e in ev0])
    jet.delete(5)
    d = tmp_path / "d"
    (d / "in").mkdir(parents=True)
    (d / "in/p0.jsonl").write_text("")
    (d / "in/p1.jsonl").write_text("")
    res = _run(_nats_spec(d, jet, ["in/p0.jsonl", "in/p1.jsonl"]))
    assert res.returncode == 1, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "stream sequence 5 was deleted" in lines[0], res.stderr
