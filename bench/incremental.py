"""Incremental checkpoints on a large state: 1,000,000 open windows of which about
1% change between two checkpoints.

    python -m bench.incremental [--keys N] [--touch-events N] [--every N]

The input first opens one day-long window for each of ``--keys`` keys (one event
each), then sends ``--touch-events`` events to random keys; a checkpoint is taken
every ``--every`` events, so each checkpoint after the first phase sees about
``every / keys`` of the windows change. The same input runs twice, with full
snapshots and with ``incremental = true`` (full snapshot every 20), and the
table compares the bytes written per checkpoint, the whole-process times, and
the time to restore the newest checkpoint (base + deltas), to compare with the
standard benchmark's processing rate (``make bench``). Written to
``bench/results/incremental.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work" / "incremental"
RESULTS = ROOT / "bench" / "results"


def make_input(path: Path, keys: int, touch: int) -> None:
    rng = random.Random(5)
    t0 = 1_700_000_000_000
    with path.open("w") as f:
        for i in range(keys):
            f.write(json.dumps({"user": f"u{i}", "ts": t0 + i // 100, "amount": i % 97}) + "\n")
        for j in range(touch):
            f.write(json.dumps({"user": f"u{rng.randrange(keys)}", "ts": t0 + keys // 100 + j,
                                "amount": j % 89}) + "\n")


def run(name: str, data: Path, every: int, extra: str) -> tuple[float, Path]:
    """A run of one day-long tumbling window per key, a checkpoint every ``every``
    events (``extra``: more ``[checkpoint]`` lines)."""
    from sealstream.testing.specs import files_source, spec_text, tumbling

    wd = WORK / name
    shutil.rmtree(wd, ignore_errors=True)
    wd.mkdir(parents=True)
    spec = wd / "spec.toml"
    spec.write_text(spec_text("incremental_bench", files_source([data]), batch_size=10000,
                              window=tumbling(86_400_000),
                              checkpoint=f'path = "ckpt"\n{extra}', every_events=every,
                              keep=1000))
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet",
                          "--summary-json", str(wd / "summary.json")],
                         capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        raise RuntimeError(f"{name}: {res.stderr.strip()[-400:]}")
    return time.perf_counter() - t0, wd


def state_sizes(ckpt: Path) -> list[tuple[int, str, int]]:
    out = []
    for d in sorted(ckpt.glob("cp-*")):
        for f in d.iterdir():
            if f.name.startswith("state"):
                out.append((int(d.name[3:]), f.name, f.stat().st_size))
    return out


def restore_seconds(wd: Path, cid: int) -> tuple[float, int]:
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from sealstream.checkpoint.stores import LocalCheckpointStore\n"
        "from sealstream.pipeline import load_spec\n"
        "from sealstream.state import incremental\n"
        "from sealstream.windows.operator import WindowOperator\n"
        "p = load_spec(Path(sys.argv[1]))\n"
        "store = LocalCheckpointStore(Path(sys.argv[2]))\n"
        "t = time.perf_counter()\n"
        "doc = store.read_manifest(int(sys.argv[3]))\n"
        "state, _ = incremental.load_chain(doc['files'], store.read)\n"
        "op = WindowOperator(p, state)\n"
        "print(time.perf_counter() - t, op.snapshot().height)\n"
    )
    res = subprocess.run([sys.executable, "-c", code, str(wd / "spec.toml"), str(wd / "ckpt"),
                          str(cid)], capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(res.stderr.strip()[-400:])
    secs, rows = res.stdout.split()
    return float(secs), int(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.incremental")
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--touch-events", type=int, default=100_000)
    ap.add_argument("--every", type=int, default=10_000)
    args = ap.parse_args(argv)
    WORK.mkdir(parents=True, exist_ok=True)
    data = WORK / f"input-{args.keys}-{args.touch_events}.jsonl"
    if not data.is_file():
        make_input(data, args.keys, args.touch_events)
    full_s, full_wd = run("full", data, args.every, "")
    inc_s, inc_wd = run("incremental", data, args.every,
                        "incremental = true\nfull_every = 20")
    first_phase = args.keys // args.every  # checkpoints while the windows are being opened
    fulls = [b for c, n, b in state_sizes(full_wd / "ckpt") if c > first_phase]
    deltas = [b for c, n, b in state_sizes(inc_wd / "ckpt") if c > first_phase and
              n == "state.delta.arrow"]
    newest = max(c for c, _, _ in state_sizes(inc_wd / "ckpt"))
    # the last checkpoint comes after the end of input, when every window has fired:
    # restore the one before it, which holds all the open windows
    restore_s, rows = restore_seconds(inc_wd, newest - 1)
    full_b = statistics.median(fulls) if fulls else 0
    delta_b = statistics.median(deltas) if deltas else 0
    lines = [
        f"Incremental checkpoints: {args.keys:,} day-long windows opened, then "
        f"{args.touch_events:,} events on random keys, a checkpoint every {args.every:,} "
        f"events (about {args.every / args.keys:.1%} of the windows change between two). "
        f"Load average {os.getloadavg()[0]:.1f}.",
        "",
        "| measure | full snapshots | incremental (full every 20) |",
        "|---|---:|---:|",
        f"| state bytes per checkpoint (median, after the windows are open) | "
        f"{full_b:,.0f} | {delta_b:,.0f} ({delta_b / full_b:.1%} of full) |"
        if full_b else "| state bytes | n/a | n/a |",
        f"| whole process (s) | {full_s:.2f} | {inc_s:.2f} |",
        f"| restore the newest checkpoint with open windows: base + deltas, {rows:,} "
        f"windows (s) | | {restore_s:.2f} |",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "incremental.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
