"""Story: a bounded run (files to their end) fires every window; more data arrives;
the job runs again. The second run continues from the watermark the data reached:
new windows are computed, events for the windows the first run's end-of-input flush
emitted are late, and nothing is emitted twice (semantics section 10).

The expected output is derived from the single-pass reference (tests/reference.py)
over all the data: with one partition, a window that starts after the first run's
newest event time has the same result in both; every other window of a second-run
event was emitted (or is late) already."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import reference as ref
from helpers import Case, assert_same_output, jsonl, read_jsonl_dir, run_reference, write_case
from sealstream.cli import main

SCENARIOS = Path(__file__).resolve().parent
if str(SCENARIOS) not in sys.path:
    sys.path.insert(0, str(SCENARIOS))

from _story import assert_same_output as assert_same_dirs  # noqa: E402
from _story import committed, make_input, run, write_spec  # noqa: E402

AGGS = {"n": "count", "total": "sum(v)", "low": "min(v)", "last_v": "last(v)"}
BASE = 1_700_000_000_000


def _records(rng: random.Random, n: int, start: int, back_ms: int) -> list[dict[str, Any]]:
    """Events moving forward from ``start``, some up to ``back_ms`` older."""
    out, t = [], start
    for _ in range(n):
        t += rng.randint(0, 300)
        ts = t - (rng.randint(0, back_ms) if rng.random() < 0.3 else 0)
        out.append({"k": f"u{rng.randint(0, 4)}", "ts": ts, "v": rng.randint(-5, 40)})
    return out


def _expected_second_run(
    first: list[dict[str, Any]], second: list[dict[str, Any]], case: Case
) -> ref.ReferenceOutput:
    """What the second run must emit: the single-pass reference's results for windows
    starting after the first run's newest event time; as late, every second-run event
    each of whose windows either started by then (emitted by the flush) or was closed
    by the watermark (one partition: newest time before it less max_delay_ms)."""
    newest = max(r["ts"] for r in first)
    whole = run_reference(Case(partitions=[("in/p0.jsonl", jsonl(first + second))],
                               window=case.window, aggregates=case.aggregates,
                               max_delay_ms=case.max_delay_ms))
    out = ref.ReferenceOutput()
    out.results = [r for r in whole.results if r["window_start"] > newest]
    seen = newest
    lat = case.window.allowed_lateness_ms
    for i, r in enumerate(second):
        w = seen - case.max_delay_ms
        if all(s <= newest or e + lat <= w for s, e in ref.windows_of(r["ts"], case.window)):
            out.late.append({**r, "_partition": "in/p0.jsonl", "_offset": len(first) + i})
        seen = max(seen, r["ts"])
    return out


def _case(window: ref.WindowDef, batch: int, every: int) -> Case:
    return Case(partitions=[("in/p0.jsonl", "")], window=window, aggregates=AGGS,
                max_delay_ms=700, batch_size=batch, checkpoint_every=every)


WINDOWS = [ref.WindowDef("tumbling", size_ms=2000),
           ref.WindowDef("tumbling", size_ms=1000, allowed_lateness_ms=500),
           ref.WindowDef("sliding", size_ms=3000, slide_ms=1000),
           ref.WindowDef("sliding", size_ms=2500, slide_ms=1000, allowed_lateness_ms=300)]


@pytest.mark.parametrize("seed", range(8))
def test_a_second_run_over_appended_data_continues_from_the_data_watermark(
    tmp_path: Path, seed: int, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(seed)
    window = WINDOWS[seed % len(WINDOWS)]
    every = rng.choice([3, 7, 40])
    case = _case(window, rng.choice([1, 5, 64]), every)
    first = _records(rng, rng.randint(20, 120), BASE, 3000)
    # the second part starts before the first one's newest time: some events belong
    # to windows the flush emitted
    second = _records(rng, rng.randint(20, 120), max(r["ts"] for r in first) - 2500, 4000)
    spec = write_case(case, tmp_path)
    (tmp_path / "in/p0.jsonl").write_text(jsonl(first))
    assert main(["run", str(spec), "--quiet"]) == 0
    once = run_reference(Case(partitions=[("in/p0.jsonl", jsonl(first))], window=window,
                              aggregates=AGGS, max_delay_ms=case.max_delay_ms))
    out1 = read_jsonl_dir(tmp_path / "out")
    late1 = read_jsonl_dir(tmp_path / "late")
    assert_same_output(once, ref.ReferenceOutput(out1, late1))  # type: ignore[arg-type]
    with (tmp_path / "in/p0.jsonl").open("a") as f:
        f.write(jsonl(second))
    # the second run may use another batch size: results do not depend on it
    assert main(["run", str(spec), "--quiet", "--batch-size", str(rng.choice([2, 9, 100]))]) == 0
    want = _expected_second_run(first, second, case)
    assert want.results, "the second part opens windows of its own"
    assert want.late, "the second part has events for windows the flush emitted"
    got = ref.ReferenceOutput(
        [r for r in read_jsonl_dir(tmp_path / "out") if r not in out1],
        [r for r in read_jsonl_dir(tmp_path / "late") if r not in late1])
    assert_same_output(want, got)  # type: ignore[arg-type]
    capsys.readouterr()
    # the chain (the flush, then the second run) verifies
    assert main(["checkpoints", "verify", str(tmp_path / "ckpt")]) == 0, capsys.readouterr().out


def _two_files(d: Path, part: int) -> None:
    """Two partitions; part 2 appends new windows to both, a new key, and to each an
    event for a window part 1's flush emitted."""
    d.mkdir(parents=True, exist_ok=True)
    rows = {0: [], 1: []} if part == 1 else {
        0: [{"k": "a", "ts": BASE + 9_000, "v": 100}, {"k": "a", "ts": BASE + 21_000, "v": 1},
            {"k": "c", "ts": BASE + 25_000, "v": 2}],
        1: [{"k": "b", "ts": BASE + 3_000, "v": 7}, {"k": "b", "ts": BASE + 22_000, "v": 3}],
    }
    if part == 1:
        for i in range(20):
            rows[i % 2].append({"k": "ab"[i % 2], "ts": BASE + i * 500, "v": i})
    for p, recs in rows.items():
        with (d / f"in/p{p}.jsonl").open("a") as f:
            f.write(jsonl(recs))  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["tumbling", "session", "incremental"])
def test_two_partitions_new_windows_computed_flushed_ones_late(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "in").mkdir()
    window = (ref.WindowDef("session", gap_ms=2000) if kind == "session"
              else ref.WindowDef("tumbling", size_ms=10_000))
    case = Case(partitions=[("in/p0.jsonl", ""), ("in/p1.jsonl", "")], window=window,
                aggregates={"n": "count", "total": "sum(v)"}, max_delay_ms=1000,
                batch_size=3, checkpoint_every=4)
    spec = write_case(case, tmp_path)
    if kind == "incremental":
        spec.write_text(spec.read_text() + "incremental = true\n")
    _two_files(tmp_path, 1)
    assert main(["run", str(spec), "--quiet"]) == 0
    first = {(r["key"], r["window_start"]): r["n"] for r in read_jsonl_dir(tmp_path / "out")}
    assert sum(first.values()) == 20
    _two_files(tmp_path, 2)
    assert main(["run", str(spec), "--quiet"]) == 0
    after = {(r["key"], r["window_start"]): r["n"] for r in read_jsonl_dir(tmp_path / "out")}
    new = {k: v for k, v in after.items() if k not in first}
    assert {k: after[k] for k in first} == first  # nothing emitted twice or changed
    late = sorted((r["k"], r["ts"] - BASE) for r in read_jsonl_dir(tmp_path / "late"))
    # 9_000 and 3_000: at or before the first run's newest event (9_500)
    assert late == [("a", 9_000), ("b", 3_000)]
    if kind == "session":
        assert new == {("a", BASE + 21_000): 1, ("b", BASE + 22_000): 1,
                       ("c", BASE + 25_000): 1}
    else:
        assert new == {("a", BASE + 20_000): 1, ("b", BASE + 20_000): 1,
                       ("c", BASE + 20_000): 1}
    capsys.readouterr()
    assert main(["checkpoints", "verify", str(tmp_path / "ckpt")]) == 0, capsys.readouterr().out


def test_a_mostly_late_run_says_why_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """More than half of a run's events late: one warning line names the likely cause."""
    (tmp_path / "in").mkdir()
    case = Case(partitions=[("in/p0.jsonl", "")], window=ref.WindowDef("tumbling", size_ms=1000),
                aggregates={"n": "count"}, checkpoint_every=5)
    spec = write_case(case, tmp_path)
    (tmp_path / "in/p0.jsonl").write_text(jsonl([{"k": "a", "ts": BASE + 60_000 + i}
                                                 for i in range(10)]))
    assert main(["run", str(spec), "--quiet"]) == 0
    assert "late" not in capsys.readouterr().err
    with (tmp_path / "in/p0.jsonl").open("a") as f:  # an hour older: all late
        f.write(jsonl([{"k": "a", "ts": BASE + i} for i in range(6)]))
    assert main(["run", str(spec), "--quiet"]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if "late" in x]
    assert len(lines) == 1, lines
    assert lines[0].startswith("sealstream: warning: 6 of this run's 6 events (100%) were late")
    assert "watermark is far ahead" in lines[0] and "checkpoint" in lines[0]


def _append_second_part(d: Path, names: list[str], seed: int) -> None:
    """More events after each file's end: new windows, and some for windows emitted."""
    rng = random.Random(seed)
    for name in names:
        path = d / name
        newest = max(json.loads(x)["ts"] for x in path.read_text().splitlines() if x.strip())
        lines = []
        t = newest - 3_000
        for i in range(150):
            t += rng.randint(0, 400)
            amount = rng.choice([rng.randint(-5, 50), round(rng.uniform(0, 30), 2)])
            lines.append(json.dumps({"user": f"u{rng.randint(0, 6)}", "ts": t,
                                     "amount": amount, "i": 1000 + i}))
        with path.open("a") as f:
            f.write("\n".join(lines) + "\n")


@pytest.mark.parametrize("crash_at", ["after_stage:2", "after_write_state:1",
                                      "after_manifest_publish:2", "after_commit_results:1"])
def test_a_sigkill_during_the_second_run_resumes_exactly_once(
    tmp_path: Path, crash_at: str
) -> None:
    ref_dir, d = tmp_path / "ref", tmp_path / "job"
    newest = 0
    for where in (ref_dir, d):
        names = make_input(where, partitions=2, events=200, seed=11)
        assert run(write_spec(where, names, every_events=60)).returncode == 0
        newest = max(json.loads(x)["ts"] for n in names
                     for x in (where / n).read_text().splitlines() if x.strip())
        _append_second_part(where, names, seed=12)
    assert run(ref_dir / "spec.toml").returncode == 0
    killed = run(d / "spec.toml", crash_at=crash_at)
    assert killed.returncode == -9, killed.stderr
    again = subprocess.run([sys.executable, "-m", "sealstream", "run", str(d / "spec.toml"),
                            "--quiet"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert_same_dirs(d, ref_dir)
    # the second part made new windows and late events
    assert max(r["i"] for r in committed(d, "late")) >= 1000
    assert any(r["window_start"] > newest for r in committed(d, "out"))
