"""The newer aggregates on larger data: approx_count_distinct within its documented
error, exact distinct counts and quantiles exact, a stable variance, their states
exported by ``checkpoints export``, and a story of SIGKILLs and a damaged checkpoint
with transforms and the new aggregates: the output is exactly an uninterrupted run's."""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from scenarios._story import assert_same_output, in_process, run, run_here, run_killed_randomly
from sealstream.cli import main
from sealstream.testing.specs import files_source, spec_text
from sealstream.windows.sketches import HLL_RELATIVE_ERROR

TRANSFORM = """
where = "level <> 'debug'"
fields.svc = "lower(service)"
fields.lat = "latency_ms * 1.0"
"""
AGGREGATES = {
    "n": "count",
    "errors": "count_if(level = 'error')",
    "users": "count_distinct(user)",
    "approx_users": "approx_count_distinct(user)",
    "p50": "median(lat)",
    "p99": "quantile(lat, 0.99)",
    "sd": "stddev(lat)",
    "var": "variance(latency_ms)",
}
TUMBLING = 'kind = "tumbling"\nsize_ms = 2000\nallowed_lateness_ms = 500'
SLIDING = 'kind = "sliding"\nsize_ms = 3000\nslide_ms = 1000'
SESSION = 'kind = "session"\ngap_ms = 700\nallowed_lateness_ms = 200'


def make_job(d: Path, *, events: int = 1500, window: str = TUMBLING, every: int = 200,
             batch: int = 64, seed: int = 5) -> Path:
    rng = random.Random(seed)
    (d / "in").mkdir(parents=True, exist_ok=True)
    for p in range(2):
        t = 1_700_000_000_000
        out = []
        for _ in range(events):
            t += rng.randint(0, 60)
            ts = t - rng.randint(0, 800) - (4000 if rng.random() < 0.03 else 0)
            rec: dict[str, Any] = {
                "service": rng.choice(["API", "api", "Db", "queue"]), "ts": ts,
                "level": rng.choice(["error", "info", "debug", "error"]),
                "user": rng.choice([f"u{rng.randint(0, 40)}", rng.randint(0, 5), None]),
                "latency_ms": rng.choice([rng.randint(1, 900), round(rng.uniform(0, 50), 3),
                                          None]),
            }
            if rng.random() < 0.01:
                rec["latency_ms"] = "n/a"  # a bad record: lat = latency_ms * 1.0 fails
            out.append(json.dumps(rec))
        (d / "in" / f"p{p}.jsonl").write_text("\n".join(out) + "\n")
    spec = d / "spec.toml"
    spec.write_text(spec_text("aggs", files_source(["in/p0.jsonl", "in/p1.jsonl"]), key="svc",
                              batch_size=batch, transform=TRANSFORM, window=window,
                              aggregates=AGGREGATES, late=True, errors=True,
                              every_events=every, keep=20))
    return spec


def committed(d: Path, sub: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for f in sorted((d / sub).glob("*.jsonl")):
        if not f.name.startswith((".", "_")):
            rows += [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    return rows


# ------------------------------------------------------------------ accuracy
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_approx_count_distinct_within_its_documented_error(tmp_path: Path, seed: int,
                                                           capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    """Windows of 10 .. 30,000 distinct values (strings, integers and floats): each
    estimate is within 3 standard errors (3 * 1.04 / sqrt(4096), 4.9 %) or 2 of the
    exact count, and count_distinct is exact."""
    rng = random.Random(seed)
    sizes = [10, 200, 3000, 30000]
    lines = []
    exact = {}
    for w, n in enumerate(sizes):
        values: list[Any] = [f"user-{rng.getrandbits(40)}" for _ in range(n // 2)]
        values += [rng.getrandbits(50) for _ in range(n - n // 2 - 5)]
        values += [rng.getrandbits(20) + 0.5 for _ in range(5)]
        exact[w] = len({json.dumps(v) for v in values})
        for v in values + values[: n // 3]:  # repeats do not count
            lines.append(json.dumps({"k": "a", "ts": w * 10 + rng.randint(0, 9), "v": v}))
    rng.shuffle(lines)
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "spec.toml").write_text("""
[pipeline]
name = "hll"
batch_size = 5000
[source]
kind = "jsonl"
paths = ["in.jsonl"]
key = "k"
time = "ts"
[watermark]
max_delay_ms = 1000
[window]
kind = "tumbling"
size_ms = 10
[aggregates]
approx = "approx_count_distinct(v)"
exact = "count_distinct(v)"
[sink]
kind = "jsonl"
path = "out"
""")
    assert main(["run", str(tmp_path / "spec.toml"), "--quiet"]) == 0, capsys.readouterr().err
    rows = {r["window_start"] // 10: r for r in committed(tmp_path, "out")}
    assert sorted(rows) == list(range(len(sizes)))
    for w, r in rows.items():
        assert r["exact"] == exact[w]
        bound = max(2.0, 3 * HLL_RELATIVE_ERROR * exact[w])
        assert abs(r["approx"] - exact[w]) <= bound, (w, r, exact[w])


def test_variance_is_stable_far_from_zero(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Values 1e9 + small noise, merged across batches and sliding panes: the variance
    matches the exact one to 1e-6 relative (sums of squares would lose it entirely)."""
    rng = random.Random(4)
    values = [1e9 + rng.randint(0, 1000) / 100 for _ in range(3000)]
    (tmp_path / "in.jsonl").write_text("".join(
        json.dumps({"k": "a", "ts": i, "v": v}) + "\n" for i, v in enumerate(values)))
    (tmp_path / "spec.toml").write_text("""
[pipeline]
name = "var"
batch_size = 37
[source]
kind = "jsonl"
paths = ["in.jsonl"]
key = "k"
time = "ts"
[window]
kind = "sliding"
size_ms = 1000
slide_ms = 250
[aggregates]
var = "variance(v)"
sd = "stddev(v)"
med = "median(v)"
[sink]
kind = "jsonl"
path = "out"
""")
    assert main(["run", str(tmp_path / "spec.toml"), "--quiet"]) == 0, capsys.readouterr().err
    rows = committed(tmp_path, "out")
    assert rows
    for r in rows:
        window = values[max(r["window_start"], 0):r["window_end"]]
        exact = statistics.variance([Fraction(v) for v in window]) if len(window) > 1 else None
        if exact is None:
            assert r["var"] is None
            continue
        assert math.isclose(r["var"], float(exact), rel_tol=1e-6), (r, float(exact))
        assert math.isclose(r["sd"], math.sqrt(float(exact)), rel_tol=1e-6)
        assert r["med"] == statistics.median(window)


# ------------------------------------------------------------------ export
def test_checkpoints_export_shows_the_new_states(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    spec = make_job(tmp_path, events=600, window=TUMBLING, every=150)
    res = run(spec, crash_at="after_retention:2")
    assert res.returncode == -9, res.stderr
    to = tmp_path / "open.jsonl"
    rc = main(["checkpoints", "export", str(tmp_path / "ckpt"), "--to", str(to)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    rows = [json.loads(x) for x in to.read_text().splitlines()]
    assert rows
    for r in rows:
        assert list(r)[-8:] == ["n", "errors", "users", "approx_users", "p50", "p99", "sd",
                                "var"]
        assert 0 <= r["errors"] <= r["n"] and isinstance(r["users"], int)
        assert abs(r["approx_users"] - r["users"]) <= max(2, 0.05 * r["users"])


# ------------------------------------------------------------------ crashes and damage
@pytest.mark.parametrize("window", [TUMBLING, SLIDING, SESSION], ids=["tumbling", "sliding",
                                                                      "session"])
def test_random_sigkills_with_transforms_and_new_aggregates(tmp_path: Path, window: str) -> None:
    ref = tmp_path / "ref"
    spec = make_job(ref, window=window)
    started = time.monotonic()
    res = run(spec)
    assert res.returncode == 0, res.stderr
    typical = time.monotonic() - started  # this machine's time for the whole job
    d = tmp_path / "killed"
    spec = make_job(d, window=window)
    kills = run_killed_randomly(spec, random.Random(window), typical)
    assert kills >= 1
    assert_same_output(d, ref)
    assert committed(d, "errors"), "the story has bad records from a failed expression"


def test_damaged_newest_checkpoint_falls_back(tmp_path: Path) -> None:
    ref = tmp_path / "ref"
    assert run_here(make_job(ref, window=SLIDING)).returncode == 0
    d = tmp_path / "job"
    spec = make_job(d, window=SLIDING)
    assert run(spec, crash_at="after_retention:4").returncode == -9
    newest = sorted((d / "ckpt").glob("cp-*"))[-1]
    state = newest / "state.arrow"
    data = state.read_bytes()
    state.write_bytes(data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 1])
                      + data[len(data) // 2 + 1:])
    verdicts = in_process("checkpoints", "verify", str(d / "ckpt"), "--json",
                          env={"SEALSTREAM_CRASH_AT": None})
    doc = json.loads(verdicts.stdout)
    assert doc["checkpoints"][-1]["verdict"] == "INCONSISTENT_STATE"
    res = run_here(spec)
    assert res.returncode == 0, res.stderr
    assert_same_output(d, ref)
    assert list((d / "ckpt" / "rejected").glob(f"{newest.name}-*"))  # kept as evidence


def _lines(d: Path, sub: str) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True) for r in committed(d, sub))


def test_sigkills_with_a_compound_key(tmp_path: Path) -> None:
    """Results name each key field; after SIGKILLs the jsonl sink rebuilds the
    identities of what was committed from those fields: nothing twice, nothing lost."""
    ref = tmp_path / "ref"
    spec = make_job(ref, window=SESSION)
    spec.write_text(spec.read_text().replace('key = "svc"', 'key = ["svc", "level"]'))
    started = time.monotonic()
    assert run(spec).returncode == 0
    typical = time.monotonic() - started
    d = tmp_path / "killed"
    spec = make_job(d, window=SESSION)
    spec.write_text(spec.read_text().replace('key = "svc"', 'key = ["svc", "level"]'))
    assert run_killed_randomly(spec, random.Random(11), typical) >= 1
    want = committed(ref, "out")
    assert want and all(list(r)[:4] == ["svc", "level", "window_start", "window_end"]
                        for r in want)
    for sub in ("late", "errors"):
        got = _lines(d, sub)
        assert len(got) == len(set(got)), f"{sub}: duplicated output"
        assert got == _lines(ref, sub), sub
    ident = ("svc", "level", "window_start", "window_end")
    got_rows = committed(d, "out")
    by_id = {tuple(r[k] for k in ident): r for r in want}
    assert len(got_rows) == len(want) == len(by_id)
    for r in got_rows:
        exp = by_id[tuple(r[k] for k in ident)]  # KeyError: a result the reference lacks
        assert r.keys() == exp.keys()
        for k, v in r.items():
            if isinstance(v, float) and isinstance(exp[k], float):
                assert math.isclose(v, exp[k], rel_tol=1e-9, abs_tol=1e-12), (k, v, exp[k])
            else:
                assert type(v) is type(exp[k]) and v == exp[k], (k, v, exp[k])
