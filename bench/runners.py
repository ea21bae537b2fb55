"""One-shot peers of the benchmark, each run in a fresh child process.

    python -m bench.runners {polars,duckdb,bytewax} --out FILE [--size-ms N]
                            [--max-delay-ms N] FILE.jsonl [FILE.jsonl ...]

Each reads every JSONL partition, assigns ``window_start = ts // size * size``,
groups by ``(user, window_start)``, computes ``n = count`` and
``total = sum(amount)`` and writes one JSON object per result line to ``--out``
with the same fields as a sealstream result (``key``, ``window_start``,
``window_end``, ``n``, ``total``), so that every contender pays for parsing and
for writing its output. Imports happen inside the runner so that a child only
loads what it needs (their cost is part of the measured process).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path


def run_polars(files: list[str], out: Path, size_ms: int, max_delay_ms: int) -> None:
    import polars as pl

    schema = {"user": pl.String, "ts": pl.Int64, "amount": pl.Float64}
    start = pl.col("ts") // size_ms * size_ms
    result = (
        pl.scan_ndjson(files, schema=schema)
        .group_by(pl.col("user").alias("key"), start.alias("window_start"))
        .agg(n=pl.len().cast(pl.Int64), total=pl.col("amount").sum())
        .select(
            "key",
            "window_start",
            (pl.col("window_start") + size_ms).alias("window_end"),
            "n",
            "total",
        )
        .collect()
    )
    result.write_ndjson(out)


def run_duckdb(files: list[str], out: Path, size_ms: int, max_delay_ms: int) -> None:
    import duckdb

    con = duckdb.connect()
    file_list = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "]"
    target = str(out).replace("'", "''")
    con.execute(
        f"""
        COPY (
            SELECT "user" AS key,
                   (ts // {size_ms}) * {size_ms} AS window_start,
                   (ts // {size_ms}) * {size_ms} + {size_ms} AS window_end,
                   count(*) AS n,
                   sum(amount) AS total
            FROM read_ndjson({file_list},
                             columns = {{'user': 'VARCHAR', 'ts': 'BIGINT', 'amount': 'DOUBLE'}})
            GROUP BY ALL
        ) TO '{target}' (FORMAT JSON)
        """
    )
    con.close()


def run_bytewax(files: list[str], out: Path, size_ms: int, max_delay_ms: int) -> None:
    """A bytewax (>= 0.20, ``bytewax.operators.windowing``) event-time dataflow.

    Unverified here: bytewax is not installed in the project's venv. Note that
    bytewax's EventClock also advances the watermark with system time, so its
    lateness is not the deterministic per-event watermark of sealstream.
    """
    from datetime import UTC, datetime, timedelta

    import bytewax.operators as op
    import bytewax.operators.windowing as win
    from bytewax.connectors.files import FileSource
    from bytewax.connectors.stdio import StdOutSink
    from bytewax.dataflow import Dataflow
    from bytewax.testing import run_main

    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    flow = Dataflow("bench")
    inputs = [op.input(f"in{i}", flow, FileSource(Path(f))) for i, f in enumerate(files)]
    merged = op.merge("merge", *inputs) if len(inputs) > 1 else inputs[0]
    parsed = op.map("parse", merged, json.loads)
    keyed = op.key_on("key", parsed, lambda r: r["user"])
    clock = win.EventClock(
        ts_getter=lambda r: epoch + timedelta(milliseconds=r["ts"]),
        wait_for_system_duration=timedelta(milliseconds=max_delay_ms),
    )
    windower = win.TumblingWindower(length=timedelta(milliseconds=size_ms), align_to=epoch)

    def folder(acc: list[float], r: dict[str, float]) -> list[float]:
        acc[0] += 1
        acc[1] += r["amount"]
        return acc

    def merger(a: list[float], b: list[float]) -> list[float]:
        return [a[0] + b[0], a[1] + b[1]]

    agg = win.fold_window("agg", keyed, clock, windower, lambda: [0, 0.0], folder, merger)

    def fmt(item: tuple[str, tuple[int, list[float]]]) -> str:
        key, (window_id, (n, total)) = item
        start = window_id * size_ms
        rec = {"key": key, "window_start": start, "window_end": start + size_ms}
        return json.dumps({**rec, "n": int(n), "total": total})

    op.output("out", op.map("fmt", agg.down, fmt), StdOutSink())
    with out.open("w") as fh:
        saved, sys.stdout = sys.stdout, fh
        try:
            run_main(flow)
        finally:
            sys.stdout = saved


RUNNERS: dict[str, Callable[[list[str], Path, int, int], None]] = {
    "polars": run_polars,
    "duckdb": run_duckdb,
    "bytewax": run_bytewax,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.runners", description=__doc__)
    ap.add_argument("runner", choices=sorted(RUNNERS))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--size-ms", type=int, default=60_000)
    ap.add_argument("--max-delay-ms", type=int, default=1_000)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    RUNNERS[args.runner](args.files, args.out, args.size_ms, args.max_delay_ms)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
