"""Checkpoint cost per store: the standard workload with a checkpoint every second,
checkpoints in a local directory vs a SQLite file vs a PostgreSQL database, and
(for the two databases) the results in a table of the same database, committed
in the checkpoint's transaction.

    python -m bench.store_cost [--events N] [--keys N] [--repeat N] [--pg URL]

PostgreSQL comes from ``--pg``, else ``SEALSTREAM_TEST_PG``, else
``scripts/pg-test-server``; without it those rows say why they are missing.
Prints a markdown table (median whole-process time, events/s, mean checkpoint
duration and size, from the engine's ``--summary-json``) and writes it to
``bench/results/stores.md``.
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
WORK = ROOT / "bench" / "work" / "stores"
RESULTS = ROOT / "bench" / "results"


def _pg_url(given: str | None) -> str | None:
    if given:
        return given
    if os.environ.get("SEALSTREAM_TEST_PG"):
        return os.environ["SEALSTREAM_TEST_PG"]
    try:
        out = subprocess.run([str(ROOT / "scripts" / "pg-test-server")], capture_output=True,
                             text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out or None


def _fresh_pg_db(admin: str) -> str:
    import psycopg

    name = f"sealstream_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin.rpartition("/")[0] + "/" + name


def _drop_pg_db(admin: str, url: str) -> None:
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{url.rpartition("/")[2]}" WITH (FORCE)')


def configs(pg: str | None) -> list[tuple[str, str, str]]:
    """(name, [sink] body, [checkpoint] store line); ``{pg}`` is filled per run."""
    files_sink = 'kind = "jsonl"\npath = "out"'
    out = [
        ("directory", files_sink, 'path = "ckpt"'),
        ("sqlite", files_sink, 'url = "sqlite:///ckpt.db"'),
        ("sqlite+table", 'kind = "sqlite"\nurl = "sqlite:///ckpt.db"\ntable = "results"',
         'url = "sqlite:///ckpt.db"'),
    ]
    if pg:
        out += [
            ("postgresql", files_sink, 'url = "{pg}"'),
            ("postgresql+table", 'kind = "postgresql"\nurl = "{pg}"\ntable = "results"',
             'url = "{pg}"'),
        ]
    return out


def run_one(name: str, sink: str, store: str, files: list[Path], pg_admin: str | None
            ) -> dict[str, Any]:
    from sealstream.testing.specs import files_source, spec_text

    wd = WORK / f"{name}-{uuid.uuid4().hex[:6]}"
    wd.mkdir(parents=True)
    pg = _fresh_pg_db(pg_admin) if "{pg}" in sink + store and pg_admin else None
    try:
        spec = wd / "spec.toml"
        spec.write_text(spec_text(f"bench_{name.replace('+', '_')}", files_source(files),
                                  batch_size=100000, max_delay_ms=2000,
                                  sink=sink.replace("{pg}", pg or ""),
                                  checkpoint=store.replace("{pg}", pg or ""), every_ms=1000,
                                  keep=3))
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet",
                              "--summary-json", str(wd / "summary.json")],
                             capture_output=True, text=True, timeout=1800)
        wall = time.perf_counter() - t0
        if res.returncode != 0:
            raise RuntimeError(f"{name}: exit {res.returncode}: {res.stderr.strip()[-500:]}")
        summary = json.loads((wd / "summary.json").read_text())
    finally:
        if pg and pg_admin:
            _drop_pg_db(pg_admin, pg)
    ck = summary.get("checkpoints", {})
    return {"wall": wall, "events": summary.get("events"),
            "count": ck.get("count"), "mean_ms": ck.get("mean_ms"),
            "mean_bytes": ck.get("mean_bytes")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.store_cost", description=__doc__.split(
        "\n\n")[0])
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pg", default=None, help="PostgreSQL URL of a role that may CREATE DATABASE")
    args = ap.parse_args(argv)

    from sealstream.testing.datagen import generate

    data = WORK.parent.parent / "data" / f"stores-{args.events}ev-{args.keys}k"
    files = [data / f"p{i}.jsonl" for i in range(3)]
    if not all(f.is_file() for f in files):
        generate(data, events=args.events, keys=args.keys, partitions=3, disorder_ms=2000,
                 seed=7)
    pg_admin = _pg_url(args.pg)
    rows = []
    for name, sink, store in configs(pg_admin):
        runs = [run_one(name, sink, store, files, pg_admin) for _ in range(args.repeat)]
        wall = statistics.median(r["wall"] for r in runs)
        last = runs[-1]
        rows.append((name, wall, args.events / wall, last["count"], last["mean_ms"],
                     last["mean_bytes"]))
        print(f"{name}: {wall:.2f} s, {last['count']} checkpoints, "
              f"mean {last['mean_ms']} ms", flush=True)
    base = rows[0][1]
    lines = [
        f"Checkpoint cost per store: {args.events:,} events, {args.keys:,} keys, 3 JSONL "
        f"partitions, tumbling 60 s, checkpoint every 1 s; median of {args.repeat} whole "
        f"processes (load average {os.getloadavg()[0]:.1f}).",
        "",
        "| store | results to | time (s) | events/s | vs directory | checkpoints | "
        "mean checkpoint (ms) | mean size (KiB) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, wall, eps, count, mean_ms, mean_bytes in rows:
        store, _, table = name.partition("+")
        lines.append(
            f"| {store} | {'table, same transaction' if table else 'JSONL files'} | "
            f"{wall:.2f} | {eps:,.0f} | {base / wall:.0%} | {count} | "
            f"{mean_ms if mean_ms is None else f'{mean_ms:.1f}'} | "
            f"{mean_bytes if mean_bytes is None else f'{mean_bytes / 1024:.1f}'} |")
    if not pg_admin:
        lines.append("\nPostgreSQL rows missing: no server (give --pg URL or start one with "
                     "scripts/pg-test-server).")
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "stores.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
