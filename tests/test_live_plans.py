"""Step plans in-process: recorded before output, replayed exactly, damage detected,
pruned with their checkpoints; stop = "end"; the partition holding W."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sealstream._runtime.engine import Job
from sealstream.checkpoint.plans import judge_plan
from sealstream.checkpoint.stores import LocalCheckpointStore
from sealstream.pipeline import load_spec
from sealstream.watermark import WatermarkState


def spec(d: Path, stop: str = "end", extra: str = "") -> Path:
    text = f"""
[pipeline]
name = "plans"
batch_size = 50

[source]
kind = "jsonl"
paths = ["in/*.jsonl"]
key = "user"
time = "ts"
follow = true
poll_ms = 0
stop = "{stop}"

[window]
kind = "tumbling"
size_ms = 1000

[aggregates]
n = "count"

[sink]
kind = "jsonl"
path = "out"

[checkpoint]
path = "ckpt"
every_events = 100
keep = 2
{extra}
"""
    (d / "spec.toml").write_text(text, encoding="utf-8")
    return d / "spec.toml"


def inputs(d: Path) -> None:
    (d / "in").mkdir(parents=True, exist_ok=True)
    for p in ("a", "b"):
        (d / "in" / f"{p}.jsonl").write_text("".join(
            json.dumps({"user": f"{p}{i % 3}", "ts": i * 37}) + "\n" for i in range(400)),
            encoding="utf-8")


def results(d: Path) -> list[str]:
    return sorted(x for f in (d / "out").glob("part-*.jsonl")
                  for x in f.read_text(encoding="utf-8").splitlines())


def test_stop_end_reads_everything_once_and_records_chained_plans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEALSTREAM_KEEP_PLANS", "1")
    inputs(tmp_path)
    summary = Job(load_spec(spec(tmp_path))).run()
    assert summary.counters.events == 800
    assert sum(json.loads(x)["n"] for x in results(tmp_path)) + summary.counters.late_events \
        == 800
    store = LocalCheckpointStore(tmp_path / "ckpt", encryption_key=None)
    steps = store.plan_steps()
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 8  # 50 a step
    prev = ""
    for s in steps:
        v = judge_plan(store.read_plan(s), s, prev, None)
        assert v.ok, v
        assert v.plan is not None
        prev = v.plan.digest()
    assert v.plan is not None and v.plan.end
    newest = store.read_manifest(store.ids()[-1])
    assert newest is not None and newest["plan"] == {"step": steps[-1], "digest": prev}


def test_plans_are_pruned_with_their_checkpoints(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEALSTREAM_KEEP_PLANS", raising=False)
    inputs(tmp_path)
    Job(load_spec(spec(tmp_path))).run()
    store = LocalCheckpointStore(tmp_path / "ckpt", encryption_key=None)
    oldest = store.read_manifest(store.ids()[0])
    assert oldest is not None
    assert all(s > oldest["plan"]["step"] for s in store.plan_steps())


def test_a_damaged_plan_record_is_moved_aside_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEALSTREAM_KEEP_PLANS", "1")
    inputs(tmp_path)
    Job(load_spec(spec(tmp_path))).run()
    store = LocalCheckpointStore(tmp_path / "ckpt", encryption_key=None)
    first, *newer = store.ids()
    assert newer
    for cid in newer:  # the newer checkpoints are lost: recovery restores the first
        shutil.rmtree(store.path_of(cid))
    doc = store.read_manifest(first)
    assert doc is not None
    step = doc["plan"]["step"] + 1
    victim = store.root / "plans" / f"step-{step:012d}.json"
    victim.write_bytes(victim.read_bytes().replace(b'"now_ms":', b'"now_ms":1', 1))
    summary = Job(load_spec(spec(tmp_path))).run()
    assert summary.resumed_from == first
    assert {"step": step, "verdict": "MOVED_ASIDE", "reason": "SIGNATURE_MISMATCH"} \
        in summary.rejected
    # the step was planned anew, in the chain of the restored checkpoint
    assert judge_plan(store.read_plan(step), step, doc["plan"]["digest"], None).ok
    assert list((store.root / "rejected").glob(f"plan-step-{step:012d}-SIGNATURE_MISMATCH-*"))


def test_the_partition_holding_w_is_named() -> None:
    wm = WatermarkState.initial(3, 0)
    wm.max_time = [5000, 1000, 3000]
    assert wm.holder() == 1
    wm.idle = [False, True, False]
    assert wm.holder() == 2
    wm.idle = [True, True, True]
    assert wm.holder() is None and wm.current() == wm.global_ms


def test_replay_from_integer_positions_of_a_followed_source(tmp_path: Path) -> None:
    from sealstream.cli import main

    inputs(tmp_path)
    s = spec(tmp_path, stop="never")  # a replay is a backfill whatever the stop mode
    assert main(["replay", str(s), "--from", "in/a.jsonl=390,in/b.jsonl=399",
                 "--to", str(tmp_path / "dest"), "--quiet"]) == 0
    rows = [json.loads(x) for f in (tmp_path / "dest").glob("*/part-*.jsonl")
            for x in f.read_text(encoding="utf-8").splitlines()]
    assert sum(r["n"] for r in rows) == 10 + 1


def test_stop_end_stops_at_the_end_seen_at_start_even_when_more_was_polled(
    tmp_path: Path,
) -> None:
    from sealstream._runtime.live import LiveMerger
    from sealstream.sources.files.follow import FollowedFiles

    inputs(tmp_path)
    p = load_spec(spec(tmp_path))
    plan = p.field_plan()
    wm = WatermarkState.initial(0, 0)
    merger = LiveMerger(FollowedFiles("jsonl", p.source, plan), plan, [], [], 1000,
                        store=None, key=None, wm=wm, max_delay_ms=0, idle_ms=None,
                        stop_end=True, poll_ms=0, plan_mark=None)
    try:
        # appended after the start: beyond the end positions seen then
        with open(tmp_path / "in" / "a.jsonl", "a", encoding="utf-8") as f:
            f.write("".join(json.dumps({"user": "late", "ts": 1}) + "\n" for _ in range(30)))
        events = 0
        while (batch := merger.next_batch()) is not None:
            events += batch.events.height
            if batch.finished:
                break
        assert batch is not None and batch.finished
        assert events == 800
        assert [pos.next_offset for pos in batch.positions] == [400, 400]
    finally:
        merger.close()


def test_a_partition_listed_at_restart_joins_the_replay_where_the_plan_found_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that appeared after the steps were recorded does not exist for the
    steps replayed on recovery (it would hold W back: a late event counted)."""
    monkeypatch.setenv("SEALSTREAM_KEEP_PLANS", "1")
    inputs(tmp_path)
    a = tmp_path / "in" / "a.jsonl"
    rows = a.read_text(encoding="utf-8").splitlines(keepends=True)
    # late in step 8, in a window still open at the checkpoint of step 7
    rows[380] = json.dumps({"user": "a0", "ts": 13100}) + "\n"
    a.write_text("".join(rows), encoding="utf-8")
    first_run = Job(load_spec(spec(tmp_path))).run()
    assert first_run.counters.late_events == 1
    want = results(tmp_path)
    store = LocalCheckpointStore(tmp_path / "ckpt", encryption_key=None)
    first, *newer = store.ids()
    doc = store.read_manifest(first)
    assert newer and doc is not None and doc["plan"]["step"] < 8
    for cid in newer:  # recovery restores the first and replays the steps after it
        shutil.rmtree(store.path_of(cid))
    (tmp_path / "in" / "c.jsonl").write_text(
        json.dumps({"user": "c", "ts": 0}) + "\n", encoding="utf-8")
    summary = Job(load_spec(spec(tmp_path))).run()
    assert summary.resumed_from == first
    assert summary.counters.late_events == 1
    assert results(tmp_path) == want


def test_stop_end_does_not_wait_for_a_partition_that_appeared_after_the_start(
    tmp_path: Path,
) -> None:
    """stop = "end" backfills what existed at start: a file that starts to match the
    glob during the run is not read (the next run reads it), and the run still ends."""
    from sealstream._runtime.live import LiveMerger
    from sealstream.sources.files.follow import FollowedFiles

    class Jumps:  # every reading of the clock is 10 s later: discovery runs each step
        def __init__(self) -> None:
            self.t = 0.0

        def monotonic(self) -> float:
            self.t += 10.0
            return self.t

        def wall_ms(self) -> int:
            return int(self.t * 1000)

    inputs(tmp_path)
    p = load_spec(spec(tmp_path))
    plan = p.field_plan()
    merger = LiveMerger(FollowedFiles("jsonl", p.source, plan), plan, [], [], 100,
                        store=None, key=None, wm=WatermarkState.initial(0, 0),
                        max_delay_ms=0, idle_ms=None, stop_end=True, poll_ms=0,
                        plan_mark=None, clock=Jumps())
    try:
        (tmp_path / "in" / "c.jsonl").write_text(
            "".join(json.dumps({"user": "new", "ts": 1}) + "\n" for _ in range(5)),
            encoding="utf-8")
        events = steps = 0
        while (batch := merger.next_batch()) is not None and steps < 1000:
            steps += 1
            events += batch.events.height
            if batch.finished:
                break
        assert batch is not None and batch.finished
        assert events == 800
        assert len(batch.positions) == 2
    finally:
        merger.close()
