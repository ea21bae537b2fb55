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
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.report import Result, SweepPoint, ratios, render_markdown, write_chart

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
FLINK_ENV = "SEALSTREAM_BENCH_PYFLINK"


def flink_python() -> Path:
    """The Python with apache-flink: $SEALSTREAM_BENCH_PYFLINK, else bench/.flink-venv."""
    given = os.environ.get(FLINK_ENV)
    return Path(given) if given else ROOT / "bench" / ".flink-venv" / "bin" / "python"

STANDARD = {"events": 2_000_000, "keys": 10_000, "partitions": 3, "many_keys": 1_000_000}
QUICK = {"events": 100_000, "keys": 1_000, "partitions": 3, "many_keys": 100_000}


# --------------------------------------------------------------------------- measuring


@dataclass
class Run:
    """One whole-process measurement."""

    seconds: float
    max_rss_kb: int
    returncode: int
    summary: dict[str, Any] | None = None
    cpu_s: float = 0.0  # user + system time of the child (and what it waited for)

    @property
    def cpu_util(self) -> float | None:
        """CPU time over wall time: 1.0 is one core busy, 2.0 both of two."""
        return self.cpu_s / self.seconds if self.seconds > 0 else None


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
               "cpu_s": usage.ru_utime + usage.ru_stime,
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
    return Run(
        float(data["seconds"]),
        int(data["max_rss_kb"]),
        int(data["returncode"]),
        cpu_s=float(data.get("cpu_s", 0.0)),
    )


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
    slide_ms: int = 5_000
    gap_ms: int = 30_000
    many_keys: int = 1_000_000

    def data_params(self, events: int | None = None, keys: int | None = None) -> dict[str, Any]:
        from sealstream.testing.datagen import GENERATOR_VERSION

        return {
            "generator_version": GENERATOR_VERSION,
            "events": self.events if events is None else events,
            "keys": self.keys if keys is None else keys,
            "partitions": self.partitions,
            "fmt": "jsonl",
            "disorder_ms": self.disorder_ms,
            "seed": self.seed,
        }


def prepare_data(
    w: Workload, data_root: Path, *, events: int | None = None, keys: int | None = None
) -> list[Path]:
    """Generate the JSONL partitions once per parameter set (cached by their hash)."""
    from sealstream.testing.datagen import generate

    params = w.data_params(events, keys)
    n_ev, n_keys = params["events"], params["keys"]
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
    d = data_root / f"{n_ev}ev-{n_keys}k-{w.partitions}p-{digest}"
    marker = d / "params.json"
    expected = [d / f"p{i}.jsonl" for i in range(w.partitions)]
    if marker.is_file() and all(p.is_file() for p in expected):
        print(f"data: reusing {d.relative_to(ROOT) if d.is_relative_to(ROOT) else d}")
    else:
        shutil.rmtree(d, ignore_errors=True)
        t0 = time.perf_counter()
        generate(
            d,
            events=n_ev,
            keys=n_keys,
            partitions=w.partitions,
            disorder_ms=w.disorder_ms,
            seed=w.seed,
        )
        marker.write_text(json.dumps(params, indent=2) + "\n")
        print(f"data: generated {n_ev:,} events into {d} in {time.perf_counter() - t0:.1f}s")
    warm(expected)
    return expected


def warm(paths: list[Path]) -> None:
    """Read files once so that no contender pays for the first read (page cache)."""
    for p in paths:
        with p.open("rb") as fh:
            while fh.read(1 << 24):
                pass


def compile_package() -> None:
    """Byte-compile sealstream's sources, as ``pip install`` does for a wheel (and did
    for polars and duckdb): an editable checkout, or ``PYTHONDONTWRITEBYTECODE=1``,
    would otherwise make every sealstream process compile them again at start-up."""
    import compileall

    compileall.compile_dir(str(ROOT / "src" / "sealstream"), quiet=1)


def parquet_copy(files: list[Path]) -> list[Path]:
    """The same partitions as Parquet (same rows, same order: row index = line offset)."""
    import polars as pl

    out = []
    schema = {"user": pl.String, "ts": pl.Int64, "amount": pl.Float64}
    for src in files:
        dst = src.with_suffix(".parquet")
        if not dst.is_file() or dst.stat().st_mtime < src.stat().st_mtime:
            tmp = dst.with_suffix(".parquet.tmp")
            pl.read_ndjson(src, schema=schema).write_parquet(tmp, statistics=True)
            tmp.replace(dst)
        out.append(dst)
    warm(out)
    return out


# --------------------------------------------------------------------------- contenders


@dataclass
class Config:
    name: str
    group: str  # "sealstream" | "one-shot" | "peer" | "state"
    description: str
    command: Callable[[Path], list[str]]  # workdir -> argv
    output: Callable[[Path], list[Path]]  # workdir -> result files after a run
    available: Callable[[], tuple[bool, str]]
    summary_path: Callable[[Path], Path | None] = lambda _w: None
    kind: str = "tumbling"  # what the reference computes: tumbling | sliding | session | none
    data: str = "main"  # which input: main | many (keys) | a sweep label
    fmt: str = "jsonl"  # input format, also the one-shot peers it is compared with
    workdir: Path | None = None  # where it runs (default: the --work-dir/<name>)


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


def sealstream_config(
    w: Workload,
    engine: EngineInfo,
    work_root: Path,
    name: str,
    description: str,
    files: list[Path],
    *,
    kind: str = "tumbling",
    ckpt_ms: int | None = None,
    data: str = "main",
    keep: int | None = None,
) -> Config:
    """``python -m sealstream run`` over ``files`` with a ``kind`` window."""
    from sealstream.testing.datagen import write_spec

    spec_dir = work_root / name
    spec_dir.mkdir(parents=True, exist_ok=True)
    window: dict[str, Any] = {"size_ms": w.size_ms}
    if kind == "sliding":
        window["slide_ms"] = w.slide_ms
    if kind == "session":
        window = {"gap_ms": w.gap_ms}
    spec = write_spec(
        spec_dir / "spec.toml",
        paths=[p.resolve() for p in files],
        name="bench",
        max_delay_ms=w.max_delay_ms,
        window=kind,
        aggregates={"n": "count", "total": "sum(amount)"},
        sink="out",
        checkpoint="ckpt" if ckpt_ms else None,
        checkpoint_every_ms=ckpt_ms,
        checkpoint_keep=keep if ckpt_ms else None,
        **window,
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
        available=lambda: (engine.ok, engine.note),
        summary_path=lambda wd: wd / "summary.json" if engine.summary_json else None,
        kind=kind,
        data=data,
        fmt=files[0].suffix.lstrip(".") if files else "jsonl",
        workdir=spec_dir,
    )


def build_configs(
    w: Workload,
    files: list[Path],
    engine: EngineInfo,
    work_root: Path,
    parquet: list[Path] | None = None,
    many: list[Path] | None = None,
    peer: list[Path] | None = None,
) -> list[Config]:
    parquet = parquet if parquet is not None else [f.with_suffix(".parquet") for f in files]
    many = many if many is not None else files
    peer = peer if peer is not None else files

    def one_shot(
        name: str, runner: str, module: str, group: str, description: str, inputs: list[Path],
        extra: tuple[str, ...] = (), data: str = "main",
    ) -> Config:
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
                *[a.replace("{wd}", str(wd)) for a in extra],
                *[str(p.resolve()) for p in inputs],
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
            fmt=inputs[0].suffix.lstrip(".") if inputs else "jsonl",
            data=data,
        )

    def pyflink_config() -> Config:
        def command(wd: Path) -> list[str]:
            src = wd / "in"  # Flink's filesystem source reads a directory
            shutil.rmtree(src, ignore_errors=True)
            src.mkdir(parents=True)
            for p in files:
                (src / p.name).symlink_to(p.resolve())
            return [
                str(flink_python()),
                str(ROOT / "bench" / "pyflink_job.py"),
                "--in-dir", str(src),
                "--out", str(wd / "out"),
                "--size-ms", str(w.size_ms),
                "--max-delay-ms", str(w.max_delay_ms),
                "--parallelism", str(len(files)),
                "--checkpoint-ms", str(w.checkpoint_every_ms),
                "--checkpoint-dir", str(wd / "ckpt"),
            ]

        def output(wd: Path) -> list[Path]:
            out = wd / "out"
            return sorted(p for p in out.rglob("part-*") if p.is_file()) if out.is_dir() else []

        def available() -> tuple[bool, str]:
            py = flink_python()
            if not py.is_file():
                return False, f"no PyFlink Python at {py} (make bench-flink, or set {FLINK_ENV})"
            if shutil.which("java") is None:
                return False, "Flink needs Java 11+ on PATH"
            return True, ""

        return Config(
            name="pyflink",
            group="peer",
            description=(
                f"PyFlink SQL TUMBLE, streaming, watermark {w.max_delay_ms} ms, "
                f"{len(files)} readers, checkpoint every {w.checkpoint_every_ms} ms "
                "(the JVM is not in the CPU and RSS figures)"
            ),
            command=command,
            output=output,
            available=available,
        )

    def state_config() -> Config:
        def command(wd: Path) -> list[str]:
            return [PY, "-m", "bench.state", "--windows", str(w.many_keys),
                    "--out", str(wd / "summary.json"), "--work", str(wd / "ckpt")]

        return Config(
            name="state",
            group="state",
            description=f"bench.state: {w.many_keys:,} open windows, encode, restore",
            command=command,
            output=lambda _wd: [],
            available=lambda: (True, ""),
            summary_path=lambda wd: wd / "summary.json",
            kind="none",
        )

    ck = w.checkpoint_every_ms
    return [
        sealstream_config(w, engine, work_root, "sealstream",
                          "python -m sealstream run, JSONL, tumbling, no checkpoints", files),
        sealstream_config(w, engine, work_root, "sealstream-ckpt",
                          f"the same, checkpoint every {ck} ms", files, ckpt_ms=ck),
        sealstream_config(w, engine, work_root, "sealstream-parquet",
                          f"python -m sealstream run, Parquet input, tumbling, checkpoint every "
                          f"{ck} ms", parquet, ckpt_ms=ck),
        sealstream_config(
            w, engine, work_root, "sealstream-sliding",
            f"JSONL, sliding {w.size_ms // 1000} s / {w.slide_ms // 1000} s", files,
            kind="sliding",
        ),
        sealstream_config(w, engine, work_root, "sealstream-session",
                          f"JSONL, session gap {w.gap_ms // 1000} s", files, kind="session"),
        sealstream_config(
            w, engine, work_root, "sealstream-many-keys",
            f"JSONL, {w.many_keys:,} keys, tumbling, checkpoint every {ck} ms", many,
            ckpt_ms=ck, data="many", keep=100_000,
        ),
        one_shot("polars", "polars", "polars", "one-shot",
                 "polars scan_ndjson + group_by (batch)", files),
        one_shot("duckdb", "duckdb", "duckdb", "one-shot",
                 "duckdb read_ndjson + GROUP BY (batch)", files),
        one_shot("polars-parquet", "polars-parquet", "polars", "one-shot",
                 "polars scan_parquet + group_by (batch)", parquet),
        one_shot("duckdb-parquet", "duckdb-parquet", "duckdb", "one-shot",
                 "duckdb read_parquet + GROUP BY (batch)", parquet),
        one_shot(
            "bytewax", "bytewax", "bytewax", "peer",
            f"bytewax EventClock + TumblingWindower fold_window, recovery on, epoch {ck} ms",
            peer, extra=("--recovery-dir", "{wd}/ckpt", "--epoch-ms", str(ck)), data="peer",
        ),
        pyflink_config(),
        state_config(),
    ]


# --------------------------------------------------------------------------- checking


def reference_results(files: list[Path], w: Workload, kind: str = "tumbling") -> Any:
    """The batch answer: exact because the disorder stays below ``max_delay_ms``
    (nothing is late, and no session fires before its last event arrived)."""
    import polars as pl

    schema = {"user": pl.String, "ts": pl.Int64, "amount": pl.Float64}
    lf = pl.scan_ndjson([str(p) for p in files], schema=schema)
    agg = {"n": pl.len().cast(pl.Int64), "total": pl.col("amount").sum()}
    if kind == "session":
        gap = w.gap_ms
        sess = (
            lf.sort("user", "ts")
            .with_columns(
                new=(pl.col("ts") > pl.col("ts").shift(1).over("user") + gap).fill_null(True)
            )
            .with_columns(sid=pl.col("new").cum_sum())
        )
        return (
            sess.group_by(pl.col("user").alias("key"), "sid")
            .agg(ws=pl.col("ts").min(), we=pl.col("ts").max() + gap, **agg)
            .drop("sid")
            .collect()
        )
    slide = w.slide_ms if kind == "sliding" else w.size_ms
    base = pl.col("ts") // slide * slide
    copies = -(-w.size_ms // slide)
    frames = [
        lf.with_columns(ws=base - k * slide).filter(pl.col("ws") + w.size_ms > pl.col("ts"))
        for k in range(copies)
    ]
    return (
        pl.concat(frames)
        .group_by(pl.col("user").alias("key"), "ws")
        .agg(**agg)
        .with_columns(we=pl.col("ws") + w.size_ms)
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


def largest_checkpoint(ckpt_dir: Path) -> dict[str, int] | None:
    """Of the checkpoints kept in ``ckpt_dir``, the one with the most open windows:
    its state file's bytes and its open windows (from the manifests)."""
    best: dict[str, int] | None = None
    for m in ckpt_dir.glob("*/MANIFEST.json"):
        try:
            doc = json.loads(m.read_text())
            ow = int(doc["state"]["open_windows"])
            size = int(doc["files"]["state"]["bytes"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if best is None or ow > best["open_windows"]:
            best = {"open_windows": ow, "state_bytes": size, "id": int(doc.get("id", 0))}
    return best


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


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench",
        description="Whole-process benchmark of sealstream against one-shot batch group-bys.",
    )
    ap.add_argument("--events", type=int, help="default 2,000,000 (100,000 with --quick)")
    ap.add_argument("--keys", type=int, help="default 10,000 (1,000 with --quick)")
    ap.add_argument("--many-keys", type=int,
                    help="keys of the many-keys config and open windows of the state config "
                    "(default 1,000,000; 100,000 with --quick)")
    ap.add_argument("--partitions", type=int, help="default 3")
    ap.add_argument(
        "--repeat", type=int, help="runs per config, median reported (default 5; 1 with --quick)"
    )
    ap.add_argument("--peer-repeat", type=int, default=1,
                    help="runs of the streaming peers (bytewax), default 1: they are slow")
    ap.add_argument("--peer-events", type=int, default=100_000,
                    help="events of the streaming peers' input (default 100,000, at most "
                    "--events): bytewax with recovery runs at a few thousand events/s")
    ap.add_argument("--quick", action="store_true", help="small smoke run")
    ap.add_argument("--only", help="comma-separated config names (see --list)")
    ap.add_argument("--list", action="store_true", help="list the configs and exit")
    ap.add_argument("--no-sweep", action="store_true",
                    help="skip the sweeps over events, keys and checkpoint interval")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--data-dir", type=Path, default=ROOT / "bench" / "data")
    ap.add_argument("--work-dir", type=Path, default=ROOT / "bench" / "work")
    ap.add_argument("--disorder-ms", type=int, default=800)
    ap.add_argument("--max-delay-ms", type=int, default=1_000)
    ap.add_argument("--window-ms", type=int, default=60_000)
    ap.add_argument("--slide-ms", type=int, default=5_000)
    ap.add_argument("--gap-ms", type=int, default=30_000)
    ap.add_argument("--checkpoint-every-ms", type=int, default=1_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1_800.0, help="seconds per run")
    ap.add_argument("--no-check", action="store_true", help="skip checking outputs")
    return ap.parse_args(argv)


class Bench:
    """Runs configs, records results, checks outputs against cached references."""

    def __init__(self, w: Workload, args: argparse.Namespace, env: dict[str, str]) -> None:
        self.w, self.args, self.env = w, args, env
        self.refs: dict[tuple[str, str], Any] = {}
        self.inputs: dict[str, list[Path]] = {}

    def reference(self, data: str, kind: str) -> Any:
        if (data, kind) not in self.refs:
            self.refs[data, kind] = reference_results(self.inputs[data], self.w, kind)
        return self.refs[data, kind]

    def run_once(self, c: Config, res: Result, label: str, check: bool) -> None:
        wd = c.workdir or self.args.work_dir / c.name
        for sub in ("out", "ckpt", "late", "errors"):
            shutil.rmtree(wd / sub, ignore_errors=True)
        wd.mkdir(parents=True, exist_ok=True)
        (wd / "summary.json").unlink(missing_ok=True)
        log = wd / f"run-{label.replace('/', '-of-')}.log"
        run = measure(c.command(wd), cwd=ROOT, env=self.env, log=log, timeout=self.args.timeout)
        if run.returncode != 0:
            res.status = "failed"
            why = "timeout" if run.returncode == -signal.SIGKILL else f"exit {run.returncode}"
            last = tail(log, 1).replace("|", "/")[:160]
            res.note = f"{why}: {last} (log: {log})"
            print(f"[{label}] {c.name}: FAILED ({why}); see {log}\n{tail(log)}")
            return
        sp = c.summary_path(wd)
        if sp is not None and sp.is_file():
            try:
                run.summary = json.loads(sp.read_text())
            except (OSError, ValueError):
                res.note = "unreadable summary file"
        res.runs.append(run)
        util = run.cpu_util or 0.0
        print(
            f"[{label}] {c.name:22} {run.seconds:7.2f}s {run.max_rss_kb / 1024:7.0f} MB "
            f"cpu {util * 100:4.0f} %"
        )
        if c.data == "many":
            res.extra["largest_checkpoint"] = largest_checkpoint(wd / "ckpt")
        if check and not self.args.no_check and c.kind != "none" and c.data in self.inputs:
            res.check = check_results(c.output(wd), self.reference(c.data, c.kind))


def sweep_configs(
    w: Workload, bench: Bench, engine: EngineInfo, quick: bool
) -> list[tuple[str, int, Config, int, int]]:
    """(axis, value, config, events, keys) of the sweep points not in the main table."""
    out: list[tuple[str, int, Config, int, int]] = []
    root = bench.args.work_dir / "sweep"
    for frac in (8, 4, 2):
        n = max(1, w.events // frac)
        files = prepare_data(w, bench.args.data_dir, events=n)
        label = f"events-{n}"
        bench.inputs[label] = files
        c = sealstream_config(w, engine, root, label, f"{n:,} events", files, data=label)
        out.append(("events", n, c, n, w.keys))
    keys = sorted({1_000, 10_000, 100_000, w.many_keys} - {w.keys})
    for k in keys:
        if k == w.many_keys:
            files = bench.inputs["many"]
        else:
            files = prepare_data(w, bench.args.data_dir, keys=k)
        label = f"keys-{k}"
        bench.inputs[label] = files
        c = sealstream_config(w, engine, root, label, f"{k:,} keys", files, data=label)
        out.append(("keys", k, c, w.events, k))
    for ms in (5_000, 250, 100):
        if ms == w.checkpoint_every_ms:
            continue
        label = f"ckpt-{ms}"
        bench.inputs[label] = bench.inputs["main"]
        c = sealstream_config(w, engine, root, label, f"checkpoint every {ms} ms",
                              bench.inputs["main"], ckpt_ms=ms, data=label)
        out.append(("checkpoint_ms", ms, c, w.events, w.keys))
    return out


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
        slide_ms=args.slide_ms,
        gap_ms=args.gap_ms,
        many_keys=args.many_keys if args.many_keys is not None else base["many_keys"],
    )
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 5)
    if repeat < 1 or w.events < 1 or w.keys < 1 or w.partitions < 1 or w.many_keys < 1:
        print("bench: --repeat, --events, --keys, --many-keys and --partitions must be >= 1",
              file=sys.stderr)
        return 2

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    env.setdefault("PYTHONHASHSEED", "0")

    compile_package()
    engine = probe_engine(env)
    work_root = args.work_dir
    if args.list:
        files_stub = [args.data_dir / "p0.jsonl"]
        for c in build_configs(w, files_stub, engine, work_root):
            ok, note = c.available()
            print(f"{c.name:22} {c.group:10} {'available' if ok else 'skipped: ' + note}")
        return 0

    configs = build_configs(w, [args.data_dir / "p0.jsonl"], engine, work_root)
    names = [c.name for c in configs]
    wanted = names
    if args.only:
        wanted = [x.strip() for x in args.only.split(",") if x.strip()]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            print(f"bench: unknown config {unknown[0]!r}; choose from {', '.join(names)}",
                  file=sys.stderr)
            return 2
    bench = Bench(w, args, env)
    files = prepare_data(w, args.data_dir)
    bench.inputs["main"] = files
    parquet = parquet_copy(files) if any("parquet" in n for n in wanted) else None
    sweep = not args.no_sweep and not args.only
    many = (
        prepare_data(w, args.data_dir, keys=w.many_keys)
        if sweep or "sealstream-many-keys" in wanted
        else files
    )
    bench.inputs["many"] = many
    peer_events = min(w.events, args.peer_events)
    peer = files
    if "bytewax" in wanted and importlib.util.find_spec("bytewax") is not None:
        peer = prepare_data(w, args.data_dir, events=peer_events)
    bench.inputs["peer"] = peer
    configs = [
        c
        for c in build_configs(w, files, engine, work_root, parquet, many, peer)
        if c.name in wanted
    ]
    events_of = {"many": w.events, "main": w.events, "peer": peer_events}

    results: dict[str, Result] = {}
    active: list[Config] = []
    for c in configs:
        ok, note = c.available()
        res = Result(c.name, c.group, c.description, "ok" if ok else "skipped", note,
                     events=events_of.get(c.data, w.events), fmt=c.fmt, kind=c.kind)
        res.extra["keys"] = w.many_keys if c.data == "many" else w.keys
        results[c.name] = res
        if ok:
            active.append(c)
        else:
            print(f"skip {c.name}: {note}")

    mach = machine()
    for rnd in range(repeat):  # interleaved rounds spread drift over every config
        for c in active:
            res = results[c.name]
            rounds = args.peer_repeat if c.group == "peer" else repeat
            if res.status != "ok" or rnd >= rounds:
                continue
            last = rnd == min(rounds, repeat) - 1
            bench.run_once(c, res, f"{rnd + 1}/{rounds}", check=last)

    points: list[SweepPoint] = []
    if sweep:
        main_res = results.get("sealstream")
        ck_res = results.get("sealstream-ckpt")
        if main_res is not None:
            points.append(SweepPoint("events", w.events, main_res))
            points.append(SweepPoint("keys", w.keys, main_res))
            points.append(SweepPoint("checkpoint_ms", 0, main_res))
        if ck_res is not None:
            points.append(SweepPoint("checkpoint_ms", w.checkpoint_every_ms, ck_res))
        for axis, value, c, n_ev, n_keys in sweep_configs(w, bench, engine, args.quick):
            res = Result(c.name, c.group, c.description, "ok", events=n_ev, kind=c.kind)
            res.extra["keys"] = n_keys
            bench.run_once(c, res, "sweep", check=True)
            points.append(SweepPoint(axis, value, res))
        points.sort(key=lambda p: ({"events": 0, "keys": 1, "checkpoint_ms": 2}[p.axis], p.value))

    ordered = [results[c.name] for c in configs]
    mach["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    md = render_markdown(w, ordered, points, mach, repeat)
    args.out.mkdir(parents=True, exist_ok=True)
    chart_note = write_chart(ordered, points, args.out / "latest.png")
    md += f"\n{chart_note}.\n"
    (args.out / "latest.md").write_text(md)

    def as_json(r: Result) -> dict[str, Any]:
        return {
            "config": r.name,
            "group": r.group,
            "description": r.description,
            "status": r.status,
            "note": r.note,
            "check": r.check,
            "events": r.events,
            "input": r.fmt,
            "window": r.kind,
            "median_s": r.median_s,
            "events_per_s": r.rate,
            "median_rss_mb": r.median_rss_mb,
            "peak_rss_mb": r.peak_rss_mb,
            "cpu_util": r.cpu_util,
            "runs": [asdict(x) for x in r.runs],
            "summary": r.summary,
            "extra": r.extra,
        }

    payload = {
        "workload": asdict(w),
        "repeat": repeat,
        "machine": mach,
        "results": [as_json(r) for r in ordered],
        "ratios": ratios(ordered),
        "sweeps": [{"axis": p.axis, "value": p.value, **as_json(p.result)} for p in points],
    }
    (args.out / "latest.json").write_text(json.dumps(payload, indent=2) + "\n")
    print()
    print(md)
    print(f"written: {args.out / 'latest.md'}, {args.out / 'latest.json'}")
    bad = [*ordered, *(p.result for p in points)]
    return 1 if any(
        r.status == "failed" or (r.check.startswith("MISMATCH") and r.group != "peer") for r in bad
    ) else 0


def on_top(path: Path, lines: list[str], started: str) -> str:
    """The results file at ``path`` with this run (``lines``: title, blank, body) as a
    new section at its top: the earlier runs, and the analysis written beside them, are
    kept below it instead of overwritten."""
    new = [lines[0], "", f"## Run of {started}", "", *lines[2:]]
    old = path.read_text() if path.exists() else ""
    if old.startswith(lines[0]):
        old = old[len(lines[0]):].lstrip("\n")
    return "\n".join(new) + "\n" + ("\n" + old if old else "")
