"""Startup cost of the command line: how long a command that reads no data takes.

    python -m bench.startup [--repeat N]

Each command runs as a whole fresh process (``python -m sealstream ...``, and
``python -c "import ..."`` for the modules); the median of ``--repeat`` runs is
reported with the heavy libraries (Polars, PyArrow, NumPy) the process loaded.
The target is under 0.2 s for ``--version``, ``--help`` and ``checkpoints list
--help``. Prints a markdown table and writes it to ``bench/results/startup.md``.
``python -m bench`` runs it after the main benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
TARGET_S = 0.2
HEAVY = ("polars", "pyarrow", "numpy")

# each case: (label, python code run in the child); the child prints the heavy
# libraries it loaded as JSON on stderr's last line
_PROBE = ("import sys, json; sys.stdout.flush(); "
          "print(json.dumps([m for m in {heavy!r} if m in sys.modules]), file=sys.stderr)")
CASES: tuple[tuple[str, str], ...] = (
    ("sealstream --version", "from sealstream.cli import main; main(['--version'])"),
    ("sealstream --help", "from sealstream.cli import main; main(['--help'])"),
    ("sealstream checkpoints list --help",
     "from sealstream.cli import main; main(['checkpoints', 'list', '--help'])"),
    ("import sealstream", "import sealstream"),
    ("import sealstream.agents", "import sealstream.agents"),
)


def measure(code: str, repeat: int, env: dict[str, str]) -> tuple[float, list[str]]:
    """Median wall time of ``python -c code`` over ``repeat`` runs, and what it loaded."""
    full = code + "\n" + _PROBE.format(heavy=HEAVY)
    times: list[float] = []
    loaded: list[str] = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-c", full], env=env, capture_output=True,
                             text=True, check=True)
        times.append(time.perf_counter() - t0)
        loaded = json.loads(res.stderr.strip().splitlines()[-1])
    return statistics.median(times), loaded


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.startup")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    from bench.harness import compile_package

    compile_package()  # as an installed wheel is: start-up is not compiling the sources
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    rows = []
    for label, code in CASES:
        seconds, loaded = measure(code, max(1, args.repeat), env)
        rows.append(f"| `{label}` | {seconds:.3f} | {', '.join(loaded) or '-'} |")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    text = (
        f"# Startup (median of {max(1, args.repeat)} fresh processes; target "
        f"{TARGET_S} s for the CLI commands; load average {load})\n\n"
        "| command | seconds | heavy libraries loaded |\n| --- | ---: | --- |\n"
        + "\n".join(rows) + "\n"
    )
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "startup.md").write_text(text)
    return 0


def after_bench() -> int:
    """Run by ``python -m bench`` once the main benchmark succeeded (not for ``--list``)."""
    return 0 if "--list" in sys.argv[1:] else main([])


if __name__ == "__main__":
    raise SystemExit(main())
