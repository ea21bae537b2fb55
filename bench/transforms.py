"""Transforms and the newer aggregates on the standard workload.

    python -m bench.transforms [--events N] [--keys N] [--repeat N]

Runs (each ``--repeat`` times, the median kept), on the standard workload's data
(``sealstream.testing.datagen.generate``: 3 JSONL partitions, Zipf keys, tumbling 60 s,
``max_delay_ms = 1000``):

* ``plain``: ``n = "count"``, ``total = "sum(amount)"`` (the standard pipeline);
* ``filter+derived``: the same with ``where = "amount >= <median amount>"`` (keeps half
  the events) and one derived field (``fields.cents = "amount * 100"``, summed
  instead of ``amount``); target: at least 95 % of ``plain``'s rate;
* ``distinct+median``: ``count_distinct(amount)`` and ``median(amount)`` over the
  10,000 keys.

The rate is events read per second of the engine's own run time (its summary's
``seconds``; process start-up is left out). The state per open window is measured on
a run of each pipeline killed right after its first checkpoint (taken after a
quarter of the events): the compressed bytes of the checkpoint's state file and the
in-memory bytes of the decoded table, over its open windows. Written to
``bench/results/transforms.md``.
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

import polars as pl

from sealstream.state.codec import decode_table
from sealstream.testing.datagen import generate
from sealstream.testing.specs import COUNT_AND_SUM, files_source, spec_text

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work" / "transforms"
RESULTS = ROOT / "bench" / "results"

TARGET = 0.95


def configs(median_amount: float) -> dict[str, tuple[str | None, dict[str, str]]]:
    """name -> (the ``[transform]`` lines or None, the aggregates)."""
    return {
        "plain": (None, dict(COUNT_AND_SUM)),
        "filter+derived": (
            f'where = "amount >= {median_amount!r}"\nfields.cents = "amount * 100"',
            {"n": "count", "total": "sum(cents)"}),
        "distinct+median": (None, {"distinct": "count_distinct(amount)",
                                   "p50": "median(amount)"}),
    }


def _spec(wd: Path, paths: list[str], transform: str | None, aggregates: dict[str, str],
          every: int | None = None) -> Path:
    """The pipeline's spec in a fresh ``wd``; checkpointed (synchronously) every
    ``every`` events when given."""
    shutil.rmtree(wd, ignore_errors=True)
    wd.mkdir(parents=True)
    spec = wd / "spec.toml"
    checkpoint = None if every is None else 'path = "ckpt"\nasynchronous = false'
    spec.write_text(spec_text("transforms_bench", files_source(paths), transform=transform,
                              aggregates=aggregates, checkpoint=checkpoint,
                              every_events=every))
    return spec


def rate(wd: Path, paths: list[str], transform: str | None, aggregates: dict[str, str]
         ) -> tuple[float, int]:
    spec = _spec(wd, paths, transform, aggregates)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEALSTREAM_CRASH")}
    res = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet",
                          "--summary-json", str(wd / "summary.json")],
                         capture_output=True, text=True, timeout=3600, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"{wd.name}: {res.stderr.strip()[-400:]}")
    summary = json.loads((wd / "summary.json").read_text())
    return summary["events"] / summary["seconds"], summary["results_written"]


def state_per_window(wd: Path, paths: list[str], transform: str | None,
                     aggregates: dict[str, str], every: int) -> tuple[int, float, float]:
    """(open windows, compressed state bytes per window, in-memory bytes per window)
    at the first checkpoint."""
    spec = _spec(wd, paths, transform, aggregates, every)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEALSTREAM_CRASH")}
    env["SEALSTREAM_CRASH_AT"] = "after_retention:1"
    res = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                         capture_output=True, text=True, timeout=3600, env=env)
    if res.returncode != -9:
        raise RuntimeError(f"{wd.name}: expected a SIGKILL at the crash point, got "
                           f"{res.returncode}: {res.stderr.strip()[-400:]}")
    state_file = next((wd / "ckpt").glob("cp-*/state*"))
    table, _ = decode_table(state_file.read_bytes())
    n = max(table.height, 1)
    return table.height, state_file.stat().st_size / n, table.estimated_size() / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.transforms")
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    data = WORK / f"data-{args.events}-{args.keys}-{args.partitions}"
    if not data.is_dir():
        generate(data, events=args.events, keys=args.keys, partitions=args.partitions)
    paths = sorted(str(p) for p in data.glob("*.jsonl"))
    median_amount = float(
        pl.concat([pl.read_ndjson(p, schema={"amount": pl.Float64}) for p in paths])
        .get_column("amount").median() or 0.0)
    rows = []
    rates: dict[str, float] = {}
    for name, (transform, aggregates) in configs(median_amount).items():
        runs = [rate(WORK / name, paths, transform, aggregates) for _ in range(args.repeat)]
        rates[name] = statistics.median(r for r, _ in runs)
        windows, packed, memory = state_per_window(WORK / f"{name}-state", paths, transform,
                                                    aggregates, max(1, args.events // 4))
        rows.append((name, rates[name], runs[0][1], windows, packed, memory))
    ratio = rates["filter+derived"] / rates["plain"]
    lines = [
        "# Transforms and the newer aggregates",
        "",
        f"{args.events:,} events, {args.keys:,} keys, {args.partitions} partitions, "
        f"tumbling 60 s; median of {args.repeat} runs; rate = events read per second of "
        "the engine's run time. State at the first checkpoint (after a quarter of the "
        "events).",
        "",
        "| pipeline | events/s | results | open windows | state bytes/window (file) | "
        "state bytes/window (memory) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r, results, windows, packed, memory in rows:
        lines.append(f"| {name} | {r:,.0f} | {results:,} | {windows:,} | {packed:,.0f} | "
                     f"{memory:,.0f} |")
    verdict = "meets" if ratio >= TARGET else "misses"
    lines += ["", f"filter (keeps half) + one derived field vs plain: {ratio:.1%} of the "
              f"plain rate ({verdict} the {TARGET:.0%} target).", ""]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "transforms.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
