"""Sampling profiles (py-spy) of three runs: Kafka -> files, JSONL tumbling, JSONL session.

    python -m bench.profiles [--events N] [--rate HZ] [--only kafka,tumbling,session]

Each run is ``sealstream run`` of the standard job (3 partitions, 10,000 keys,
``max_delay_ms = 1000``, checkpoint every second) under ``py-spy record --native``,
twice: once for the flame graph (``bench/results/profile-<name>.svg``) and once in
py-spy's collapsed-stack format, which this script sums into a table of where the
time goes: per step (planning, plan records, watermark bookkeeping, staging,
receipts, checkpoint work) apart from per event (parse, window operator, sink
encoding). Tables go to ``bench/results/profile-<name>.md``. The Kafka run uses a
local ``noida-db`` broker (``sealstream.testing.brokers``), stopped by its PID.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work" / "profile"
RESULTS = ROOT / "bench" / "results"

# Buckets, first match wins, tested against each frame of a stack from the leaf up:
# (label, per "step" or per "event", substrings of a frame "function (file:line)").
START = "import / start-up"
BUCKETS: list[tuple[str, str, tuple[str, ...]]] = [
    (START, "step", ("<frozen importlib", "_find_and_load")),
    ("receipts (Merkle tree)", "step", ("checkpoint/receipts.py", "checkpoint/_merkle")),
    ("checkpoint (snapshot, encode, sign, write)", "step",
     ("checkpoint/", "state/codec.py", "state/incremental.py")),
    ("plan records / planning", "step", ("_plan", "plan_record", "planning")),
    ("watermark bookkeeping", "step", ("watermark", "_wm")),
    ("staging", "step", ("stage", "staging")),
    ("sink encode + write", "event", ("sinks/",)),
    ("window operator (assign, merge, fire)", "event",
     ("windows/operator.py", "windows/aggregates.py", "windows/")),
    ("parse (JSON -> typed columns)", "event", (
        "sources/_parse.py", "sources/_live.py", "read_ndjson", "json")),
    ("Kafka fetch (client + decode)", "event", ("sources/kafka.py", "sources/_kafka_log.py",
                                                "sources/_kafka_prefetch.py",
                                                "confluent_kafka", "librdkafka", "rdkafka")),
    ("NATS fetch", "event", ("sources/nats.py",)),
    ("file read", "event", ("sources/",)),
    ("engine loop (other)", "step", ("_runtime/",)),
    ("CLI / spec", "step", ("cli/", "pipeline/")),
]


def classify(stack: list[str]) -> str:
    """The bucket of one collapsed stack (frames root first)."""
    for frame in reversed(stack):
        for label, _kind, needles in BUCKETS:
            if any(n in frame for n in needles):
                return label
    return "native threads without a Python frame (Polars/Rayon pool, librdkafka)"


def thread_of(stack: list[str]) -> str:
    head = stack[0] if stack else ""
    if "MainThread" in head or "main" in head.lower():
        return "main"
    return "other threads"


def summarise(raw: Path) -> tuple[int, Counter[str], Counter[str], Counter[str]]:
    total = 0
    by_bucket: Counter[str] = Counter()
    by_thread: Counter[str] = Counter()
    by_leaf_fn: Counter[str] = Counter()
    for line in raw.read_text(errors="replace").splitlines():
        stack_text, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        n = int(count_text)
        stack = stack_text.split(";")
        total += n
        by_bucket[classify(stack)] += n
        by_thread[thread_of(stack)] += n
        # the innermost sealstream frame, to name the function under each bucket
        inner = next((f for f in reversed(stack) if "sealstream/" in f), stack[-1])
        by_leaf_fn[inner.split(" (")[0] + " (" + inner.rsplit("/", 1)[-1]] += n
    return total, by_bucket, by_thread, by_leaf_fn


def plain_run(cmd: list[str], cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """The same run without the profiler: wall time against the engine's own figures
    (what lies outside ``seconds`` is start-up: imports, spec, opening the store)."""
    for sub in ("out", "ckpt"):
        shutil.rmtree(cwd / sub, ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run([*cmd, "--summary-json", "plain.json"], cwd=cwd, env=env, check=True,
                   capture_output=True)
    wall = time.perf_counter() - t0
    s = json.loads((cwd / "plain.json").read_text())
    ck = s.get("checkpoints") or {}
    return {"wall_s": wall, "engine_s": float(s["seconds"]), "events": int(s["events"]),
            "checkpoints": int(ck.get("count") or 0),
            "ckpt_mean_ms": float(ck.get("mean_ms") or 0.0),
            "ckpt_blocking_ms": float(ck.get("mean_blocking_ms") or 0.0)}


def record(name: str, cmd: list[str], cwd: Path, env: dict[str, str], rate: int) -> Path:
    spy = str(Path(sys.executable).with_name("py-spy"))
    svg = RESULTS / f"profile-{name}.svg"
    raw = WORK / f"{name}.collapsed"
    for fmt, out in (("flamegraph", svg), ("raw", raw)):
        for sub in ("out", "ckpt"):  # a fresh job each time, not a resumed one
            shutil.rmtree(cwd / sub, ignore_errors=True)
        subprocess.run([spy, "record", "--native", "--threads", "--rate", str(rate),
                        "--format", fmt, "-o", str(out), "--", *cmd],
                       cwd=cwd, env=env, check=True, capture_output=True)
    return raw


def write_table(name: str, title: str, raw: Path, extra: str, plain: dict[str, Any]) -> None:
    total_all, buckets, threads, fns = summarise(raw)
    start = buckets.pop(START, 0)
    total = total_all - start
    kinds = {label: kind for label, kind, _ in BUCKETS}
    ck = plain["checkpoints"]
    lines = [f"# Profile: {title}", "", extra, "",
             "Without the profiler (same spec, one run): "
             f"wall {plain['wall_s']:.2f} s, of which the engine's own time "
             f"{plain['engine_s']:.2f} s ({plain['events'] / plain['engine_s']:,.0f} events/s) "
             f"and start-up (imports, spec, store) {plain['wall_s'] - plain['engine_s']:.2f} s; "
             f"{ck} checkpoint(s), mean {plain['ckpt_mean_ms']:.0f} ms, of which "
             f"{plain['ckpt_blocking_ms']:.0f} ms on the main thread.", "",
             f"py-spy record --native --threads (samples: {total_all:,}); flame graph: "
             f"[profile-{name}.svg](profile-{name}.svg). Start-up (imports) took "
             f"{start:,} samples: under py-spy importing is many times slower than without "
             "(each sample stops the process; the import stacks are deep), so it is left out "
             "of the shares below and measured without the profiler (above). Shares of the "
             "other samples of all threads (a sample is one thread seen on CPU; idle threads "
             "are not sampled).", "",
             "| where | per step / per event | samples | share |", "| --- | --- | ---: | ---: |"]
    for label, n in buckets.most_common():
        lines.append(f"| {label} | {kinds.get(label, '-')} | {n:,} | {n / total:.1%} |")
    step = sum(n for b, n in buckets.items() if kinds.get(b) == "step")
    event = sum(n for b, n in buckets.items() if kinds.get(b) == "event")
    lines += ["", f"Per-step work: {step / total:.1%}; per-event work: {event / total:.1%}.",
              "", "| thread | share |", "| --- | ---: |"]
    for label, n in threads.most_common():
        lines.append(f"| {label} | {n / total_all:.1%} |")
    lines += ["", "Innermost sealstream function of each sample, top 25:", "",
              "| function | share |", "| --- | ---: |"]
    for fn, n in fns.most_common(25):
        if fn.startswith("<module>"):
            continue
        lines.append(f"| `{fn}` | {n / total:.1%} |")
    (RESULTS / f"profile-{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profiles")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--only", default="kafka,tumbling,session")
    ap.add_argument("--src", type=Path, default=ROOT / "src",
                    help="the sealstream sources to profile (default: this checkout's)")
    args = ap.parse_args(argv)
    wanted = set(args.only.split(","))

    from bench.live import produce_files
    from sealstream.testing.brokers import KafkaBroker, create_topic
    from sealstream.testing.datagen import generate, write_spec
    from sealstream.testing.specs import spec_text

    WORK.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = WORK / f"data-{args.events}-{args.keys}"
    files = sorted(data.glob("p*.jsonl"))
    if len(files) != 3:
        files = generate(data, events=args.events, keys=args.keys, partitions=3)
    env = {**os.environ, "PYTHONPATH": str(args.src.resolve())}
    py = [sys.executable, "-m", "sealstream", "run", "spec.toml"]
    load = os.getloadavg()
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    common = (f"{args.events:,} events, {args.keys:,} keys, 3 partitions, checkpoint every "
              f"second; {when}, load average {load[0]:.2f} (2 cores shared).")

    for kind, window in (("tumbling", {"size_ms": 60_000}), ("session", {"gap_ms": 30_000})):
        if kind not in wanted:
            continue
        wd = WORK / kind
        shutil.rmtree(wd, ignore_errors=True)
        wd.mkdir(parents=True)
        write_spec(wd / "spec.toml", paths=[p.resolve() for p in files], name="bench",
                   max_delay_ms=1000, window=kind,
                   aggregates={"n": "count", "total": "sum(amount)"}, sink="out",
                   checkpoint="ckpt", checkpoint_every_ms=1000, **window)
        plain = plain_run(py, wd, env)
        raw = record(kind, py, wd, env, args.rate)
        write_table(kind, f"JSONL, {kind} window, `sealstream run`", raw, common, plain)

    if "kafka" in wanted:
        broker = KafkaBroker(data_dir=WORK / "broker")
        broker.start()
        try:
            topic = f"profile-{int(time.time())}"
            create_topic(broker.bootstrap, topic, 3)
            produce_files(broker.bootstrap, topic, files)
            wd = WORK / "kafka"
            shutil.rmtree(wd, ignore_errors=True)
            wd.mkdir(parents=True)
            source = (f'kind = "kafka"\nbootstrap = "{broker.bootstrap}"\ntopic = "{topic}"\n'
                      'stop = "end"')
            (wd / "spec.toml").write_text(spec_text("profile", source, every_ms=1000))
            plain = plain_run(py, wd, env)
            raw = record("kafka", py, wd, env, args.rate)
        finally:
            broker.stop()
        write_table("kafka", "Kafka -> files (noida-db, 3 partitions), tumbling 60 s, "
                    "`stop = \"end\"`", raw, common, plain)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
