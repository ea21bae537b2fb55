"""The README's transforms section runs end to end: the spec and the Python snippet
give the same results, and those are the errors per service per minute computed
directly with Polars."""

from __future__ import annotations

import json
import random
import re
import runpy
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from sealstream.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"
TITLE = "Transforms: errors per service per minute"


def _block(lang: str) -> str:
    text = README.read_text(encoding="utf-8")
    m = re.search(rf"## {re.escape(TITLE)}\n(?:(?!\n## ).)*?```{lang}\n(.*?)```", text, re.S)
    assert m, f"README has no {lang} block under '## {TITLE}'"
    return m.group(1)


def _logs(d: Path) -> list[dict[str, Any]]:
    rng = random.Random(20)
    (d / "logs").mkdir()
    every: list[dict[str, Any]] = []
    for part in range(2):
        t = 1_717_000_000_000
        rows = []
        for _ in range(3000):
            t += rng.randint(0, 400)
            rec = {"service": rng.choice(["Checkout", "checkout", "Search", "auth"]),
                   "level": rng.choice(["error", "info", "info", "warn"]),
                   "latency_ms": round(rng.lognormvariate(5, 1), 1),
                   "user": f"u{rng.randint(0, 300)}", "ts": t - rng.randint(0, 3000)}
            rows.append(rec)
        every += rows
        (d / "logs" / f"app-{part}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows))
    return every


def _results(d: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for f in sorted(d.glob("*.jsonl")) for x in f.read_text().splitlines()]
    return sorted(rows, key=lambda r: (r["key"], r["window_start"]))


def test_readme_transforms_job_runs_in_spec_and_python(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    records = _logs(tmp_path)
    (tmp_path / "spec.toml").write_text(_block("toml"))
    assert main(["run", str(tmp_path / "spec.toml"), "--quiet"]) == 0
    (tmp_path / "job.py").write_text(_block("python"))
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(tmp_path / "job.py"), run_name="__main__")
    assert capsys.readouterr().out.strip().endswith("windows")
    spec_rows = _results(tmp_path / "errors-per-minute")
    assert spec_rows == _results(tmp_path / "errors-per-minute-py")
    # the same numbers straight from Polars: each partition's disorder (3 s) stays
    # below max_delay_ms (5 s), so no event is late and every window is exact
    frame = pl.DataFrame(records).filter(pl.col("level") == "error").with_columns(
        pl.col("service").str.to_lowercase().alias("key"),
        (pl.col("ts") // 60_000 * 60_000).alias("window_start"))
    want = frame.group_by("key", "window_start").agg(
        pl.len().alias("errors"),
        pl.col("latency_ms").quantile(0.99, "linear").alias("p99_ms"),
        pl.col("user").n_unique().alias("users"),
        (pl.col("latency_ms") > 1000).sum().alias("slow"),
    )
    got = {(r["key"], r["window_start"]): r for r in spec_rows}
    assert len(got) == want.height == len(spec_rows)
    for w in want.iter_rows(named=True):
        r = got[(w["key"], w["window_start"])]
        assert (r["errors"], r["users"], r["slow"]) == (w["errors"], w["users"], w["slow"])
        assert r["p99_ms"] == pytest.approx(w["p99_ms"], rel=1e-12)
        assert r["window_end"] == r["window_start"] + 60_000
