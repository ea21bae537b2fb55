"""The benchmark harness behind ``python -m bench`` (see bench/README.md)."""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

STANDARD = {"events": 2_000_000, "keys": 10_000, "partitions": 3}
QUICK = {"events": 100_000, "keys": 1_000, "partitions": 3}


# --------------------------------------------------------------------------- measuring


@dataclass
class Run:
    """One whole-process measurement."""

    seconds: float
    max_rss_kb: int
    returncode: int
    summary: dict[str, Any] | None = None


# Runs inside a small fresh interpreter: spawns the measured command, waits for
# it with wait4 and writes {"seconds", "max_rss_kb", "returncode"} to argv[1].
_LAUNCHER = """
import json, os, sys, time
t0 = time.perf_counter()
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
seconds = time.perf_counter() - t0
with open(sys.argv[1], "w") as fh:
    json.dump({"seconds": seconds, "max_rss_kb": usage.ru_maxrss,
               "returncode": os.waitstatus_to_exitcode(status)}, fh)
"""


def measure(cmd: list[str], *, cwd: Path, env: dict[str, str], log: Path, timeout: float) -> Run:
    """Run ``cmd`` as a fresh process; its wall time and its own peak RSS.

    The command is spawned by a tiny launcher interpreter that times it and
    reads its ``wait4`` rusage: that is the resource usage of exactly that
    process (and the descendants it waited for), unlike the maximum over all
    children that ``getrusage(RUSAGE_CHILDREN)`` keeps. The launcher matters:
    Linux charges a child with the peak RSS of the address space it was
    forked (or vforked) from, so spawning straight from this harness - which
    holds the generated data's libraries in memory - would report at least the
    harness's own size. stdout/stderr go to ``log``; after ``timeout`` seconds
    the whole process group is killed.
    """
    stats = log.with_suffix(".rusage.json")
    stats.unlink(missing_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [PY, "-S", "-c", _LAUNCHER, str(stats), *cmd],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return Run(timeout, 0, -signal.SIGKILL)
    try:
        data = json.loads(stats.read_text())
    except (OSError, ValueError):
        return Run(0.0, 0, proc.returncode or -1)
    return Run(float(data["seconds"]), int(data["max_rss_kb"]), int(data["returncode"]))


def tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Workload:
    events: int
    keys: int
    partitions: int
    disorder_ms: int
    max_delay_ms: int
    size_ms: int
    checkpoint_every_ms: int
    seed: int

    def data_params(self) -> dict[str, Any]:
        from sealstream.testing.datagen import GENERATOR_VERSION

        return {
            "generator_version": GENERATOR_VERSION,
            "events": self.events,
            "keys": self.keys,
            "partitions": self.partitions,
            "fmt": "jsonl",
            "disorder_ms": self.disorder_ms,
            "seed": self.seed,
        }


def prepare_data(w: Workload, data_root: Path) -> list[Path]:
    """Generate the JSONL partitions once per parameter set (cached by their hash)."""
    from sealstream.testing.datagen import generate

    params = w.data_params()
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
    d = data_root / f"{w.events}ev-{w.keys}k-{w.partitions}p-{digest}"
    marker = d / "params.json"
    expected = [d / f"p{i}.jsonl" for i in range(w.partitions)]
    if marker.is_file() and all(p.is_file() for p in expected):
        print(f"data: reusing {d.relative_to(ROOT) if d.is_relative_to(ROOT) else d}")
    else:
        shutil.rmtree(d, ignore_errors=True)
        t0 = time.perf_counter()
        generate(
            d,
            events=w.events,
            keys=w.keys,
            partitions=w.partitions,
            disorder_ms=w.disorder_ms,
            seed=w.seed,
        )
        marker.write_text(json.dumps(params, indent=2) + "\n")
        print(f"data: generated {w.events:,} events into {d} in {time.perf_counter() - t0:.1f}s")
    for p in expected:  # warm the page cache so that no contender pays for the first read
        with p.open("rb") as fh:
            while fh.read(1 << 24):
                pass
    return expected


# --------------------------------------------------------------------------- contenders


@dataclass
class Config:
    name: str
    group: str  # "sealstream" | "one-shot" | "peer"
    description: str
    command: Callable[[Path], list[str]]  # workdir -> argv
    output: Callable[[Path], list[Path]]  # workdir -> result files after a run
    available: Callable[[], tuple[bool, str]]
    summary_path: Callable[[Path], Path | None] = lambda _w: None


@dataclass
class EngineInfo:
    ok: bool
    note: str
    summary_json: bool = False


def probe_engine(env: dict[str, str]) -> EngineInfo:
    """Is ``python -m sealstream run`` there, and does it take ``--summary-json``?"""
    try:
        r = subprocess.run(
            [PY, "-m", "sealstream", "run", "--help"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return EngineInfo(False, f"`python -m sealstream run --help` failed: {exc}")
    if r.returncode != 0:
        last = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        return EngineInfo(False, f"engine not available ({last[0][:160]})")
    return EngineInfo(True, "", "--summary-json" in r.stdout + r.stderr)


def sink_files(out_dir: Path) -> list[Path]:
    """Committed results of a jsonl sink: its *.jsonl files, not . or _ work in progress."""
    if not out_dir.is_dir():
        return []
    return sorted(
        p
        for p in out_dir.rglob("*.jsonl")
        if not any(part.startswith((".", "_")) for part in p.relative_to(out_dir).parts)
    )


def build_configs(
    w: Workload, files: list[Path], engine: EngineInfo, work_root: Path
) -> list[Config]:
    from sealstream.testing.datagen import write_spec

    def engine_available() -> tuple[bool, str]:
        return engine.ok, engine.note

    def sealstream_config(name: str, description: str, ckpt_ms: int | None) -> Config:
        spec_dir = work_root / name
        spec_dir.mkdir(parents=True, exist_ok=True)
        spec = write_spec(
            spec_dir / "spec.toml",
            paths=[p.resolve() for p in files],
            name="bench",
            max_delay_ms=w.max_delay_ms,
            window="tumbling",
            size_ms=w.size_ms,
            aggregates={"n": "count", "total": "sum(amount)"},
            sink="out",
            checkpoint="ckpt" if ckpt_ms else None,
            checkpoint_every_ms=ckpt_ms,
        )

        def command(wd: Path) -> list[str]:
            cmd = [PY, "-m", "sealstream", "run", str(spec)]
            if engine.summary_json:
                cmd += ["--summary-json", str(wd / "summary.json")]
            return cmd

        return Config(
            name=name,
            group="sealstream",
            description=description,
            command=command,
            output=lambda wd: sink_files(wd / "out"),
            available=engine_available,
            summary_path=lambda wd: wd / "summary.json" if engine.summary_json else None,
        )

    def one_shot(name: str, runner: str, module: str, group: str, description: str) -> Config:
        def command(wd: Path) -> list[str]:
            return [
                PY,
                "-m",
                "bench.runners",
                runner,
                "--out",
                str(wd / "out" / "result.jsonl"),
                "--size-ms",
                str(w.size_ms),
                "--max-delay-ms",
                str(w.max_delay_ms),
                *[str(p.resolve()) for p in files],
            ]

        def available() -> tuple[bool, str]:
            if importlib.util.find_spec(module) is None:
                return False, f"{module} is not installed in this venv"
            return True, ""

        return Config(
            name=name,
            group=group,
            description=description,
            command=command,
            output=lambda wd: [wd / "out" / "result.jsonl"],
            available=available,
        )

    return [
        sealstream_config("sealstream", "python -m sealstream run (no checkpoints)", None),
        sealstream_config(
            "sealstream-ckpt",
            f"python -m sealstream run, checkpoint every {w.checkpoint_every_ms} ms",
            w.checkpoint_every_ms,
        ),
        one_shot("polars", "polars", "polars", "one-shot", "polars scan_ndjson + group_by (batch)"),
        one_shot("duckdb", "duckdb", "duckdb", "one-shot", "duckdb read_ndjson + GROUP BY (batch)"),
        one_shot(
            "bytewax",
            "bytewax",
            "bytewax",
            "peer",
            "bytewax EventClock + TumblingWindower fold_window (streaming)",
        ),
    ]


# --------------------------------------------------------------------------- checking


def reference_results(files: list[Path], size_ms: int) -> Any:
    import polars as pl

    schema = {"user": pl.String, "ts": pl.Int64, "amount": pl.Float64}
    return (
        pl.scan_ndjson([str(p) for p in files], schema=schema)
        .group_by(pl.col("user").alias("key"), (pl.col("ts") // size_ms * size_ms).alias("ws"))
        .agg(n=pl.len().cast(pl.Int64), total=pl.col("amount").sum())
        .with_columns(we=pl.col("ws") + size_ms)
        .collect()
    )


def check_results(paths: list[Path], ref: Any) -> str:
    """'ok', or what differs from the batch reference (same windows, counts, sums)."""
    import polars as pl

    paths = [p for p in paths if p.is_file() and p.stat().st_size > 0]
    if not paths:
        return "no output" if ref.height else "ok"
    try:
        got = pl.concat(
            [pl.read_ndjson(p, infer_schema_length=None) for p in paths], how="diagonal_relaxed"
        ).select(
            pl.col("key").cast(pl.String),
            pl.col("window_start").cast(pl.Int64).alias("ws"),
            pl.col("window_end").cast(pl.Int64).alias("we"),
            pl.col("n").cast(pl.Int64).alias("n_got"),
            pl.col("total").cast(pl.Float64).alias("total_got"),
        )
    except Exception as exc:  # noqa: BLE001 - report, do not crash the benchmark
        return f"unreadable output ({type(exc).__name__}: {str(exc)[:100]})"
    dupes = got.height - got.unique(["key", "ws", "we"]).height
    joined = ref.join(got, on=["key", "ws", "we"], how="full", coalesce=True)
    missing = joined.filter(pl.col("n_got").is_null()).height
    extra = joined.filter(pl.col("n").is_null()).height
    tol = 1e-9 * pl.max_horizontal(pl.lit(1.0), pl.col("total").abs())
    wrong = joined.filter(
        pl.col("n").is_not_null()
        & pl.col("n_got").is_not_null()
        & ((pl.col("n") != pl.col("n_got")) | ((pl.col("total") - pl.col("total_got")).abs() > tol))
    ).height
    problems = [
        f"{k} {v}"
        for k, v in (("duplicate", dupes), ("missing", missing), ("extra", extra), ("wrong", wrong))
        if v
    ]
    return "ok" if not problems else "MISMATCH: " + ", ".join(problems)


# --------------------------------------------------------------------------- machine


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gb"] = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        info["cgroup_cpu_limit"] = "none" if quota == "max" else round(int(quota) / int(period), 2)
    except (OSError, ValueError):
        pass
    versions = {}
    for dist in ("sealstream", "polars", "duckdb", "numpy", "pyarrow", "bytewax"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    info["versions"] = versions
    return info


# --------------------------------------------------------------------------- reporting


@dataclass
class Result:
    name: str
    group: str
    description: str
    status: str  # "ok" | "skipped" | "failed"
    note: str = ""
    runs: list[Run] = field(default_factory=list)
    check: str = ""

    @property
    def median_s(self) -> float | None:
        return statistics.median(r.seconds for r in self.runs) if self.runs else None

    @property
    def peak_rss_mb(self) -> float | None:
        return max(r.max_rss_kb for r in self.runs) / 1024 if self.runs else None

    @property
    def summary(self) -> dict[str, Any] | None:
        for r in reversed(self.runs):
            if r.summary is not None:
                return r.summary
        return None


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _num(x: Any, spec: str = ",") -> str:
    return format(x, spec) if isinstance(x, int | float) and not isinstance(x, bool) else "-"


def _bytes(x: Any) -> str:
    if not isinstance(x, int | float) or isinstance(x, bool):
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if x >= scale:
            return f"{x / scale:.1f} {unit}"
    return f"{x:.0f} B"


def render_markdown(w: Workload, results: list[Result], mach: dict[str, Any], repeat: int) -> str:
    fastest = min(
        (r.median_s for r in results if r.group == "one-shot" and r.status == "ok" and r.runs),
        default=None,
    )
    lines = [
        "# sealstream benchmark",
        "",
        f"Workload: {w.events:,} events, {w.keys:,} keys (Zipf-like, skew 0.8), "
        f"{w.partitions} JSONL partitions, disorder <= {w.disorder_ms} ms, "
        f"tumbling {w.size_ms // 1000} s window, `n = count`, `total = sum(amount)`, "
        f"max_delay_ms = {w.max_delay_ms}. Whole-process wall time, median of {repeat}; "
        "peak RSS of the child process.",
        "",
        "| config | events | median s | events/s | peak RSS MB | vs fastest one-shot | check |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        if r.status != "ok":
            lines.append(f"| {r.name} | - | - | - | - | - | {r.status}: {r.note} |")
            continue
        med = r.median_s
        rate = w.events / med if med else None
        ratio = med / fastest if med and fastest else None
        lines.append(
            f"| {r.name} | {w.events:,} | {_fmt(med, '.2f')} | {_fmt(rate, ',.0f')} | "
            f"{_fmt(r.peak_rss_mb, '.0f')} | {_fmt(ratio, '.2f') + 'x' if ratio else '-'} | "
            f"{r.check} |"
        )
    summaries = [(r, r.summary) for r in results if r.group == "sealstream" and r.summary]
    if summaries:
        lines += [
            "",
            "Engine summaries (`--summary-json`, last run):",
            "",
            "| config | events | windows fired | late | bad | engine-reported s "
            "| checkpoints | mean ckpt ms | mean ckpt size |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r, s in summaries:
            ck = s.get("checkpoints") or {}
            n_ck = ck.get("count")
            lines.append(
                f"| {r.name} | {_num(s.get('events'))} | {_num(s.get('windows_fired'))} | "
                f"{_num(s.get('late_events'))} | {_num(s.get('bad_records'))} | "
                f"{_num(s.get('seconds'), '.2f')} | {_num(n_ck)} | "
                f"{_num(ck.get('mean_ms') if n_ck else None, '.1f')} | "
                f"{_bytes(ck.get('mean_bytes') if n_ck else None)} |"
            )
    lines += [
        "",
        "Runs (seconds): "
        + "; ".join(
            f"{r.name} " + ", ".join(f"{x.seconds:.2f}" for x in r.runs) for r in results if r.runs
        ),
        "",
    ]
    lines += [
        "Machine: "
        + ", ".join(
            f"{k} {mach[k]}"
            for k in ("cpu_model", "cpu_count", "cpus_usable", "memory_gb", "python", "platform")
            if k in mach
        )
        + f"; versions {mach.get('versions')}; "
        f"load average at start {mach.get('loadavg_at_start')}, "
        f"at end {mach.get('loadavg_at_end')}; "
        f"{mach['date']}.",
        "",
    ]
    notes = [f"- {r.name}: {r.note}" for r in results if r.note and r.status == "ok"]
    if notes:
        lines += ["Notes:", "", *notes, ""]
    return "\n".join(lines)


def write_chart(results: list[Result], path: Path) -> str:
    if importlib.util.find_spec("matplotlib") is None:
        return "no chart (matplotlib is not installed in the venv)"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        done = [r for r in results if r.runs and r.status == "ok"]
        fig, ax = plt.subplots(figsize=(7, 0.6 * len(done) + 1.5))
        ax.barh([r.name for r in done], [r.median_s or 0 for r in done])
        ax.set_xlabel("median wall time, s (lower is better)")
        ax.invert_yaxis()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return f"chart: {path}"
    except Exception as exc:  # noqa: BLE001 - the chart is optional
        return f"no chart ({type(exc).__name__}: {exc})"


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench",
        description="Whole-process benchmark of sealstream against one-shot batch group-bys.",
    )
    ap.add_argument("--events", type=int, help="default 2,000,000 (100,000 with --quick)")
    ap.add_argument("--keys", type=int, help="default 10,000 (1,000 with --quick)")
    ap.add_argument("--partitions", type=int, help="default 3")
    ap.add_argument(
        "--repeat", type=int, help="runs per config, median reported (default 3; 1 with --quick)"
    )
    ap.add_argument("--quick", action="store_true", help="small smoke run")
    ap.add_argument("--only", help="comma-separated config names (see --list)")
    ap.add_argument("--list", action="store_true", help="list the configs and exit")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--data-dir", type=Path, default=ROOT / "bench" / "data")
    ap.add_argument("--work-dir", type=Path, default=ROOT / "bench" / "work")
    ap.add_argument("--disorder-ms", type=int, default=800)
    ap.add_argument("--max-delay-ms", type=int, default=1_000)
    ap.add_argument("--window-ms", type=int, default=60_000)
    ap.add_argument("--checkpoint-every-ms", type=int, default=1_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1_800.0, help="seconds per run")
    ap.add_argument("--no-check", action="store_true", help="skip checking outputs")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = QUICK if args.quick else STANDARD
    w = Workload(
        events=args.events if args.events is not None else base["events"],
        keys=args.keys if args.keys is not None else base["keys"],
        partitions=args.partitions if args.partitions is not None else base["partitions"],
        disorder_ms=args.disorder_ms,
        max_delay_ms=args.max_delay_ms,
        size_ms=args.window_ms,
        checkpoint_every_ms=args.checkpoint_every_ms,
        seed=args.seed,
    )
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 3)
    if repeat < 1 or w.events < 1 or w.keys < 1 or w.partitions < 1:
        print("bench: --repeat, --events, --keys and --partitions must be >= 1", file=sys.stderr)
        return 2

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    env.setdefault("PYTHONHASHSEED", "0")

    engine = probe_engine(env)
    work_root = args.work_dir
    if args.list:
        files_stub = [args.data_dir / "p0.jsonl"]
        for c in build_configs(w, files_stub, engine, work_root):
            ok, note = c.available()
            print(f"{c.name:16} {c.group:10} {'available' if ok else 'skipped: ' + note}")
        return 0

    files = prepare_data(w, args.data_dir)
    configs = build_configs(w, files, engine, work_root)
    if args.only:
        wanted = [x.strip() for x in args.only.split(",") if x.strip()]
        unknown = sorted(set(wanted) - {c.name for c in configs})
        if unknown:
            names = ", ".join(c.name for c in configs)
            print(f"bench: unknown config {unknown[0]!r}; choose from {names}", file=sys.stderr)
            return 2
        configs = [c for c in configs if c.name in wanted]

    results: dict[str, Result] = {}
    active: list[Config] = []
    for c in configs:
        ok, note = c.available()
        results[c.name] = Result(c.name, c.group, c.description, "ok" if ok else "skipped", note)
        if ok:
            active.append(c)
        else:
            print(f"skip {c.name}: {note}")
    if engine.ok and not engine.summary_json:
        for name in ("sealstream", "sealstream-ckpt"):
            if name in results and results[name].status == "ok":
                results[name].note = "engine has no --summary-json; no summary figures"

    mach = machine()
    ref = None
    for rnd in range(repeat):  # interleaved rounds spread drift over every config
        for c in active:
            res = results[c.name]
            if res.status != "ok":
                continue
            wd = work_root / c.name
            for sub in ("out", "ckpt", "late", "errors"):
                shutil.rmtree(wd / sub, ignore_errors=True)
            wd.mkdir(parents=True, exist_ok=True)
            (wd / "summary.json").unlink(missing_ok=True)
            log = wd / f"run{rnd}.log"
            run = measure(c.command(wd), cwd=ROOT, env=env, log=log, timeout=args.timeout)
            if run.returncode != 0:
                res.status = "failed"
                why = "timeout" if run.returncode == -signal.SIGKILL else f"exit {run.returncode}"
                last = tail(log, 1).replace("|", "/")[:160]
                res.note = f"{why}: {last} (log: {log})"
                print(f"[{rnd + 1}/{repeat}] {c.name}: FAILED ({why}); see {log}\n{tail(log)}")
                continue
            sp = c.summary_path(wd)
            if sp is not None and sp.is_file():
                try:
                    run.summary = json.loads(sp.read_text())
                except (OSError, ValueError):
                    res.note = "unreadable --summary-json file"
            res.runs.append(run)
            print(
                f"[{rnd + 1}/{repeat}] {c.name:16} {run.seconds:7.2f}s "
                f"{run.max_rss_kb / 1024:7.0f} MB"
            )
            if rnd == repeat - 1 and not args.no_check:
                if ref is None:
                    ref = reference_results(files, w.size_ms)
                res.check = check_results(c.output(wd), ref)

    ordered = [results[c.name] for c in configs]
    mach["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    md = render_markdown(w, ordered, mach, repeat)
    args.out.mkdir(parents=True, exist_ok=True)
    chart_note = write_chart(ordered, args.out / "latest.png")
    md += f"\n{chart_note}.\n"
    (args.out / "latest.md").write_text(md)
    payload = {
        "workload": asdict(w),
        "repeat": repeat,
        "machine": mach,
        "results": [
            {
                "config": r.name,
                "group": r.group,
                "description": r.description,
                "status": r.status,
                "note": r.note,
                "check": r.check,
                "events": w.events,
                "median_s": r.median_s,
                "events_per_s": w.events / r.median_s if r.median_s else None,
                "peak_rss_mb": r.peak_rss_mb,
                "runs": [asdict(x) for x in r.runs],
                "summary": r.summary,
            }
            for r in ordered
        ],
    }
    (args.out / "latest.json").write_text(json.dumps(payload, indent=2) + "\n")
    print()
    print(md)
    print(f"written: {args.out / 'latest.md'}, {args.out / 'latest.json'}")
    return 1 if any(r.status == "failed" or r.check.startswith("MISMATCH") for r in ordered) else 0
