"""The PyFlink peer: Flink SQL ``TUMBLE`` over the benchmark's JSONL partitions.

Run with a Python that has ``apache-flink`` (``make bench-flink`` makes one in
``bench/.flink-venv``; Flink needs Java 11+): it imports nothing of sealstream
or of the bench venv. Streaming mode, event time from ``ts`` with a watermark
``max_delay_ms`` behind the largest time seen, one source reader per partition
(Flink's file source reads the files given to one reader one after another, so
with fewer readers than files the watermark of the first file makes the next
files' events late: they are dropped and the results undercount), and a
checkpoint every ``--checkpoint-ms`` (0: none). Results are JSON lines with the
columns the bench checks: key, window_start, window_end (ms), n, total.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pyflink_job.py", description=__doc__)
    ap.add_argument("--in-dir", type=Path, required=True, help="a directory of the JSONL files")
    ap.add_argument("--out", type=Path, required=True, help="a directory for the results")
    ap.add_argument("--size-ms", type=int, default=60_000)
    ap.add_argument("--max-delay-ms", type=int, default=1_000)
    ap.add_argument("--parallelism", type=int, default=1)
    ap.add_argument("--checkpoint-ms", type=int, default=0)
    ap.add_argument("--checkpoint-dir", type=Path)
    args = ap.parse_args(argv)

    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = env.get_config()
    conf.set("parallelism.default", str(args.parallelism))
    conf.set("table.local-time-zone", "UTC")
    if args.checkpoint_ms > 0:
        conf.set("execution.checkpointing.interval", f"{args.checkpoint_ms} ms")
        if args.checkpoint_dir is not None:
            conf.set("execution.checkpointing.dir", args.checkpoint_dir.resolve().as_uri())
    size, delay_s = args.size_ms, args.max_delay_ms / 1000
    src = str(args.in_dir.resolve()).replace("'", "''")
    out = str(args.out.resolve()).replace("'", "''")
    env.execute_sql(
        f"""CREATE TABLE src (`user` STRING, ts BIGINT, amount DOUBLE,
              rt AS TO_TIMESTAMP_LTZ(ts, 3),
              WATERMARK FOR rt AS rt - INTERVAL '{delay_s:g}' SECOND)
            WITH ('connector' = 'filesystem', 'path' = '{src}', 'format' = 'json')"""
    )
    env.execute_sql(
        f"""CREATE TABLE dst (`key` STRING, window_start BIGINT, window_end BIGINT,
              n BIGINT, total DOUBLE)
            WITH ('connector' = 'filesystem', 'path' = '{out}', 'format' = 'json')"""
    )
    # window bounds in ms from the events themselves: every event of a window
    # has floor(ts / size) * size as its start (windows are aligned to the epoch)
    env.execute_sql(
        f"""INSERT INTO dst
            SELECT `user`, (MIN(ts) / {size}) * {size}, (MIN(ts) / {size}) * {size} + {size},
                   COUNT(*), SUM(amount)
            FROM TABLE(TUMBLE(TABLE src, DESCRIPTOR(rt), INTERVAL '{size / 1000:g}' SECOND))
            GROUP BY `user`, window_start, window_end"""
    ).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
