"""Results in S3 vs a local directory, in the same run: the standard workload with
a checkpoint every second (checkpoints in a directory both times), its JSON Lines
results once in a directory and once in S3 (a local SeaweedFS server started for the
run, ``weed mini``), interleaved.

    python -m bench.s3_results [--events N] [--keys N] [--repeat N]

Prints a markdown table (median whole-process time, events/s, the S3 run's share of
the directory's, checkpoint count and mean checkpoint time from the engine's
``--summary-json``) and writes it to ``bench/results/s3_results.md``. Each epoch's
results cost two PUTs (staging, final) and a DELETE in S3.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work" / "s3_results"
RESULTS = ROOT / "bench" / "results"


def run_one(name: str, sink: str, files: list[Path], env: dict[str, str]) -> dict[str, Any]:
    from sealstream.testing.specs import files_source, spec_text

    wd = WORK / f"{name}-{uuid.uuid4().hex[:6]}"
    wd.mkdir(parents=True)
    spec = wd / "spec.toml"
    spec.write_text(spec_text(f"bench_{name}", files_source(files), batch_size=100000,
                              max_delay_ms=2000, sink=f'kind = "jsonl"\npath = {json.dumps(sink)}',
                              checkpoint='path = "ckpt"', every_ms=1000, keep=3))
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet",
                          "--summary-json", str(wd / "summary.json")],
                         capture_output=True, text=True, timeout=1800, env={**os.environ, **env})
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"{name}: exit {res.returncode}: {res.stderr.strip()[-500:]}")
    summary = json.loads((wd / "summary.json").read_text())
    ck = summary.get("checkpoints", {})
    return {"wall": wall, "count": ck.get("count"), "mean_ms": ck.get("mean_ms"),
            "mean_bytes": summary.get("results_written")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.s3_results",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)

    from sealstream.testing.brokers import SeaweedServer
    from sealstream.testing.datagen import generate

    data = WORK.parent.parent / "data" / f"stores-{args.events}ev-{args.keys}k"
    files = [data / f"p{i}.jsonl" for i in range(3)]
    if not all(f.is_file() for f in files):
        generate(data, events=args.events, keys=args.keys, partitions=3, disorder_ms=2000,
                 seed=7)
    runs: dict[str, list[dict[str, Any]]] = {"directory": [], "s3": []}
    with SeaweedServer() as server:
        for _ in range(args.repeat):
            runs["directory"].append(run_one("directory", "out", files, {}))
            url = f"s3://{server.bucket}/bench-results-{uuid.uuid4().hex[:8]}"
            runs["s3"].append(run_one("s3", url, files, server.env()))
    rows = []
    for name, got in runs.items():
        wall = statistics.median(r["wall"] for r in got)
        mean_ms = statistics.median(r["mean_ms"] for r in got if r["mean_ms"] is not None)
        rows.append((name, wall, args.events / wall, got[-1]["count"], mean_ms,
                     got[-1]["mean_bytes"]))
    base = rows[0][1]
    lines = [
        f"JSON Lines results in S3 (SeaweedFS 4.48 on loopback) vs a directory: "
        f"{args.events:,} events, {args.keys:,} keys, 3 JSONL partitions, tumbling 60 s, "
        f"checkpoints in a directory every 1 s; median of {args.repeat} whole processes "
        f"each, interleaved (load average {os.getloadavg()[0]:.1f}).",
        "",
        "| results in | time (s) | events/s | vs directory | checkpoints | "
        "checkpoint (ms, median of means) | results (lines) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, wall, eps, count, mean_ms, mean_bytes in rows:
        lines.append(f"| {name} | {wall:.2f} | {eps:,.0f} | {base / wall:.0%} | {count} | "
                     f"{mean_ms:.1f} | "
                     f"{mean_bytes} |")
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "s3_results.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
