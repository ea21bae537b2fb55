"""Batch path side by side: sealstream (before / after a change) against one-shot Polars.

    python -m bench.speed [--before OLD_SRC] [--events N] [--repeat N]
    python -m bench.speed --kafka [--before OLD_SRC] [--events N] [--repeat N]

The benchmark's workload (JSONL, 3 partitions, 10,000 keys, ``max_delay_ms = 1000``),
for each window (tumbling 60 s, session gap 30 s, sliding 60 s / 5 s): whole-process
runs alternating in one loop (sealstream with the sources under ``--before`` when
given, sealstream with this checkout's, the one-shot Polars query of
``bench.runners``), median of ``--repeat``; the tumbling job also with a checkpoint
every second. The rates are events over whole-process wall time (imports included,
for every contender). Results: ``bench/results/speed-batch.md`` (a new section on top of the
earlier runs) and ``.json``, with
the date and the load average (the machine is shared: ratios matter).

``--kafka``: the live path instead. The same events produced into a 3-partition
topic of a local ``noida-db`` broker (stopped by its PID); in one loop, alternating,
the confluent-kafka fetch-only loop of ``bench.live`` (the comparator), then
``sealstream run`` (``stop = "end"``, checkpoint every second) with the sources
under ``--before``, with this checkout's, and with this checkout's reading ahead
(``SEALSTREAM_KAFKA_PREFETCH=1``), and this checkout's writing its results
exactly once into a fresh 3-partition topic (Kafka -> Kafka, the sink's
transactions; target >= 85 % of Kafka -> files); the runs' rate is their summary's
(events over the engine's time, start-up left out, as ``bench.live``). Results:
``bench/results/speed-kafka.md`` and ``.json`` (target: the run >= 0.7x the loop).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.harness import Workload, measure, on_top, prepare_data

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work" / "speed"
RESULTS = ROOT / "bench" / "results"
TARGETS = {"tumbling": 0.6, "session": 0.6, "sliding": 0.9}
WINDOWS: dict[str, dict[str, int]] = {
    "tumbling": {"size_ms": 60_000},
    "session": {"gap_ms": 30_000},
    "sliding": {"size_ms": 60_000, "slide_ms": 5_000},
}


def spec(kind: str, files: list[Path], ckpt: bool) -> Path:
    from sealstream.testing.datagen import write_spec

    wd = WORK / f"{kind}{'-ckpt' if ckpt else ''}"
    wd.mkdir(parents=True, exist_ok=True)
    return write_spec(wd / "spec.toml", paths=[p.resolve() for p in files], name="bench",
                      max_delay_ms=1000, window=kind,
                      aggregates={"n": "count", "total": "sum(amount)"}, sink="out",
                      checkpoint="ckpt" if ckpt else None,
                      checkpoint_every_ms=1000 if ckpt else None, **WINDOWS[kind])


#: CPU seconds (user + system of the process and what it waited for) of every run,
#: by contender, beside the wall seconds: on a loaded machine they compare better
CPU: dict[str, list[float]] = {}
_last_cpu: list[float] = [0.0]


def run_sealstream(path: Path, src: Path) -> float:
    wd = path.parent
    for sub in ("out", "ckpt"):
        shutil.rmtree(wd / sub, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(src)}
    r = measure([sys.executable, "-m", "sealstream", "run", str(path)], cwd=wd, env=env,
                log=wd / "run.log", timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"sealstream run failed: {(wd / 'run.log').read_text()[-400:]}")
    _last_cpu[0] = r.cpu_s
    return r.seconds


def run_polars(kind: str, files: list[Path]) -> float:
    wd = WORK / f"polars-{kind}"
    wd.mkdir(parents=True, exist_ok=True)
    runner = {"tumbling": "polars", "session": "polars-session",
              "sliding": "polars-sliding"}[kind]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = measure([sys.executable, "-m", "bench.runners", runner, "--out", str(wd / "out.jsonl"),
                 *[str(p) for p in files]], cwd=ROOT, env=env, log=wd / "run.log",
                timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"{runner} failed: {(wd / 'run.log').read_text()[-400:]}")
    _last_cpu[0] = r.cpu_s
    return r.seconds


def run_kafka(wd: Path, src: Path, bootstrap: str, topic: str, events: int,
              prefetch: int = 0, out_topic: str | None = None) -> tuple[float, float]:
    """``sealstream run`` of the standard job on ``topic`` with the sources under
    ``src``: events/s of its summary (events over the engine's time), and the CPU
    seconds of the whole process (user + system, every thread, start-up included).
    ``out_topic``: the results go exactly once into that topic (Kafka -> Kafka)
    instead of files."""
    from sealstream.testing.specs import JSONL_OUT, spec_text

    for sub in ("out", "ckpt"):
        shutil.rmtree(wd / sub, ignore_errors=True)
    wd.mkdir(parents=True, exist_ok=True)
    toml = f'kind = "kafka"\nbootstrap = "{bootstrap}"\ntopic = "{topic}"\nstop = "end"'
    sink = JSONL_OUT if out_topic is None else (
        f'kind = "kafka"\nbootstrap = "{bootstrap}"\ntopic = "{out_topic}"')
    (wd / "spec.toml").write_text(spec_text("live_bench", toml, sink=sink, every_ms=1000))
    env = {**os.environ, "PYTHONPATH": str(src), "SEALSTREAM_KAFKA_PREFETCH": str(prefetch)}
    r = measure([sys.executable, "-m", "sealstream", "run", "spec.toml", "--summary-json",
                 "summary.json"], cwd=wd, env=env, log=wd / "run.log", timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"sealstream run failed: {(wd / 'run.log').read_text()[-400:]}")
    summary = json.loads((wd / "summary.json").read_text())
    return events / max(float(summary["seconds"]), 1e-9), r.cpu_s


def fetch_only_cpu(bootstrap: str, topic: str) -> tuple[float, float]:
    """The fetch-only loop of ``bench.live``: events/s and its CPU seconds (this
    process's user + system time over the loop, librdkafka's threads included)."""
    import resource

    from bench.live import fetch_only

    before = resource.getrusage(resource.RUSAGE_SELF)
    n, secs = fetch_only(bootstrap, topic, 3)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return n / secs, cpu


def kafka_main(args: argparse.Namespace) -> int:
    from bench.live import produce_files
    from sealstream.testing.brokers import KafkaBroker, create_topic

    w = Workload(events=args.events, keys=10_000, partitions=3, disorder_ms=800,
                 max_delay_ms=1000, size_ms=60_000, checkpoint_every_ms=1000, seed=0)
    files = prepare_data(w, ROOT / "bench" / "data")
    wk = WORK / "kafka"
    shutil.rmtree(wk / "broker", ignore_errors=True)
    broker = KafkaBroker(data_dir=wk / "broker")
    broker.start()
    load_before = os.getloadavg()
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    rates: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    try:
        topic = f"speed-{args.events}"
        create_topic(broker.bootstrap, topic, 3)
        produced = produce_files(broker.bootstrap, topic, files)
        # the CPU a run spends without events (imports, spec, store, clients, exit):
        # subtracted from each run's CPU to compare the engine's with the loop's
        empty = f"speed-empty-{args.events}"
        create_topic(broker.bootstrap, empty, 3)
        idle_cpu = statistics.median(
            run_kafka(wk / "empty", ROOT / "src", broker.bootstrap, empty, 1)[1]
            for _ in range(args.repeat))
        contenders: list[tuple[str, Any]] = [
            ("fetch-only loop", lambda: fetch_only_cpu(broker.bootstrap, topic))]
        if args.before is not None:
            contenders.append(("sealstream before", lambda: run_kafka(
                wk / "before", args.before.resolve(), broker.bootstrap, topic, produced)))
        contenders.append(("sealstream now", lambda: run_kafka(
            wk / "after", ROOT / "src", broker.bootstrap, topic, produced)))
        contenders.append(("sealstream now, read-ahead on", lambda: run_kafka(
            wk / "ahead", ROOT / "src", broker.bootstrap, topic, produced, prefetch=1)))
        out_topics: list[str] = []

        def kafka_to_kafka() -> tuple[float, float]:
            out_topics.append(f"{topic}-out-{len(out_topics)}")  # a fresh topic per run
            create_topic(broker.bootstrap, out_topics[-1], 3)
            return run_kafka(wk / "k2k", ROOT / "src", broker.bootstrap, topic, produced,
                             out_topic=out_topics[-1])

        contenders.append(("sealstream now, Kafka -> Kafka", kafka_to_kafka))
        for i in range(args.repeat):
            for name, fn in contenders:
                rate, cpu = fn()
                if name != "fetch-only loop":
                    cpu = max(0.0, cpu - idle_cpu)
                rates.setdefault(name, []).append(rate)
                cpus.setdefault(name, []).append(cpu)
                print(f"[{i + 1}/{args.repeat}] {name}: {rate:,.0f} events/s, "
                      f"{cpu:.2f} CPU s", flush=True)
    finally:
        broker.stop()
    load_after = os.getloadavg()
    med = {k: statistics.median(v) for k, v in rates.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpus.items()}
    loop = med["fetch-only loop"]
    loop_cpu = cpu_med["fetch-only loop"]
    lines = [
        "# Live path: Kafka -> files against the fetch-only loop (side by side)",
        "",
        f"`python -m bench.speed --kafka`, {started}: {produced:,} events (3 partitions, "
        "10,000 keys) in a local noida-db topic; tumbling 60 s, checkpoint every second, "
        f"`stop = \"end\"`; alternating, median of {args.repeat}. Load average (1 min) "
        f"{load_before[0]:.2f} at the start, {load_after[0]:.2f} at the end (2 cores, "
        "shared). The runs' rate is their summary's (events over the engine's time).",
        f"CPU: user + system seconds of every thread (the loop's over the loop; a run's "
        f"whole process less {idle_cpu:.2f} s, the median CPU of the same run on an "
        "empty topic: start-up and exit). The CPU ratio (loop CPU / contender CPU) is "
        "the work each does per event, whatever the load: on a loaded machine, where "
        "every CPU second is contended, the rate ratio tends to it; on an idle one the "
        "run's threads can do better than it by working in parallel.",
        "",
        "| reader | events/s (median) | vs fetch-only loop | CPU s (median) | "
        "CPU ratio | runs, events/s |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, v in rates.items():
        lines.append(f"| {name} | {med[name]:,.0f} | {med[name] / loop:.2f} | "
                     f"{cpu_med[name]:.2f} | {loop_cpu / max(cpu_med[name], 1e-9):.2f} | "
                     f"{', '.join(f'{x:,.0f}' for x in v)} |")
    now = med["sealstream now"] / loop
    k2k = med["sealstream now, Kafka -> Kafka"] / med["sealstream now"]
    lines += ["", f"Target: the run >= 0.7x the fetch-only loop: "
              f"{'met' if now >= 0.7 else 'NOT met'} ({now:.3f}x).",
              f"Target: Kafka -> Kafka >= 85 % of Kafka -> files (same code, same run): "
              f"{'met' if k2k >= 0.85 else 'NOT met'} ({k2k:.0%})."]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speed-kafka.md").write_text(on_top(args.out / "speed-kafka.md", lines,
                                                     started))
    (args.out / "speed-kafka.json").write_text(json.dumps(
        {"started": started, "events": produced, "load": [load_before, load_after],
         "rates": rates, "median": med, "cpu_s": cpus, "idle_cpu_s": idle_cpu},
        indent=2) + "\n")
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.speed")
    ap.add_argument("--before", type=Path, help="the old code's src directory")
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kinds", default="tumbling,session,sliding")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--kafka", action="store_true",
                    help="the live path: Kafka -> files against the fetch-only loop")
    args = ap.parse_args(argv)
    if args.before is not None:  # the old code too, as installed (this checkout's: bench/__init__)
        import compileall

        compileall.compile_dir(str(args.before.resolve() / "sealstream"), quiet=1)
    if args.kafka:
        return kafka_main(args)

    w = Workload(events=args.events, keys=10_000, partitions=3, disorder_ms=800,
                 max_delay_ms=1000, size_ms=60_000, checkpoint_every_ms=1000, seed=0)
    files = prepare_data(w, ROOT / "bench" / "data")
    after = ROOT / "src"
    load_before = os.getloadavg()
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    times: dict[str, list[float]] = {}
    kinds = args.kinds.split(",")
    for i in range(args.repeat):
        for kind in kinds:
            contenders: list[tuple[str, Any]] = []
            if args.before is not None:
                contenders.append((f"{kind}/before",
                                   lambda k=kind: run_sealstream(spec(k, files, False),
                                                                 args.before.resolve())))
            contenders.append((f"{kind}/after",
                               lambda k=kind: run_sealstream(spec(k, files, False), after)))
            contenders.append((f"{kind}/polars", lambda k=kind: run_polars(k, files)))
            if kind == "tumbling":
                if args.before is not None:
                    contenders.append(("tumbling-ckpt/before", lambda: run_sealstream(
                        spec("tumbling", files, True), args.before.resolve())))
                contenders.append(("tumbling-ckpt/after",
                                   lambda: run_sealstream(spec("tumbling", files, True), after)))
            for name, fn in contenders:
                s = fn()
                times.setdefault(name, []).append(s)
                CPU.setdefault(name, []).append(_last_cpu[0])
                print(f"[{i + 1}/{args.repeat}] {name}: {s:.2f} s, {_last_cpu[0]:.2f} CPU s "
                      f"({args.events / s:,.0f} events/s)", flush=True)
    load_after = os.getloadavg()
    med = {k: statistics.median(v) for k, v in times.items()}
    rate = {k: args.events / v for k, v in med.items()}
    lines = [
        "# Batch path: sealstream against one-shot Polars (side by side)",
        "",
        f"`python -m bench.speed`, {started}: {args.events:,} events (JSONL, 3 partitions, "
        f"10,000 keys), whole-process wall time, runs alternating, median of {args.repeat}. "
        f"Load average (1 min) {load_before[0]:.2f} at the start, {load_after[0]:.2f} at "
        "the end, on 2 cores shared with other jobs: ratios matter, not absolute rates.",
        "",
        "| window | sealstream before, events/s | sealstream now, events/s | one-shot Polars, "
        "events/s | now / Polars | target | before / Polars |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for kind in kinds:
        b = rate.get(f"{kind}/before")
        a, p = rate[f"{kind}/after"], rate[f"{kind}/polars"]
        ok = "met" if a / p >= TARGETS[kind] else "NOT met"
        lines.append(
            f"| {kind} | {f'{b:,.0f}' if b else '-'} | {a:,.0f} | {p:,.0f} | {a / p:.2f} | "
            f">= {TARGETS[kind]} ({ok}) | {f'{b / p:.2f}' if b else '-'} |")
    if "tumbling-ckpt/after" in rate:
        r = rate["tumbling-ckpt/after"] / rate["tumbling/after"]
        lines += ["", f"Checkpointed (every second) / unchecked, tumbling: {r:.1%} "
                  f"(target >= 95 %: {'met' if r >= 0.95 else 'NOT met'})"
                  + (f"; before: {rate['tumbling-ckpt/before'] / rate['tumbling/before']:.1%}"
                     if "tumbling-ckpt/before" in rate else "") + ".", ""]
    cpu_med = {k: statistics.median(v) for k, v in CPU.items()}
    lines += ["CPU seconds (user + system, median; the CPU ratio is Polars' CPU over "
              "sealstream's, the work each does, less sensitive to the load):", ""]
    for kind in kinds:
        a, p = cpu_med[f"{kind}/after"], cpu_med[f"{kind}/polars"]
        b = cpu_med.get(f"{kind}/before")
        lines.append(f"- {kind}: " + (f"before {b:.2f} s (ratio {p / b:.2f}), " if b else "")
                     + f"now {a:.2f} s (ratio {p / a:.2f}), Polars {p:.2f} s")
    if "tumbling-ckpt/after" in cpu_med:
        lines.append(f"- tumbling, checkpointed: {cpu_med['tumbling-ckpt/after']:.2f} s")
    lines += ["", "All runs (wall seconds / CPU seconds):", ""]
    lines += [f"- {k}: {', '.join(f'{x:.2f}/{c:.2f}' for x, c in zip(v, CPU[k], strict=True))}"
              for k, v in times.items()]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speed-batch.md").write_text(on_top(args.out / "speed-batch.md", lines, started))
    (args.out / "speed-batch.json").write_text(json.dumps(
        {"started": started, "events": args.events, "load": [load_before, load_after],
         "seconds": times, "median_s": med, "rate": rate, "cpu_s": CPU}, indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
