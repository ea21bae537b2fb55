"""Two sources joined vs one source of the same events.

    python -m bench.joins [--events N] [--keys N] [--repeat N]

The standard workload's data (``sealstream.testing.datagen.generate``: Zipf keys, 4
JSONL partitions, ``max_delay_ms = 1000``, tumbling 60 s), ``--events`` in all:

* ``one source``: the 4 partitions as one ``[source]``, ``n = "count"``,
  ``total = "sum(amount)"``;
* ``two sources joined``: partitions 0-1 as source ``a`` and 2-3 as source ``b``
  (half the events each), ``a.n``, ``a.total``, ``b.n``, ``b.total``, an inner join and
  one derived field ``ratio = "a.total / b.total"``; target: at least 70 % of the
  one-source rate.

The rate is events read per second of the engine's own run time (its summary's
``seconds``; process start-up is left out), median of ``--repeat`` runs. Written to
``bench/results/joins.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from sealstream.testing.datagen import generate

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work" / "joins"
RESULTS = ROOT / "bench" / "results"

TARGET = 0.70

TAIL = """
[watermark]
max_delay_ms = 1000

[window]
kind = "tumbling"
size_ms = 60000

{aggregates}
[sink]
kind = "jsonl"
path = "out"
"""


def one_source(paths: list[str]) -> str:
    return ('[pipeline]\nname = "one"\n\n[source]\nkind = "jsonl"\n'
            f"paths = {json.dumps(paths)}\nkey = \"user\"\ntime = \"ts\"\n"
            + TAIL.format(aggregates='[aggregates]\nn = "count"\ntotal = "sum(amount)"\n'))


def two_sources(paths: list[str]) -> str:
    half = len(paths) // 2
    out = '[pipeline]\nname = "joined"\n\n'
    for name, part in (("a", paths[:half]), ("b", paths[half:])):
        out += (f'[sources.{name}]\nkind = "jsonl"\npaths = {json.dumps(part)}\n'
                'key = "user"\ntime = "ts"\n\n')
    aggs = ('[aggregates]\na.n = "count"\na.total = "sum(amount)"\nb.n = "count"\n'
            'b.total = "sum(amount)"\n\n[join]\ntype = "inner"\n'
            'fields.ratio = "a.total / b.total"\n')
    return out + TAIL.format(aggregates=aggs)


def rate(wd: Path, spec_text: str) -> tuple[float, int]:
    shutil.rmtree(wd, ignore_errors=True)
    wd.mkdir(parents=True)
    spec = wd / "spec.toml"
    spec.write_text(spec_text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEALSTREAM_CRASH")}
    res = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet",
                          "--summary-json", str(wd / "summary.json")],
                         capture_output=True, text=True, timeout=3600, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"{wd.name}: {res.stderr.strip()[-400:]}")
    summary = json.loads((wd / "summary.json").read_text())
    return summary["events"] / summary["seconds"], summary["results_written"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.joins")
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    data = WORK / f"data-{args.events}-{args.keys}"
    if not data.is_dir():
        generate(data, events=args.events, keys=args.keys, partitions=4)
    paths = sorted(str(p) for p in data.glob("*.jsonl"))
    specs = {"one source": one_source(paths), "two sources joined": two_sources(paths)}
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in specs}
    for _ in range(args.repeat):  # interleaved: a noisy machine slows both alike
        for name, text in specs.items():
            runs[name].append(rate(WORK / name.replace(" ", "-"), text))
    rates = {n: statistics.median(r for r, _ in rs) for n, rs in runs.items()}
    results = {n: rs[0][1] for n, rs in runs.items()}
    ratio = rates["two sources joined"] / rates["one source"]
    verdict = "meets" if ratio >= TARGET else "misses"
    lines = [
        "# Two sources joined vs one source",
        "",
        f"{args.events:,} events in 4 JSONL partitions, {args.keys:,} keys, tumbling 60 s; "
        f"median of {args.repeat} runs; rate = events read per second of the engine's run "
        "time. Joined: partitions 0-1 are source `a`, 2-3 source `b` (half the events "
        "each), two aggregates per source, an inner join and one derived field.",
        "",
        "| pipeline | events/s | results |",
        "| --- | ---: | ---: |",
        *(f"| {n} | {rates[n]:,.0f} | {results[n]:,} |" for n in rates),
        "",
        f"two sources joined vs one source: {ratio:.1%} of the one-source rate "
        f"({verdict} the {TARGET:.0%} target).",
        "",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "joins.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
