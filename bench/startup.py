"""Startup cost of the command line: how long a command that reads no data takes.

    python -m bench.startup [--repeat N] [--before OLD_SRC]

Each command runs as a whole fresh process (``python -m sealstream ...``, and
``python -c "import ..."`` for the modules); the median of ``--repeat`` runs is
reported (wall seconds, and CPU seconds: user + system of the process) with the
heavy libraries (Polars, PyArrow, NumPy, cryptography) the process loaded. The
target is under 0.2 s for ``--version``, ``--help`` and ``checkpoints list
--help``. ``sealstream run`` of a small JSONL -> JSONL job with a checkpoint (1,000
events) is measured too: its time is almost all start-up. With ``--before``, the
sources under OLD_SRC run too, alternating with this checkout's, run by run.
Prints a markdown table and writes it to ``bench/results/startup.md`` (the text
below the table, the analysis, is kept). ``python -m bench`` runs it after the
main benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
TARGET_S = 0.2
HEAVY = ("polars", "pyarrow", "numpy", "cryptography")
WORK = ROOT / "bench" / "work" / "startup"
RUN_LABEL = "sealstream run (1,000 events, JSONL -> JSONL, checkpoint)"

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
    ("import sealstream.cli, sealstream._runtime.engine",
     "import sealstream.cli, sealstream._runtime.engine"),
    (RUN_LABEL, "import shutil; shutil.rmtree('out', True); shutil.rmtree('ckpt', True)\n"
                "from sealstream.cli import main\n"
                "assert main(['run', 'job.toml', '--quiet']) == 0"),
)


def once(code: str, env: dict[str, str]) -> tuple[float, float, list[str]]:
    """One ``python -c code`` process: wall seconds, CPU seconds, what it loaded."""
    full = code + "\n" + _PROBE.format(heavy=HEAVY)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", full], env=env, capture_output=True,
                         text=True, check=True, cwd=WORK)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(res.stderr.strip().splitlines()[-1])


def _env(src: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEALSTREAM_")}
    env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _small_job() -> None:
    from sealstream.testing.datagen import generate, write_spec

    WORK.mkdir(parents=True, exist_ok=True)
    paths = generate(WORK / "in", events=1_000, keys=50, partitions=2)
    write_spec(WORK / "job.toml", paths=paths, checkpoint="ckpt", sink="out")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.startup")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--before", type=Path, help="the old code's src directory")
    args = ap.parse_args(argv)
    from bench.harness import compile_package

    compile_package()  # as an installed wheel is: start-up is not compiling the sources
    if args.before is not None:
        import compileall

        compileall.compile_dir(str(args.before.resolve() / "sealstream"), quiet=1)
    _small_job()
    srcs = {"now": ROOT / "src"}
    if args.before is not None:
        srcs = {"before": args.before.resolve(), **srcs}
    repeat = max(1, args.repeat)
    load_before = os.getloadavg()
    rows = []
    for label, code in CASES:
        walls: dict[str, list[float]] = {k: [] for k in srcs}
        cpus: dict[str, list[float]] = {k: [] for k in srcs}
        loaded: dict[str, list[str]] = {}
        for _ in range(repeat):
            for name, src in srcs.items():  # alternating
                wall, cpu, loaded[name] = once(code, _env(src))
                walls[name].append(wall)
                cpus[name].append(cpu)
        cells = [f"{statistics.median(walls[k]):.3f} / {statistics.median(cpus[k]):.3f}"
                 for k in srcs]
        rows.append(f"| `{label}` | {' | '.join(cells)} | {', '.join(loaded['now']) or '-'} |")
    load_after = os.getloadavg()
    heads = " | ".join(f"{k}: wall s / CPU s" for k in srcs)
    text = (
        f"# Startup (median of {repeat} fresh processes; target "
        f"{TARGET_S} s for the CLI commands; load average (1 min) {load_before[0]:.1f} at "
        f"the start, {load_after[0]:.1f} at the end)\n\n"
        f"`python -m bench.startup{' --before ' + str(args.before) if args.before else ''}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; runs alternating."
        "\n\n"
        f"| command | {heads} | heavy libraries loaded (now) |\n"
        f"| --- | {' | '.join('---:' for _ in srcs)} | --- |\n"
        + "\n".join(rows) + "\n"
    )
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "startup.md"
    old = out.read_text() if out.exists() else ""
    marker = "\n## "  # the analysis below the table (written by hand) is kept
    kept = old[old.index(marker):] if marker in old else ""
    out.write_text(text + kept)
    return 0


def after_bench() -> int:
    """Run by ``python -m bench`` once the main benchmark succeeded (not for ``--list``)."""
    return 0 if "--list" in sys.argv[1:] else main([])


if __name__ == "__main__":
    raise SystemExit(main())
