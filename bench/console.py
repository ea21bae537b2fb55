"""The console on a store of many checkpoints: how long the history page takes.

    python -m bench.console [--checkpoints N] [--rounds N]

Builds a directory store of ``--checkpoints`` (default 10,000) signed checkpoints by
running the standard story job once and copying its first checkpoint N times under new
ids (each manifest rewritten and sealed again, so every one is ATOMIC), then times
requests through the console application (Starlette's test client, in this process):
the pipelines page, the first and the last history page (50 rows each), the same page
again (verdicts cached), a page filtered by verdict (judges every checkpoint on its first
load, then cached), the charts (the newest 500) and one checkpoint's detail. The target:
a history page under 1 s. Written to ``bench/results/console.md``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work" / "console"
RESULTS = ROOT / "bench" / "results"


def build(n: int) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "tests" / "console"))
    from _consolekit import clone_checkpoints

    from scenarios._story import make_input, run, write_spec

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    spec = write_spec(WORK, make_input(WORK), keep=20)
    assert run(spec).returncode == 0
    clone_checkpoints(WORK / "ckpt", n)
    return WORK / "ckpt"


def _time(client: object, path: str, rounds: int) -> tuple[float, float]:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        resp = client.get(path)  # type: ignore[attr-defined]
        times.append(time.perf_counter() - t)
        assert resp.status_code == 200, resp.text[:500]
    return times[0], statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoints", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from starlette.testclient import TestClient

    from sealstream.console import create_app

    ckpt = build(args.checkpoints)
    n = args.checkpoints
    pages = -(-n // 50)
    rows = []
    with TestClient(create_app([str(ckpt)])) as c:
        for what, path in [
            ("pipelines page", "/"),
            ("history, first page (newest 50)", "/s/0/0/history"),
            (f"history, last page ({pages})", f"/s/0/0/history?page={pages}"),
            ("history filtered by verdict ATOMIC_CHECKPOINT, page 2",
             "/s/0/0/history?verdict=ATOMIC_CHECKPOINT&page=2"),
            ("charts (newest 500)", "/s/0/0/charts"),
            ("checkpoint detail with diff against its parent", f"/s/0/0/cp/{n}"),
        ]:
            cold, warm = _time(c, path, args.rounds)
            rows.append((what, cold, warm))
    lines = [
        "# Console on a store of many checkpoints",
        "",
        f"`python -m bench.console --checkpoints {n} --rounds {args.rounds}`: a directory "
        f"store of {n} ATOMIC checkpoints; requests through the console application in "
        "one process (no network). First = the first request (verdicts not yet cached); "
        "median = of all rounds.",
        "",
        "| request | first (s) | median (s) |",
        "| --- | ---: | ---: |",
        *[f"| {w} | {a:.3f} | {b:.3f} |" for w, a, b in rows],
        "",
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "console.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
