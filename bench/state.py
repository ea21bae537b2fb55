"""Open-window state at scale, measured inside one process.

    python -m bench.state --windows N --out FILE.json [--work DIR]

Builds ``N`` open tumbling windows (``n = count``, ``total = sum(amount)``, one
window per key, nothing fires) by feeding ``N`` events through the window
operator in engine-sized batches, then measures:

* ``process_s``: the operator's time for those ``N`` events (assign, aggregate,
  merge into the state; no parsing, no output);
* ``state_bytes`` / ``bytes_per_window``: the checkpoint's state file (Arrow IPC
  written by ``sealstream.state.codec.encode_table``, as the engine writes it);
* ``encode_s``: snapshot + encode + write the file;
* ``restore_s``: read the file, decode it and construct the operator from it
  (what a restart does with that state);
* a check that the restored operator fires the same windows.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

PARTITIONS = 3  # the standard workload's; a step takes the default batch of each


def measure(windows: int, work: Path) -> dict[str, float | int]:
    import numpy as np
    import polars as pl

    from sealstream.pipeline import DEFAULT_BATCH_SIZE, load_spec
    from sealstream.sources._base import KEY, KEY_IS_INT, TIME, float_col, int_col
    from sealstream.state import incremental
    from sealstream.state.codec import WATERMARK_META, decode_table, encode_table
    from sealstream.testing.datagen import write_spec
    from sealstream.watermark import NEG_INF, POS_INF, WATERMARK
    from sealstream.windows.aggregates import SEQ
    from sealstream.windows.operator import WindowOperator

    work.mkdir(parents=True, exist_ok=True)
    (work / "p0.jsonl").write_text("")
    spec = write_spec(
        work / "spec.toml",
        paths=["p0.jsonl"],
        window="tumbling",
        size_ms=60_000,
        aggregates={"n": "count", "total": "sum(amount)"},
    )
    p = load_spec(spec)
    rng = np.random.default_rng(0)
    t0_ms = 1_700_000_000_000
    ids = np.arange(windows, dtype=np.int64)
    events = pl.DataFrame(
        {
            KEY: pl.Series(ids).cast(pl.String).str.zfill(7).str.pad_start(8, "u"),
            KEY_IS_INT: np.zeros(windows, dtype=bool),
            TIME: t0_ms + (ids * 7919) % 60_000,
            SEQ: ids,
            WATERMARK: np.full(windows, NEG_INF, dtype=np.int64),
            int_col("amount"): pl.Series([None] * windows, dtype=pl.Int64),
            float_col("amount"): np.round(rng.uniform(1, 100, windows), 2),
        }
    )
    op = WindowOperator(p)
    t = time.perf_counter()
    step = PARTITIONS * DEFAULT_BATCH_SIZE
    for lo in range(0, windows, step):
        out = op.process(events.slice(lo, step), NEG_INF)
        assert not out.fired.height and not out.late.height
    process_s = time.perf_counter() - t
    assert op.open_windows == windows, (op.open_windows, windows)

    path = work / "state.arrow"
    t = time.perf_counter()
    # as the engine's checkpoint writer stores it: in key order
    data = encode_table(incremental.key_ordered(op.snapshot()),
                        {WATERMARK_META.decode(): {"global_ms": NEG_INF}})
    path.write_bytes(data)
    encode_s = time.perf_counter() - t

    t = time.perf_counter()
    state, _meta = decode_table(path.read_bytes())
    restored = WindowOperator(p, state)
    restore_s = time.perf_counter() - t

    a = op.process(events.clear(), POS_INF).fired.sort(KEY)
    b = restored.process(events.clear(), POS_INF).fired.sort(KEY)
    assert a.equals(b), "restored state fires different windows"
    return {
        "windows": windows,
        "process_s": process_s,
        "events_per_s": windows / process_s if process_s else 0.0,
        "state_bytes": len(data),
        "bytes_per_window": len(data) / windows,
        "in_memory_bytes": int(state.estimated_size()),
        "encode_s": encode_s,
        "restore_s": restore_s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.state", description=__doc__)
    ap.add_argument("--windows", type=int, default=1_000_000)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path)
    args = ap.parse_args(argv)
    if args.work is None:
        with tempfile.TemporaryDirectory() as tmp:
            res = measure(args.windows, Path(tmp))
    else:
        res = measure(args.windows, args.work)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
