"""Story: an enriched job (a versioned reference table feeding an aggregate and the
late output's neighbours) is SIGKILLed at crash points and at a random instant, and
its newest checkpoint is damaged between restarts (a flipped byte in the manifest,
which the signature catches, so that the table version it binds cannot be trusted
either). The committed output equals that of one uninterrupted run, exactly once."""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from sealstream.checkpoint.manifest import KEY_ENV

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
if str(SCENARIOS) not in sys.path:
    sys.path.append(str(SCENARIOS))

from _story import (  # noqa: E402
    assert_same_output,
    committed,
    in_process,
    make_input,
    run,
    run_here,
    run_killed_randomly,
    write_spec,
)

ENRICH = """
[[enrich]]
name = "users"
kind = "parquet"
path = "users.parquet"
on = "user"
valid_from = "since"
"""
EXTRA_AGGREGATES = 'country = "last(country)"\nweighted = "sum(weight)"\n'


@pytest.fixture(autouse=True)
def _no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)


def enriched_job(d: Path) -> Path:
    names = make_input(d, events=1500)
    spec = write_spec(d, names, every_events=150, batch_size=50)
    text = spec.read_text().replace("[aggregates]\n", "[aggregates]\n" + EXTRA_AGGREGATES, 1)
    spec.write_text(text + ENRICH)
    t0 = 1_700_000_000_000
    rows = [(f"u{u}", t0 + v * 150_000, f"C{u}{v}", float(u + v)) for u in range(6)
            for v in range(3)] + [("2", 0, "INT", 0.5)]  # u6 has no row: nulls
    pl.DataFrame(rows, schema={"user": pl.String, "since": pl.Int64, "country": pl.String,
                               "weight": pl.Float64}, orient="row").write_parquet(
        d / "users.parquet")
    return spec


def flip_newest_manifest(d: Path) -> bool:
    """Flip one byte of the newest manifest's table version, if an older one remains."""
    cps = sorted((d / "ckpt").glob("cp-*/MANIFEST.json"))
    if len(cps) < 2:
        return False
    data = cps[-1].read_bytes()
    i = data.index(b'"sha256": "') + len(b'"sha256": "') + 3
    cps[-1].write_bytes(data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:])
    return True


def test_sigkills_and_a_damaged_checkpoint_leave_the_output_exact(tmp_path: Path) -> None:
    ref = enriched_job(tmp_path / "ref")
    started = time.monotonic()
    res = run(ref)
    assert res.returncode == 0, res.stderr
    typical = time.monotonic() - started
    results = committed(tmp_path / "ref", "out")
    assert {r["country"] for r in results} >= {"C00", "C11", "C21", "INT", None}

    d = tmp_path / "chaos"
    spec = enriched_job(d)
    flipped = 0
    for point in ("after_write_state:2", "after_manifest_publish:3", "batch:7",
                  "after_commit_results:2", "after_stage:4"):
        res = run(spec, crash_at=point)
        assert res.returncode == -9, (point, res.returncode, res.stderr)
        flipped += flip_newest_manifest(d)
    assert flipped >= 2
    kills = run_killed_randomly(spec, random.Random(34), typical, max_rounds=2)
    assert kills >= 1
    res = run_here(spec)
    assert res.returncode == 0, res.stderr
    assert_same_output(d, tmp_path / "ref")
    newest = sorted((d / "ckpt").glob("cp-*/MANIFEST.json"))[-1]
    bound = json.loads(newest.read_text())["enrich"]["users"]
    assert bound["rows"] == 19


def test_a_finished_enriched_job_run_again_changes_nothing(tmp_path: Path) -> None:
    spec = enriched_job(tmp_path)
    assert run_here(spec).returncode == 0
    before = committed(tmp_path, "out")
    res = run_here(spec)
    assert res.returncode == 0, res.stderr
    assert committed(tmp_path, "out") == before
    res = in_process("checkpoints", "verify", str(tmp_path / "ckpt"), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
