"""The raw-event archive's cost on the Kafka live path, in the same run.

    python -m bench.archive [--events N] [--keys N] [--repeat N]

The standard workload (3 partitions, Zipf keys, tumbling 60 s) is produced into a
3-partition topic of a local Kafka-protocol broker (``noida-db``); ``sealstream run``
reads it to its end (``stop = "end"``, a checkpoint every second, results to JSONL)
three ways, interleaved: without an archive, with ``[archive]`` in a local directory,
and with ``[archive]`` in S3 (a local SeaweedFS, ``weed mini``). Reported: the median
whole-process time, its CPU seconds (user + system of the run's process), events/s,
the share of the no-archive rate (the issue's target: the archive costs at most 15 %),
and the archive's segment count and bytes. ``--compare SRC`` adds, interleaved in the
same rounds, the two archive runs with another source tree (say ``/work/main/src``, the
code before a change), for a before/after measured side by side. Servers started here
are stopped by their PID. Results: ``bench/results/archive.md``: each run adds a
section of its own at the top (dated, with the load average); what the file held is
kept below it.
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

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work" / "archive"
RESULTS = ROOT / "bench" / "results"


def run_one(name: str, source: str, archive: str | None, env: dict[str, str],
            src: Path = ROOT / "src") -> dict[str, Any]:
    from sealstream.testing.specs import spec_text

    wd = WORK / f"{name}-{uuid.uuid4().hex[:6]}"
    wd.mkdir(parents=True)
    text = spec_text(f"bench_archive_{name}", source, batch_size=100000, max_delay_ms=2000,
                     every_ms=1000, keep=3)
    if archive is not None:
        text += f"\n[archive]\nurl = {json.dumps(archive)}\n"
    (wd / "spec.toml").write_text(text)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "sealstream", "run", "spec.toml", "--quiet",
                          "--summary-json", "summary.json"], cwd=wd, capture_output=True,
                         text=True, timeout=1800,
                         env={**os.environ, "PYTHONPATH": str(src), **env})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if res.returncode != 0:
        raise RuntimeError(f"{name}: exit {res.returncode}: {res.stderr.strip()[-500:]}")
    segs = sorted((wd / "archive").glob("seg-*")) if (wd / "archive").is_dir() else []
    return {"wall": wall, "cpu": cpu, "segments": len(segs),
            "bytes": sum(p.stat().st_size for p in segs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.archive",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--compare", type=Path, default=None, metavar="SRC",
                    help="also run the archive with this source tree (before/after)")
    args = ap.parse_args(argv)

    from bench.live import produce_files
    from sealstream.testing.brokers import KafkaBroker, SeaweedServer, create_topic
    from sealstream.testing.datagen import generate

    data = WORK.parent.parent / "data" / f"archive-{args.events}ev-{args.keys}k"
    files = [data / f"p{i}.jsonl" for i in range(3)]
    if not all(f.is_file() for f in files):
        generate(data, events=args.events, keys=args.keys, partitions=3, disorder_ms=2000,
                 seed=7)
    runs: dict[str, list[dict[str, Any]]] = {"no archive": [], "archive: directory": [],
                                             "archive: S3 (SeaweedFS)": []}
    with KafkaBroker() as broker, SeaweedServer() as s3:
        topic = f"archive-bench-{uuid.uuid4().hex[:8]}"
        create_topic(broker.bootstrap, topic, 3)
        produced = produce_files(broker.bootstrap, topic, files)
        source = (f'kind = "kafka"\nbootstrap = "{broker.bootstrap}"\ntopic = "{topic}"\n'
                  'stop = "end"')
        for _ in range(args.repeat):
            runs["no archive"].append(run_one("none", source, None, {}))
            trees = [("", ROOT / "src")]
            if args.compare is not None:
                trees.append((f" [{args.compare}]", args.compare.resolve()))
            for tag, src in trees:
                runs.setdefault(f"archive: directory{tag}", []).append(
                    run_one("dir", source, "archive", {}, src))
                url = f"s3://{s3.bucket}/bench-{uuid.uuid4().hex[:8]}"
                got = run_one("s3", source, url, s3.env(), src)
                listed = s3.client().list_objects_v2(Bucket=s3.bucket,
                                                     Prefix=url.split("/", 3)[3])
                got["segments"] = len(listed.get("Contents", []))
                got["bytes"] = sum(o["Size"] for o in listed.get("Contents", []))
                runs.setdefault(f"archive: S3 (SeaweedFS){tag}", []).append(got)
    base = statistics.median(r["wall"] for r in runs["no archive"])
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        f"## Run of {stamp} (load average {os.getloadavg()[0]:.1f})",
        "",
        f"The raw-event archive on the Kafka live path: {produced:,} events in a 3-partition "
        f"topic (noida-db on loopback), {args.keys:,} keys, tumbling 60 s, `stop = \"end\"`, "
        "batch_size 100,000, checkpoint every 1 s, results to JSONL; median of "
        f"{args.repeat} whole processes each, interleaved. Segments and bytes: what the "
        "archive holds at the end (after retention with keep = 3).",
        "",
        "| run | time (s) | CPU (s) | events/s | vs no archive | CPU vs no archive | "
        "segments kept | archive bytes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base_cpu = statistics.median(r["cpu"] for r in runs["no archive"])
    for name, done in runs.items():
        wall = statistics.median(r["wall"] for r in done)
        cpu = statistics.median(r["cpu"] for r in done)
        lines.append(f"| {name} | {wall:.2f} | {cpu:.2f} | {produced / wall:,.0f} | "
                     f"{base / wall:.0%} | {cpu / base_cpu:.0%} | {done[-1]['segments']} | "
                     f"{done[-1]['bytes']:,} |")
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "archive.md"
    old = out.read_text() if out.is_file() else ""
    out.write_text(text + ("\n" + old if old else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
