"""Are the outputs byte-identical before and after a change? (bench workloads)

    python -m bench.same_output --before /path/to/old/src [--events N]

Runs the tumbling, sliding and session jobs of the benchmark (JSONL, 10,000 keys,
3 partitions, no checkpoint: one epoch, one result file) once with the sources under
``--before`` and once with this checkout's, and compares the SHA-256 of the result
files' bytes (concatenated in file-name order, i.e. epoch order). Float sums may
differ in their last bits between two runs of the same code (Polars sums a group in
parallel pieces), so a second digest rounds every float to 9 significant digits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work" / "same_output"


def digest(out: Path) -> tuple[str, int, str]:
    """SHA-256 of the bytes, line count, and SHA-256 with each float rounded to 9
    significant digits (a float sum's last bits vary from run to run of the same code:
    Polars adds a group's values in parallel pieces)."""
    h, r = hashlib.sha256(), hashlib.sha256()
    lines = 0
    for f in sorted(p for p in out.rglob("*") if p.is_file() and not p.name.startswith((".", "_"))):
        data = f.read_bytes()
        h.update(data)
        lines += data.count(b"\n")
        for line in data.splitlines():
            row = json.loads(line)
            r.update(json.dumps({k: float(f"{v:.9g}") if isinstance(v, float) else v
                                 for k, v in row.items()}).encode())
    return h.hexdigest(), lines, r.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.same_output")
    ap.add_argument("--before", type=Path, required=True, help="the old code's src directory")
    ap.add_argument("--after", type=Path, default=ROOT / "src",
                    help="the new code's src directory (default: this checkout's)")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--kinds", default="tumbling,sliding,session")
    args = ap.parse_args(argv)

    from sealstream.testing.datagen import generate, write_spec

    data = WORK / f"data-{args.events}"
    files = sorted(data.glob("p*.jsonl"))
    if len(files) != 3:
        files = generate(data, events=args.events, keys=10_000, partitions=3)
    windows = {"tumbling": {"size_ms": 60_000}, "sliding": {"size_ms": 60_000, "slide_ms": 5_000},
               "session": {"gap_ms": 30_000}}
    differ = 0
    for kind in args.kinds.split(","):
        got = {}
        for label, src in (("before", args.before.resolve()), ("after", args.after.resolve())):
            wd = WORK / f"{kind}-{label}"
            shutil.rmtree(wd, ignore_errors=True)
            wd.mkdir(parents=True)
            write_spec(wd / "spec.toml", paths=[p.resolve() for p in files], name="bench",
                       max_delay_ms=1000, window=kind,
                       aggregates={"n": "count", "total": "sum(amount)"}, sink="out",
                       **windows[kind])
            env = {**os.environ, "PYTHONPATH": str(src)}
            subprocess.run([sys.executable, "-m", "sealstream", "run", "spec.toml"], cwd=wd,
                           env=env, check=True, capture_output=True)
            got[label] = digest(wd / "out")
        same = got["before"][:2] == got["after"][:2]
        near = got["before"][1:] == got["after"][1:]
        differ += not near
        verdict = ("byte-identical" if same else "identical but for floats' last digits "
                   "(9 significant digits equal)" if near else "DIFFERENT")
        print(f"{kind}: before {got['before'][0][:16]} ({got['before'][1]:,} lines), "
              f"after {got['after'][0][:16]} ({got['after'][1]:,} lines): {verdict}",
              flush=True)
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
