"""The PyFlink peer of ``bench/flink_joins.py``: the same joins in Flink SQL.

Run with a Python that has ``apache-flink`` (``make bench-flink`` makes one in
``bench/.flink-venv``; Flink needs Java 11+): it imports nothing of sealstream or
of the bench venv. Reads ``clicks.jsonl``, ``impressions.jsonl`` and ``ads.jsonl``
from ``--in-dir`` and writes ``inner.jsonl``, ``left.jsonl`` and ``enrich.jsonl``
to ``--out``, one JSON object a line with window bounds in ms.

Streaming mode, parallelism 1, one file per source (a Flink file source reading
several files in one reader would make the later files' events late), event time
with a DDL watermark ``max_delay_ms + 1`` ms behind the largest time seen, so that
Flink SQL (which fires and drops at ``end - 1 <= W``) judges lateness at the same
event as sealstream (``end <= W``, ``W = max - max_delay_ms``), and a watermark
emitted on every event (``pipeline.auto-watermark-interval = 0``) rather than every
200 ms of processing time, so which events are late does not depend on timing.
"""

from __future__ import annotations

import argparse
import calendar
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any


def _ms(v: dt.datetime) -> int:
    return calendar.timegm(v.timetuple()) * 1000 + v.microsecond // 1000


def _collect(env: Any, sql: str, out: Path, names: list[str]) -> int:
    from pyflink.common import RowKind

    rows = []
    with env.execute_sql(sql).collect() as results:
        for r in results:
            if r.get_row_kind() != RowKind.INSERT:
                raise SystemExit(f"flink_joins_job: an update row ({r.get_row_kind()}) "
                                 f"in {out.name}")
            vals = list(r)
            rows.append({n: _ms(v) if isinstance(v, dt.datetime) else v
                         for n, v in zip(names, vals, strict=True)})
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flink_joins_job.py", description=__doc__)
    ap.add_argument("--in-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--size-ms", type=int, default=60_000)
    ap.add_argument("--max-delay-ms", type=int, default=1_000)
    args = ap.parse_args(argv)

    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = env.get_config()
    conf.set("parallelism.default", "1")
    conf.set("table.local-time-zone", "UTC")
    conf.set("pipeline.auto-watermark-interval", "0 ms")
    delay = f"{(args.max_delay_ms + 1) / 1000:.3f}"
    size = f"{args.size_ms / 1000:g}"
    d = args.in_dir.resolve()

    def path(name: str) -> str:
        return str(d / name).replace("'", "''")

    env.execute_sql(
        f"""CREATE TABLE clicks (ad STRING, ts BIGINT,
              rt AS TO_TIMESTAMP_LTZ(ts, 3),
              WATERMARK FOR rt AS rt - INTERVAL '{delay}' SECOND)
            WITH ('connector' = 'filesystem', 'path' = '{path("clicks.jsonl")}',
                  'format' = 'json')""")
    env.execute_sql(
        f"""CREATE TABLE impressions (ad_id STRING, shown_at BIGINT, cost DOUBLE,
              rt AS TO_TIMESTAMP_LTZ(shown_at, 3),
              WATERMARK FOR rt AS rt - INTERVAL '{delay}' SECOND)
            WITH ('connector' = 'filesystem', 'path' = '{path("impressions.jsonl")}',
                  'format' = 'json')""")
    # the versioned table: a primary key and an event-time attribute (valid_from)
    env.execute_sql(
        f"""CREATE TABLE ads (ad_id STRING, valid_from BIGINT, bid DOUBLE, tier INT,
              vt AS TO_TIMESTAMP_LTZ(valid_from, 3),
              WATERMARK FOR vt AS vt,
              PRIMARY KEY (ad_id) NOT ENFORCED)
            WITH ('connector' = 'filesystem', 'path' = '{path("ads.jsonl")}',
                  'format' = 'json')""")
    c = f"""(SELECT ad, window_start, window_end, COUNT(*) AS n
             FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(rt), INTERVAL '{size}' SECOND))
             GROUP BY ad, window_start, window_end)"""
    i = f"""(SELECT ad_id, window_start, window_end, COUNT(*) AS n, SUM(cost) AS cost
             FROM TABLE(TUMBLE(TABLE impressions, DESCRIPTOR(rt), INTERVAL '{size}' SECOND))
             GROUP BY ad_id, window_start, window_end)"""
    on = ("i.ad_id = c.ad AND i.window_start = c.window_start "
          "AND i.window_end = c.window_end")
    cols = ["key", "window_start", "window_end", "clicks.n", "impressions.n",
            "impressions.cost"]
    n_inner = _collect(env, f"""
        SELECT i.ad_id, i.window_start, i.window_end, c.n, i.n, i.cost,
               i.cost / c.n AS cost_per_click
        FROM {i} i JOIN {c} c ON {on}""", args.out / "inner.jsonl", cols + ["cost_per_click"])
    n_left = _collect(env, f"""
        SELECT i.ad_id, i.window_start, i.window_end, c.n, i.n, i.cost,
               CAST(c.n AS DOUBLE) / i.n AS ctr
        FROM {i} i LEFT JOIN {c} c ON {on}""", args.out / "left.jsonl", cols + ["ctr"])
    env.execute_sql("""CREATE TEMPORARY VIEW enriched AS
        SELECT e.ad_id, e.rt, e.cost, a.bid, a.tier
        FROM impressions AS e
        LEFT JOIN ads FOR SYSTEM_TIME AS OF e.rt AS a ON e.ad_id = a.ad_id""")
    n_enrich = _collect(env, f"""
        SELECT ad_id, window_start, window_end, COUNT(*), SUM(cost), SUM(bid), MAX(tier)
        FROM TABLE(TUMBLE(TABLE enriched, DESCRIPTOR(rt), INTERVAL '{size}' SECOND))
        GROUP BY ad_id, window_start, window_end""", args.out / "enrich.jsonl",
                        ["key", "window_start", "window_end", "n", "cost", "bid", "tier"])
    print(json.dumps({"inner": n_inner, "left": n_left, "enrich": n_enrich}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
