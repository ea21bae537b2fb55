"""One-shot peers of the benchmark, each run in a fresh child process.

    python -m bench.runners {polars,duckdb,polars-parquet,duckdb-parquet,bytewax}
                            --out FILE [--size-ms N] [--max-delay-ms N]
                            [--recovery-dir DIR --epoch-ms N] FILE [FILE ...]

Each reads every partition (JSONL, or Parquet for the ``-parquet`` runners),
assigns ``window_start = ts // size * size``, groups by ``(user, window_start)``,
computes ``n = count`` and ``total = sum(amount)`` and writes one JSON object
per result line to ``--out`` with the same fields as a sealstream result (``key``, ``window_start``,
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
from typing import Any


def run_polars(files: list[str], out: Path, size_ms: int, max_delay_ms: int) -> None:
    import polars as pl

    schema = {"user": pl.String, "ts": pl.Int64, "amount": pl.Float64}
    _polars_group(pl.scan_ndjson(files, schema=schema), out, size_ms)


def run_polars_parquet(files: list[str], out: Path, size_ms: int, max_delay_ms: int) -> None:
    import polars as pl

    _polars_group(pl.scan_parquet(files).select("user", "ts", "amount"), out, size_ms)


def _polars_group(lf: Any, out: Path, size_ms: int) -> None:
    import polars as pl

    start = pl.col("ts") // size_ms * size_ms
    result = (
        lf.group_by(pl.col("user").alias("key"), start.alias("window_start"))
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


def run_polars_session(files: list[str], out: Path, size_ms: int, max_delay_ms: int,
                       gap_ms: int = 30_000) -> None:
    """Session windows (gap ``gap_ms``) in one Polars query: sort by key and time, a new
    session where the gap to the key's previous event exceeds ``gap_ms``."""
    import polars as pl

    schema = {"user": pl.String, "ts": pl.Int64, "amount": pl.Float64}
    new = (pl.col("ts") > pl.col("ts").shift(1).over("user") + gap_ms).fill_null(True)
    (
        pl.scan_ndjson(files, schema=schema)
        .sort("user", "ts")
        .with_columns(sid=new.cum_sum())
        .group_by(pl.col("user").alias("key"), "sid")
        .agg(window_start=pl.col("ts").min(), window_end=pl.col("ts").max() + gap_ms,
             n=pl.len().cast(pl.Int64), total=pl.col("amount").sum())
        .drop("sid")
        .collect()
        .write_ndjson(out)
    )


def run_polars_sliding(files: list[str], out: Path, size_ms: int, max_delay_ms: int,
                       slide_ms: int = 5_000) -> None:
    """Sliding windows (``size_ms`` every ``slide_ms``) in one Polars query: each event
    copied into the ``size / slide`` windows that hold it, then one group-by."""
    import polars as pl

    schema = {"user": pl.String, "ts": pl.Int64, "amount": pl.Float64}
    base = pl.col("ts") // slide_ms * slide_ms
    copies = list(range(-(-size_ms // slide_ms)))
    (
        pl.scan_ndjson(files, schema=schema)
        .with_columns(k=pl.lit(copies, dtype=pl.List(pl.Int64)))
        .explode("k")
        .with_columns(window_start=base - pl.col("k") * slide_ms)
        .filter(pl.col("window_start") + size_ms > pl.col("ts"))
        .group_by(pl.col("user").alias("key"), "window_start")
        .agg(n=pl.len().cast(pl.Int64), total=pl.col("amount").sum())
        .select("key", "window_start", (pl.col("window_start") + size_ms).alias("window_end"),
                "n", "total")
        .collect()
        .write_ndjson(out)
    )


def run_duckdb(files: list[str], out: Path, size_ms: int, max_delay_ms: int) -> None:
    _duckdb_group(
        files, out, size_ms,
        "read_ndjson({files}, columns = {{'user': 'VARCHAR', 'ts': 'BIGINT', 'amount': 'DOUBLE'}})",
    )


def run_duckdb_parquet(files: list[str], out: Path, size_ms: int, max_delay_ms: int) -> None:
    _duckdb_group(files, out, size_ms, "read_parquet({files})")


def _duckdb_group(files: list[str], out: Path, size_ms: int, source: str) -> None:
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
            FROM {source.format(files=file_list)}
            GROUP BY ALL
        ) TO '{target}' (FORMAT JSON)
        """
    )
    con.close()


def run_bytewax(
    files: list[str],
    out: Path,
    size_ms: int,
    max_delay_ms: int,
    recovery_dir: Path | None = None,
    epoch_ms: int | None = None,
) -> None:
    """A bytewax (>= 0.20, ``bytewax.operators.windowing``) event-time dataflow.

    With ``recovery_dir`` its recovery is on (an SQLite store per partition,
    snapshots every ``epoch_ms``), the counterpart of sealstream's checkpoints.
    The EventClock's system-time getter is pinned, so its watermark advances
    with event time only (``max event time - max_delay``), as sealstream's does.
    """
    from datetime import UTC, datetime, timedelta

    import bytewax.operators as op
    import bytewax.operators.windowing as win
    from bytewax.connectors.files import FileSource
    from bytewax.connectors.stdio import StdOutSink
    from bytewax.dataflow import Dataflow
    from bytewax.testing import run_main

    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    pinned = datetime(2000, 1, 1, tzinfo=UTC)
    flow = Dataflow("bench")
    inputs = [op.input(f"in{i}", flow, FileSource(Path(f))) for i, f in enumerate(files)]
    merged = op.merge("merge", *inputs) if len(inputs) > 1 else inputs[0]
    parsed = op.map("parse", merged, json.loads)
    keyed = op.key_on("key", parsed, lambda r: r["user"])
    clock = win.EventClock(
        ts_getter=lambda r: epoch + timedelta(milliseconds=r["ts"]),
        wait_for_system_duration=timedelta(milliseconds=max_delay_ms),
        now_getter=lambda: pinned,
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
            if recovery_dir is None:
                run_main(flow)
            else:
                from bytewax.recovery import RecoveryConfig, init_db_dir

                recovery_dir.mkdir(parents=True, exist_ok=True)
                init_db_dir(recovery_dir, 1)
                run_main(
                    flow,
                    epoch_interval=timedelta(milliseconds=epoch_ms or 1_000),
                    recovery_config=RecoveryConfig(recovery_dir),
                )
        finally:
            sys.stdout = saved


RUNNERS: dict[str, Callable[..., None]] = {
    "polars": run_polars,
    "polars-session": run_polars_session,
    "polars-sliding": run_polars_sliding,
    "duckdb": run_duckdb,
    "polars-parquet": run_polars_parquet,
    "duckdb-parquet": run_duckdb_parquet,
    "bytewax": run_bytewax,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.runners", description=__doc__)
    ap.add_argument("runner", choices=sorted(RUNNERS))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--size-ms", type=int, default=60_000)
    ap.add_argument("--max-delay-ms", type=int, default=1_000)
    ap.add_argument("--recovery-dir", type=Path, help="bytewax: recovery on, stored here")
    ap.add_argument("--epoch-ms", type=int, help="bytewax: snapshot interval")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.runner == "bytewax":
        run_bytewax(args.files, args.out, args.size_ms, args.max_delay_ms,
                    args.recovery_dir, args.epoch_ms)
    else:
        RUNNERS[args.runner](args.files, args.out, args.size_ms, args.max_delay_ms)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
