"""The benchmark's own logic: batch references per window kind (checked against
tests/reference.py), output checking, checkpoint sizes from manifests, the report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import reference as ref

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import (  # noqa: E402
    Run,
    Workload,
    check_results,
    largest_checkpoint,
    reference_results,
)
from bench.report import Result, SweepPoint, ratios, render_markdown  # noqa: E402

W = Workload(
    events=40, keys=3, partitions=2, disorder_ms=0, max_delay_ms=1_000, size_ms=10,
    checkpoint_every_ms=1_000, seed=0, slide_ms=5, gap_ms=4, many_keys=10,
)
RECORDS = [
    [{"user": "a", "ts": 0, "amount": 1.5}, {"user": "b", "ts": 3, "amount": 2.0},
     {"user": "a", "ts": 7, "amount": 0.25}, {"user": "a", "ts": 30, "amount": 4.0}],
    [{"user": "b", "ts": 1, "amount": 1.0}, {"user": "a", "ts": 12, "amount": 8.0},
     {"user": "b", "ts": 9, "amount": 0.5}],
]


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    out = []
    for i, recs in enumerate(RECORDS):
        p = tmp_path / f"p{i}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in recs))
        out.append(p)
    return out


def _expected(kind: str) -> set[tuple[str, int, int, int, float]]:
    window = {
        "tumbling": ref.WindowDef("tumbling", size_ms=W.size_ms),
        "sliding": ref.WindowDef("sliding", size_ms=W.size_ms, slide_ms=W.slide_ms),
        "session": ref.WindowDef("session", gap_ms=W.gap_ms),
    }[kind]
    parts = [(f"p{i}", "".join(json.dumps(r) + "\n" for r in recs))
             for i, recs in enumerate(RECORDS)]
    out = ref.run(parts, key="user", time="ts", max_delay_ms=W.max_delay_ms, window=window,
                  aggregates={"n": "count", "total": "sum(amount)"})
    assert not out.late
    return {(r["key"], r["window_start"], r["window_end"], r["n"], r["total"])
            for r in out.results}


@pytest.mark.parametrize("kind", ["tumbling", "sliding", "session"])
def test_batch_reference_equals_the_reference_model(files: list[Path], kind: str) -> None:
    got = reference_results(files, W, kind)
    rows = {(r["key"], r["ws"], r["we"], r["n"], r["total"]) for r in got.iter_rows(named=True)}
    assert rows == _expected(kind)


def test_check_results_names_what_differs(files: list[Path], tmp_path: Path) -> None:
    refs = reference_results(files, W, "tumbling")
    lines = [{"key": r["key"], "window_start": r["ws"], "window_end": r["we"], "n": r["n"],
              "total": r["total"]} for r in refs.iter_rows(named=True)]
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert check_results([good], refs) == "ok"
    bad = tmp_path / "bad.jsonl"
    lines[0]["n"] += 1
    bad.write_text("".join(json.dumps(x) + "\n" for x in lines[:-1]))
    assert check_results([bad], refs) == "MISMATCH: missing 1, wrong 1"


def test_largest_checkpoint_reads_the_manifests(tmp_path: Path) -> None:
    for cid, (ow, size) in enumerate([(5, 100), (9, 120), (0, 10)], start=1):
        d = tmp_path / f"cp-{cid:012d}"
        d.mkdir()
        (d / "MANIFEST.json").write_text(json.dumps(
            {"id": cid, "state": {"open_windows": ow}, "files": {"state": {"bytes": size}}}))
    assert largest_checkpoint(tmp_path) == {"open_windows": 9, "state_bytes": 120, "id": 2}


def test_report_has_ratios_state_and_sweeps() -> None:
    def res(name: str, group: str, seconds: float, fmt: str = "jsonl") -> Result:
        r = Result(name, group, name, "ok", events=1_000, fmt=fmt)
        r.runs = [Run(seconds, 100 * 1024, 0, cpu_s=seconds * 1.5)]
        return r

    results = [res("sealstream", "sealstream", 2.0), res("sealstream-sliding", "sealstream", 4.0),
               res("sealstream-ckpt", "sealstream", 2.5), res("duckdb", "one-shot", 1.0),
               res("sealstream-many-keys", "sealstream", 4.5),
               res("pyflink", "peer", 5.0)]
    state = Result("state", "state", "state", "ok")
    state.runs = [Run(1.0, 1024, 0, summary={
        "windows": 10, "process_s": 0.5, "restore_s": 0.1, "state_bytes": 80,
        "bytes_per_window": 8.0, "in_memory_bytes": 700, "encode_s": 0.01})]
    results.append(state)
    got = dict((a, b) for a, b, _ in ratios(results))
    assert got["sliding / tumbling events/s"] == "50 %"
    assert got["checkpointed / unchecked events/s"] == "80 %"
    assert got["1,000,000 keys: time / 10,000 keys' time (both checkpointed)"] == "1.80x"
    assert got["sealstream-ckpt / fastest jsonl one-shot (duckdb) events/s"] == "40 %"
    assert got["sealstream-ckpt / PyFlink SQL (checkpoints on) events/s"] == "2.0x"
    md = render_markdown(W, results, [SweepPoint("keys", 3, results[0])],
                         {"date": "now", "versions": {}}, 1)
    assert "| sealstream | jsonl | 1,000 | 2.00 | 500 | 100 (100) | 150 % | 2.00x |" in md
    assert "| bytes per open window in the checkpoint | 8.0 |" in md
    assert "| restore time / processing time | 0.20 |" in md
    assert "| keys | 3 |" in md


@pytest.mark.parametrize("kind", ["tumbling", "sliding", "session"])
def test_one_shot_polars_runners_equal_the_reference_model(
    files: list[Path], tmp_path: Path, kind: str
) -> None:
    """bench.speed's comparators compute the same windows as sealstream's semantics."""
    from bench.runners import run_polars, run_polars_session, run_polars_sliding

    out = tmp_path / "out.jsonl"
    names = [str(f) for f in files]
    if kind == "tumbling":
        run_polars(names, out, W.size_ms, W.max_delay_ms)
    elif kind == "sliding":
        run_polars_sliding(names, out, W.size_ms, W.max_delay_ms, slide_ms=W.slide_ms)
    else:
        run_polars_session(names, out, W.size_ms, W.max_delay_ms, gap_ms=W.gap_ms)
    rows = {(r["key"], r["window_start"], r["window_end"], r["n"], r["total"])
            for r in map(json.loads, out.read_text().splitlines())}
    assert rows == _expected(kind)
