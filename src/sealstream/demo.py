"""``make demo``: the crash-and-recover story on a generated stream.

1. Generate a realistic stream: 3 partitions, out-of-order events, a few late
   events and a few malformed lines.
2. Run it once, uninterrupted, as the reference.
3. Run it again with checkpoints and SIGKILL the process right after its third
   checkpoint.
4. Flip one byte in the newest checkpoint's window state.
5. ``sealstream checkpoints verify`` shows the verdicts.
6. Resume: the damaged checkpoint is moved aside, the job falls back to the
   previous one, suppresses output it had already committed, and finishes.
7. Compare: the results equal the uninterrupted run, each exactly once.

Run with ``python -m sealstream.demo [DIR] [--events N]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sealstream.testing.datagen import generate, write_spec

console = Console(highlight=False)


def _run(spec: Path, *args: str, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("SEALSTREAM_CRASH_AT", None)
    if crash_at:
        env["SEALSTREAM_CRASH_AT"] = crash_at
    return subprocess.run(
        [sys.executable, "-m", "sealstream", "run", str(spec), *args],
        env=env, capture_output=True, text=True, check=False,
    )


def _lines(folder: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for f in sorted(folder.glob("*.jsonl")):
        if not f.name.startswith((".", "_")):
            out.extend(json.loads(x) for x in f.read_text().splitlines() if x.strip())
    return out


def _same(want: list[dict[str, Any]], got: list[dict[str, Any]], ident: tuple[str, ...]) -> bool:
    """Equal as sets of records; floats within 1e-9 relative (the contract's tolerance)."""
    index = {tuple(r[k] for k in ident): r for r in want}
    if len(index) != len(got):
        return False
    for r in got:
        e = index.get(tuple(r[k] for k in ident))
        if e is None or e.keys() != r.keys():
            return False
        for k, v in r.items():
            if isinstance(v, float) and isinstance(e[k], float):
                if not math.isclose(v, e[k], rel_tol=1e-9):
                    return False
            elif type(v) is not type(e[k]) or v != e[k]:
                return False
    return True


def _spec(root: Path, inputs: list[Path], tag: str, checkpoint: bool) -> Path:
    return write_spec(
        root / f"{tag}.toml",
        paths=inputs,
        name="payments",
        window="tumbling",
        size_ms=60_000,
        allowed_lateness_ms=5_000,
        max_delay_ms=1_000,
        aggregates={"n": "count", "total": "sum(amount)", "avg": "mean(amount)",
                    "largest": "max(amount)"},
        sink=f"{tag}/out",
        late=f"{tag}/late",
        errors=f"{tag}/errors",
        checkpoint=f"{tag}/ckpt" if checkpoint else None,
        checkpoint_every_events=30_000 if checkpoint else None,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sealstream.demo")
    ap.add_argument("dir", nargs="?", default="demo-run")
    ap.add_argument("--events", type=int, default=300_000)
    args = ap.parse_args(argv)
    root = Path(args.dir).resolve()
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)

    console.rule("[bold]1. a stream")
    inputs = generate(root / "in", events=args.events, keys=2_000, partitions=3,
                      disorder_ms=800, late_fraction=0.002, bad_fraction=0.0005,
                      rate_per_s=500.0, seed=42)
    size = sum(p.stat().st_size for p in inputs)
    console.print(f"{args.events:,} events in {len(inputs)} partitions ({size / 1e6:.1f} MB), "
                  "out of order by up to 0.8 s, 0.2% of them minutes late, a few bad lines")

    console.rule("[bold]2. the uninterrupted reference run")
    ref = _run(_spec(root, inputs, "reference", checkpoint=False))
    console.print(ref.stdout.rstrip())
    if ref.returncode != 0:
        console.print(f"[red]reference run failed: {ref.stderr}")
        return 1

    console.rule("[bold]3. the same job with checkpoints, SIGKILLed after checkpoint 3")
    spec = _spec(root, inputs, "job", checkpoint=True)
    crashed = _run(spec, "--quiet", crash_at="after_retention:3")
    console.print(f"process exit status: {crashed.returncode} (-9 = killed by SIGKILL)")
    ckpt = root / "job" / "ckpt"
    committed = len(_lines(root / "job" / "out"))
    console.print(f"committed so far: {committed:,} window results")

    console.rule("[bold]4. one flipped byte in the newest checkpoint")
    newest = sorted(ckpt.glob("cp-*"))[-1]
    state = newest / "state.arrow"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0x20
    state.write_bytes(bytes(data))
    console.print(f"flipped byte {len(data) // 2} of {state.relative_to(root)}")

    console.rule("[bold]5. sealstream checkpoints verify")
    ver = subprocess.run([sys.executable, "-m", "sealstream", "checkpoints", "verify", str(ckpt)],
                         capture_output=True, text=True, check=False)
    console.print(ver.stdout.rstrip())
    console.print(f"(exit status {ver.returncode}: not every checkpoint verifies)")

    console.rule("[bold]6. resume")
    summary_file = root / "resume-summary.json"
    resumed = _run(spec, "--summary-json", str(summary_file))
    console.print(resumed.stdout.rstrip())
    if resumed.returncode != 0:
        console.print(f"[red]resume failed: {resumed.stderr}")
        return 1
    s = json.loads(summary_file.read_text())
    run, total = s["this_run"], s["job_total"]
    again = run["already_committed"]
    console.print(
        f"this run: {run['results_written']:,} results written, {again['results']:,} "
        f"results (and {again['late_events']:,} late events, {again['bad_records']:,} "
        "bad records) found already committed by the killed run and not repeated; "
        f"the job in total: {total['results_written']:,} results, "
        f"{total['late_events']:,} late events, {total['bad_records']:,} bad records")

    console.rule("[bold]7. compare with the uninterrupted run")
    ok = True
    table = Table()
    for col in ("output", "reference", "crashed + corrupted + resumed", "duplicates", "equal"):
        table.add_column(col)
    for sub, ident in (("out", ("key", "window_start", "window_end")),
                       ("late", ("_partition", "_offset")),
                       ("errors", ("_partition", "_offset"))):
        want = _lines(root / "reference" / sub)
        got = _lines(root / "job" / sub)
        ids = [tuple(r[k] for k in ident) for r in got]
        dupes = len(ids) - len(set(ids))
        equal = _same(want, got, ident)
        ok = ok and equal and not dupes
        table.add_row(sub, f"{len(want):,}", f"{len(got):,}", str(dupes),
                      "[green]yes[/]" if equal else "[red]NO[/]")
    console.print(table)
    sample = sorted(_lines(root / "job" / "out"), key=lambda r: (r["window_start"], r["key"]))[:5]
    console.print("a few results:")
    for r in sample:
        console.print("  " + json.dumps(r))
    console.print(f"everything is under {root}; try: sealstream checkpoints list {ckpt}")
    if ok:
        console.print("[bold green]exactly once: the recovered job's output equals the "
                      "uninterrupted run[/]")
        return 0
    console.print("[bold red]outputs differ[/]")
    return 1


if __name__ == "__main__":
    sys.exit(main())
