"""A differential of sealstream's joins against real Flink SQL (PyFlink).

    python -m bench.flink_joins [--impressions N] [--seed N]

One small deterministic workload, in ``bench/work/flink_joins``:

* ``clicks.jsonl`` and ``impressions.jsonl`` (one file each), 9 ads, about 15 minutes
  of event time, disorder up to 800 ms (below ``max_delay_ms = 1000``: never late) and
  every 97th event of each source 150 s behind (late: its window closed long before);
* ``ads.jsonl``, a versioned reference table (``valid_from``, ``bid``, ``tier``): ads
  with one to three versions, one whose first version starts after the first
  impressions (those get no row), one ad with no row at all.

Three sealstream jobs (tumbling 60 s windows): an inner join of the clicks and
impressions aggregates with a derived field ``cost_per_click``, a left join with
``ctr``, and an ``[[enrich]]`` job (impressions joined as of their time with ``ads``,
``on_missing = "null"``, then aggregated). The Flink SQL equivalents run in
``bench/flink_joins_job.py`` (in the PyFlink venv, ``make bench-flink``): window TVF
aggregates per source joined on key, ``window_start`` and ``window_end``, and a
``FOR SYSTEM_TIME AS OF`` temporal join. Rows are compared by (key, window): integers
exactly, floats within 1e-9 relative. Written to ``bench/results/flink_joins.md``.
Skipped, in one line, when the PyFlink venv or Java is missing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work" / "flink_joins"
RESULT = ROOT / "bench" / "results" / "flink_joins.md"
FLINK_ENV = "SEALSTREAM_BENCH_PYFLINK"
T0 = 1_717_000_000_000
DELAY_MS = 1000
SIZE_MS = 60_000
LATE_EVERY = 97
LATE_BY_MS = 150_000

Row = dict[str, Any]


def flink_python() -> Path:
    given = os.environ.get(FLINK_ENV)
    return Path(given) if given else ROOT / "bench" / ".flink-venv" / "bin" / "python"


def _events(rng: random.Random, n: int, step_ms: int, late_phase: int) -> list[int]:
    """n event times, about ``step_ms`` apart, disorder below 800 ms, every
    LATE_EVERY-th one LATE_BY_MS behind."""
    out = []
    for i in range(n):
        t = T0 + i * step_ms + rng.randint(0, 40) - rng.randint(0, 800)
        if i > 300 and i % LATE_EVERY == late_phase:
            t -= LATE_BY_MS
        out.append(t)
    return out


def generate(d: Path, impressions: int, seed: int) -> dict[str, int]:
    """The workload's three files; both sources span the same event time line for line,
    so one global watermark (sealstream) and one per source (Flink) judge the same
    events late."""
    rng = random.Random(seed)
    d.mkdir(parents=True)
    ads = [f"ad{k}" for k in range(9)]
    with (d / "impressions.jsonl").open("w") as f:
        for t in _events(rng, impressions, 100, 5):
            f.write(json.dumps({"ad_id": rng.choice(ads), "shown_at": t,
                                "cost": round(rng.uniform(0.01, 2.0), 3)}) + "\n")
    with (d / "clicks.jsonl").open("w") as f:
        # clicks for ad0-ad6 only: ad7's and ad8's windows have none
        clicks = _events(rng, impressions, 100, 41)
        for t in clicks:
            f.write(json.dumps({"ad": rng.choice(ads[:7]), "ts": t}) + "\n")
    span = impressions * 100
    table = []
    for k, ad in enumerate(ads[:8]):          # ad8 has no row at all
        first = T0 + 200_000 if k == 3 else 0  # ad3's first version comes late
        versions = sorted({first, *(T0 + rng.randint(0, span) for _ in range(k % 3))})
        for v in versions:
            table.append({"ad_id": ad, "valid_from": v, "bid": round(rng.uniform(0.1, 3), 2),
                          "tier": rng.randint(1, 5)})
    # in valid_from order, as a changelog arrives: Flink's versioned table has a
    # watermark, and a version read after that watermark passed it can be missed by
    # events already joined (sealstream reads the whole table first; order is moot)
    table.sort(key=lambda r: (r["valid_from"], r["ad_id"]))
    (d / "ads.jsonl").write_text("".join(json.dumps(r) + "\n" for r in table))
    return {"impressions": impressions, "clicks": len(clicks), "table rows": len(table)}


SOURCES = f"""
[sources.clicks]
kind = "jsonl"
paths = ["clicks.jsonl"]
key = "ad"
time = "ts"

[sources.impressions]
kind = "jsonl"
paths = ["impressions.jsonl"]
key = "ad_id"
time = "shown_at"

[watermark]
max_delay_ms = {DELAY_MS}

[window]
kind = "tumbling"
size_ms = {SIZE_MS}

[aggregates]
clicks.n = "count"
impressions.n = "count"
impressions.cost = "sum(cost)"
"""

SPECS = {
    "inner": '[pipeline]\nname = "inner"\n' + SOURCES + """
[join]
type = "inner"
fields.cost_per_click = "impressions.cost / clicks.n"

[sink]
kind = "jsonl"
path = "out-inner"
""",
    "left": '[pipeline]\nname = "left"\n' + SOURCES + """
[join]
type = "left"
left = "impressions"
fields.ctr = "clicks.n / impressions.n"

[sink]
kind = "jsonl"
path = "out-left"
""",
    "enrich": f"""[pipeline]
name = "enrich"

[source]
kind = "jsonl"
paths = ["impressions.jsonl"]
key = "ad_id"
time = "shown_at"

[[enrich]]
name = "ads"
kind = "jsonl"
path = "ads.jsonl"
on = "ad_id"
valid_from = "valid_from"
columns = ["bid", "tier"]
on_missing = "null"

[watermark]
max_delay_ms = {DELAY_MS}

[window]
kind = "tumbling"
size_ms = {SIZE_MS}

[aggregates]
n = "count"
cost = "sum(cost)"
bid = "sum(bid)"
tier = "max(tier)"

[sink]
kind = "jsonl"
path = "out-enrich"
""",
}


def _read(files: list[Path]) -> list[Row]:
    return [json.loads(x) for f in files for x in f.read_text().splitlines() if x.strip()]


def run_sealstream(d: Path, job: str) -> tuple[list[Row], dict[str, Any]]:
    spec = d / f"{job}.toml"
    spec.write_text(SPECS[job])
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEALSTREAM_CRASH")}
    summary = d / f"{job}-summary.json"
    res = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet",
                          "--summary-json", str(summary)],
                         capture_output=True, text=True, timeout=600, env=env)
    if res.returncode != 0:
        raise SystemExit(f"flink_joins: sealstream {job} failed: {res.stderr.strip()}")
    return (_read(sorted((d / f"out-{job}").glob("*.jsonl"))),
            json.loads(summary.read_text()))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b) and type(a) is type(b)


def compare(ours: list[Row], theirs: list[Row]) -> list[str]:
    """Every difference, one line each: a (key, window) on one side only, or a value."""
    def by_id(rows: list[Row]) -> dict[tuple[str, int], Row]:
        return {(str(r["key"]), int(r["window_start"])): r for r in rows}

    a, b = by_id(ours), by_id(theirs)
    diffs = [f"{k}: only in sealstream: {a[k]}" for k in sorted(a.keys() - b.keys())]
    diffs += [f"{k}: only in Flink: {b[k]}" for k in sorted(b.keys() - a.keys())]
    for k in sorted(a.keys() & b.keys()):
        for col in b[k]:
            if not _same(a[k].get(col), b[k][col]):
                diffs.append(f"{k}: {col}: sealstream {a[k].get(col)!r}, Flink {b[k][col]!r}")
    return diffs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.flink_joins", description=__doc__)
    ap.add_argument("--impressions", type=int, default=9000)
    ap.add_argument("--seed", type=int, default=34)
    args = ap.parse_args(argv)
    py = flink_python()
    if not py.is_file() or shutil.which("java") is None:
        print(f"flink_joins: skipped: no PyFlink Python at {py} or no java on PATH "
              f"(make bench-flink, or set {FLINK_ENV})")
        return 0
    shutil.rmtree(WORK, ignore_errors=True)
    sizes = generate(WORK, args.impressions, args.seed)
    ours: dict[str, list[Row]] = {}
    late: dict[str, int] = {}
    for job in SPECS:
        ours[job], summary = run_sealstream(WORK, job)
        late[job] = int(summary.get("late_events", 0))
    t = time.monotonic()
    # PYTHONSAFEPATH: without it the script's directory, bench/, comes first on the
    # path, and its profile.py shadows the standard module that PyFlink's Beam
    # worker imports (through cProfile)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONSAFEPATH"] = "1"
    res = subprocess.run([str(py), str(ROOT / "bench" / "flink_joins_job.py"),
                          "--in-dir", str(WORK), "--out", str(WORK),
                          "--size-ms", str(SIZE_MS), "--max-delay-ms", str(DELAY_MS)],
                         capture_output=True, text=True, timeout=1800, env=env)
    flink_s = time.monotonic() - t
    if res.returncode != 0:
        raise SystemExit(f"flink_joins: the PyFlink job failed: {res.stderr.strip()[-2000:]}")
    lines = ["# sealstream joins vs Flink SQL (PyFlink)", "",
             "`python -m bench.flink_joins` (see its docstring and docs/joins.md, "
             "docs/enrich.md \"Compared with Flink SQL\").", "",
             "Workload: " + ", ".join(f"{v} {k}" for k, v in sizes.items())
             + f"; tumbling {SIZE_MS // 1000} s, max_delay_ms {DELAY_MS} (Flink DDL "
             f"watermark {DELAY_MS + 1} ms), every {LATE_EVERY}th event "
             f"{LATE_BY_MS // 1000} s late. PyFlink run (JVM start and 3 jobs): "
             f"{flink_s:.1f} s.", "",
             "| job | sealstream rows | Flink rows | sealstream late events | differences |",
             "| --- | --- | --- | --- | --- |"]
    details: list[str] = []
    total = 0
    for job in SPECS:
        theirs = _read([WORK / f"{job}.jsonl"])
        diffs = compare(ours[job], theirs)
        total += len(diffs)
        lines.append(f"| {job} | {len(ours[job])} | {len(theirs)} | {late[job]} | "
                     f"{len(diffs) or 'none: equal'} |")
        details += [f"- {job}: {x}" for x in diffs[:50]]
    lines += ["", "Rows compared by (key, window_start): integers and keys exactly, floats "
              "within 1e-9 relative."]
    if details:
        lines += ["", "## Differences", "", *details]
    RESULT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
