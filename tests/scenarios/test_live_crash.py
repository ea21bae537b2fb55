"""Stories of live runs on growing files (``follow = true``).

A writer thread keeps appending lines (and starts a new file) while the job is
SIGKILLed at random instants and its newest checkpoint is damaged between
restarts; a last run with ``stop = "end"`` finishes. The committed output then
equals, byte for byte after sorting, one uninterrupted run of the same recorded
plan (the plan records kept with ``SEALSTREAM_KEEP_PLANS``, replayed into a fresh
checkpoint store): every appended line and the new file are read exactly once.

Kill instants are calibrated on the job's own progress: the job is killed after
the k-th checkpoint line it logs (k random), never after a fixed time. The seeds
are few by default; ``SEALSTREAM_LIVE_SEEDS=N`` runs more.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
from _live_story import (
    Feeder,
    Log,
    committed,
    copy_plans,
    files_spec,
    kill,
    kill_while_fed,
    run_quiet,
    start,
)

SEEDS = list(range(int(os.environ.get("SEALSTREAM_LIVE_SEEDS", "1"))))
ROUNDS = 24


def line(user: str, ts: int, amount: int) -> str:
    return json.dumps({"user": user, "ts": ts, "amount": amount}) + "\n"


class Writer(Feeder):
    """Appends whole lines to in/a.jsonl and in/b.jsonl, starts in/c.jsonl halfway,
    and a bad line now and then. The content is fixed; only its timing varies."""

    def __init__(self, d: Path, rounds: int, seed: int) -> None:
        super().__init__()
        self.d, self.rounds, self.rng = d, rounds, random.Random(seed)

    def run(self) -> None:
        for r in range(self.rounds):
            self.credits.acquire()
            for name, user in (("a", "x"), ("b", "y"), ("c", "z")):
                if name == "c" and r < self.rounds // 2:
                    continue
                body = "".join(line(f"{user}{i % 3}", r * 400 + i * 10, i)
                               for i in range(40))
                if r % 7 == 3:
                    body += "not json\n"
                with open(self.d / "in" / f"{name}.jsonl", "a", encoding="utf-8") as f:
                    f.write(body)


def replay_plan(d: Path, ref: Path, idle_ms: int | None = None) -> dict[str, list[str]]:
    """One uninterrupted run of the plan recorded in ``d``: the same input, a fresh
    checkpoint store holding only the step plans."""
    shutil.copytree(d / "in", ref / "in")
    copy_plans(d, ref)
    (ref / "spec.toml").write_text(files_spec("end", idle_ms), encoding="utf-8")
    run_quiet(ref)
    return committed(ref)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_kills_while_files_grow_then_stop_end_equals_the_plan_run(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    d = tmp_path / "job"
    (d / "in").mkdir(parents=True)
    for name in ("a", "b"):
        (d / "in" / f"{name}.jsonl").write_text(line("w", 0, 0), encoding="utf-8")
    (d / "spec.toml").write_text(files_spec("never"), encoding="utf-8")
    writer = Writer(d, rounds=ROUNDS, seed=seed)
    kills = kill_while_fed(d, "spec.toml", writer, rng, only_with_older=False)
    (d / "spec.toml").write_text(files_spec("end"), encoding="utf-8")
    run_quiet(d)
    got = committed(d)
    want = replay_plan(d, tmp_path / "ref")
    assert got == want
    assert kills >= 3
    # every line was read exactly once: ROUNDS x 40 (a, b) + ROUNDS/2 x 40 (c) + the first 2
    counts = [json.loads(x)["n"] for x in got["out"]]
    late = len(got["late"])
    assert sum(counts) + late == ROUNDS * 40 * 2 + (ROUNDS - ROUNDS // 2) * 40 + 2
    assert len(got["errors"]) == sum(1 for r in range(ROUNDS) if r % 7 == 3) * 2 + sum(
        1 for r in range(ROUNDS // 2, ROUNDS) if r % 7 == 3)


@pytest.mark.parametrize(("sig", "name"), [(signal.SIGTERM, "SIGTERM"),
                                           (signal.SIGINT, "SIGINT")])
def test_a_signal_finishes_the_step_checkpoints_and_exits_0_then_resume(
    tmp_path: Path, sig: signal.Signals, name: str
) -> None:
    d = tmp_path / "job"
    (d / "in").mkdir(parents=True)
    (d / "in" / "a.jsonl").write_text(
        "".join(line("u", i * 100, 1) for i in range(200)), encoding="utf-8")
    (d / "spec.toml").write_text(files_spec("never"), encoding="utf-8")
    proc = start(d)
    log = Log(proc)
    log.checkpoints(1)
    # appended while it runs: read by this run or the next, once
    with open(d / "in" / "a.jsonl", "a", encoding="utf-8") as f:
        f.write("".join(line("u", 20_000 + i * 100, 1) for i in range(100)))
    proc.send_signal(sig)
    err = log.rest()
    assert proc.returncode == 0, err
    assert f"{name}: finishing the step" in err
    newest = max(int(p.name[3:]) for p in (d / "ckpt").glob("cp-*"))
    doc = json.loads((d / "ckpt" / f"cp-{newest:012d}" / "MANIFEST.json").read_text())
    assert doc["state"]["open_windows"] >= 1  # open windows stayed open
    (d / "spec.toml").write_text(files_spec("end"), encoding="utf-8")
    run_quiet(d)
    got = committed(d)
    assert sum(json.loads(x)["n"] for x in got["out"]) + len(got["late"]) == 300


def test_a_second_signal_stops_at_once_and_the_next_run_resumes(tmp_path: Path) -> None:
    d = tmp_path / "job"
    (d / "in").mkdir(parents=True)
    (d / "in" / "a.jsonl").write_text(
        "".join(line("u", i * 100, 1) for i in range(200)), encoding="utf-8")
    (d / "spec.toml").write_text(files_spec("never"), encoding="utf-8")
    proc = start(d)
    log = Log(proc)
    log.checkpoints(1)
    proc.send_signal(signal.SIGTERM)
    log.wait_for("finishing the step")
    proc.send_signal(signal.SIGTERM)
    err = log.rest()
    assert proc.returncode in (0, 143), err  # 0 when the final checkpoint beat it
    (d / "spec.toml").write_text(files_spec("end"), encoding="utf-8")
    run_quiet(d)
    got = committed(d)
    assert sum(json.loads(x)["n"] for x in got["out"]) + len(got["late"]) == 200


def _idle_job(tmp_path: Path) -> Path:
    d = tmp_path / "job"
    (d / "in").mkdir(parents=True)
    # b goes quiet after its first event; a keeps delivering
    (d / "in" / "a.jsonl").write_text(
        "".join(line("a", i * 100, 1) for i in range(50)), encoding="utf-8")
    (d / "in" / "b.jsonl").write_text(line("b", 0, 1), encoding="utf-8")
    (d / "spec.toml").write_text(files_spec("never", idle_ms=100), encoding="utf-8")
    return d


def test_idle_partition_leaves_w_and_a_quiet_stream_fires_its_last_windows(
    tmp_path: Path
) -> None:
    d = _idle_job(tmp_path)
    proc = start(d)
    log = Log(proc)
    try:
        # all quiet for idle_ms: W advances with the wall clock and every window of
        # the data (times near the epoch) fires, although no partition delivers
        fired: Any = None
        while True:
            doc = json.loads(log.checkpoints(1)[-1])
            if doc["results_written"] >= 6:  # a: windows 0..4, b: window 0
                fired = doc
                break
    finally:
        kill(proc)
    assert fired["results_written"] == 6
    # deterministic across the crash: the recorded plan replays to the same output
    (d / "spec.toml").write_text(files_spec("end", idle_ms=100), encoding="utf-8")
    run_quiet(d)
    assert committed(d) == replay_plan(d, tmp_path / "ref", idle_ms=100)


def test_a_file_that_appears_after_the_plan_was_recorded_joins_where_the_plan_says(
    tmp_path: Path
) -> None:
    """A partition listed when a run starts but discovered by the recorded plan only
    later (or never) does not exist for the steps replayed before its discovery: it
    would hold W back (no event yet), and a late event would count as on time."""
    d = tmp_path / "job"
    (d / "in").mkdir(parents=True)
    # a's last event is late: W is near 4400 when it is read (b keeps pace with a)
    (d / "in" / "a.jsonl").write_text(
        "".join(line("u", i * 100, 1) for i in range(50)) + line("u", 100, 7),
        encoding="utf-8")
    (d / "in" / "b.jsonl").write_text(
        "".join(line("v", i * 100, 1) for i in range(51)), encoding="utf-8")
    (d / "spec.toml").write_text(files_spec("end"), encoding="utf-8")
    run_quiet(d)
    got = committed(d)
    assert [json.loads(x)["amount"] for x in got["late"]] == [7]
    # a file appears after the plan was recorded: the plan's run never knew it
    (d / "in" / "c.jsonl").write_text(line("w", 0, 1), encoding="utf-8")
    assert replay_plan(d, tmp_path / "ref") == got
