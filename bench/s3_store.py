"""Checkpoints in S3 vs a local directory, in the same run: the standard workload
with a checkpoint every second, its checkpoints once in a directory and once in S3
(a local SeaweedFS server started for the run, ``weed mini``), interleaved.

    python -m bench.s3_store [--events N] [--keys N] [--repeat N]

Prints a markdown table (median whole-process time and CPU seconds (user + sys of
the process and its children), events/s, the S3 run's share of the directory's,
checkpoint count, mean checkpoint write time and size, from the engine's
``--summary-json``) and writes it to ``bench/results/s3.md`` (keep the analysis
below the table by hand). Against a real bucket the write time adds the network's
round trips: per checkpoint, on the writer thread, the claim, its files and the lease
renewal (concurrently), then the manifest; the retention's deletion of the oldest (a
marker, the manifest, one batch, the claim, the marker) on the store's background
thread. ``python -m bench.s3_profile`` counts and times every request by thread and
caller.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.harness import on_top

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work" / "s3"
RESULTS = ROOT / "bench" / "results"


def run_one(name: str, store: str, files: list[Path], env: dict[str, str]) -> dict[str, Any]:
    from sealstream.testing.specs import files_source, spec_text

    wd = WORK / f"{name}-{uuid.uuid4().hex[:6]}"
    wd.mkdir(parents=True)
    spec = wd / "spec.toml"
    spec.write_text(spec_text(f"bench_{name}", files_source(files), batch_size=100000,
                              max_delay_ms=2000, sink='kind = "jsonl"\npath = "out"',
                              checkpoint=store, every_ms=1000, keep=3))
    t0 = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet",
                          "--summary-json", str(wd / "summary.json")],
                         capture_output=True, text=True, timeout=1800, env={**os.environ, **env})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if res.returncode != 0:
        raise RuntimeError(f"{name}: exit {res.returncode}: {res.stderr.strip()[-500:]}")
    summary = json.loads((wd / "summary.json").read_text())
    ck = summary.get("checkpoints", {})
    return {"wall": wall, "cpu": cpu, "count": ck.get("count"), "mean_ms": ck.get("mean_ms"),
            "mean_bytes": ck.get("mean_bytes")}


def main(argv: list[str] | None = None) -> int:
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    ap = argparse.ArgumentParser(prog="python -m bench.s3_store",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=2_000_000)
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
            runs["directory"].append(run_one("directory", 'path = "ckpt"', files, {}))
            url = f"s3://{server.bucket}/bench-{uuid.uuid4().hex[:8]}"
            runs["s3"].append(run_one("s3", f"url = {json.dumps(url)}", files, server.env()))
    rows = []
    for name, got in runs.items():
        wall = statistics.median(r["wall"] for r in got)
        cpu = statistics.median(r["cpu"] for r in got)
        mean_ms = statistics.median(r["mean_ms"] for r in got if r["mean_ms"] is not None)
        rows.append((name, wall, cpu, args.events / wall, got[-1]["count"], mean_ms,
                     got[-1]["mean_bytes"]))
    base = rows[0][1]
    lines = [
        "# S3 checkpoints against a directory store (side by side)",
        "",
        f"Checkpoints in S3 (SeaweedFS 4.48 on loopback) vs a directory: {args.events:,} "
        f"events, {args.keys:,} keys, 3 JSONL partitions, tumbling 60 s, checkpoint every "
        f"1 s, results to JSONL files; median of {args.repeat} whole processes each, "
        f"interleaved (load average {os.getloadavg()[0]:.1f} at the end; "
        f"{time.strftime('%H:%M UTC', time.gmtime())}).",
        "",
        "| checkpoints in | time (s) | CPU (s) | events/s | vs directory | checkpoints | "
        "checkpoint write (ms, median of means) | mean size (KiB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, wall, cpu, eps, count, mean_ms, mean_bytes in rows:
        lines.append(f"| {name} | {wall:.2f} | {cpu:.2f} | {eps:,.0f} | {base / wall:.0%} | "
                     f"{count} | "
                     f"{mean_ms:.1f} | "
                     f"{mean_bytes if mean_bytes is None else f'{mean_bytes / 1024:.1f}'} |")
    lines.append("")
    lines.append("Each run, in order (wall / CPU s): " + "; ".join(
        f"{name} " + ", ".join(f"{r['wall']:.2f}/{r['cpu']:.2f}" for r in got)
        for name, got in runs.items()) + ".")
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "s3.md").write_text(on_top(RESULTS / "s3.md", lines, started))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
