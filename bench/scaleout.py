"""Scale-out on Ray: the standard workload with 1, 2 and 3 workers beside the
single-process engine, and what one worker costs in memory.

    python -m bench.scaleout [--events N] [--keys N] [--every N]

One driver process starts a local Ray once (its start-up time is reported apart:
a real deployment joins a running cluster) and runs the same checkpointed job
(tumbling 60 s, count + sum) with the single-process engine and with 1, 2 and 3
workers, each from an empty checkpoint directory. Reported per run: engine and
wall time, events/s, the coordinator's CPU seconds per million events and its
share of the job's CPU (coordinator + workers), the bytes the coordinator received
per event (the data plane's per-step accounting), checkpoints (count, mean time,
mean bytes) and each worker's peak RSS (VmHWM of its process). Every distributed
output is checked against the single-process one. Written to ``bench/results/scaleout.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import on_top

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work" / "scaleout"
RESULTS = ROOT / "bench" / "results"


def _peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _output(d: Path) -> dict[tuple[Any, ...], dict[str, Any]]:
    rows = [json.loads(line) for f in sorted((d / "out").glob("*.jsonl"))
            for line in f.read_text().splitlines() if line.strip()]
    return {(r["key"], r["window_start"], r["window_end"]): r for r in rows}


def _same(a: dict[tuple[Any, ...], dict[str, Any]],
          b: dict[tuple[Any, ...], dict[str, Any]]) -> bool:
    """Equal results (floats within 1e-9 relative: sums in another order)."""
    if a.keys() != b.keys():
        return False
    for k, ra in a.items():
        rb = b[k]
        if ra.keys() != rb.keys():
            return False
        for f, v in ra.items():
            w = rb[f]
            if isinstance(v, float) or isinstance(w, float):
                if not math.isclose(v, w, rel_tol=1e-9):
                    return False
            elif v != w:
                return False
    return True


def _run(files: list[Path], every: int, workers: int | None, label: str,
         source: str | None = None) -> dict[str, Any]:
    from sealstream import Job, load_spec
    from sealstream.distributed import DistributedJob
    from sealstream.distributed._shard import drain_pool
    from sealstream.testing.specs import files_source, spec_text

    d = WORK / label
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    spec = d / "spec.toml"
    spec.write_text(spec_text("scaleout_bench", source or files_source(files),
                              batch_size=100000, every_events=every))
    pipeline = load_spec(spec)
    start_s = 0.0
    warm: list[Any] = []
    cpu0: list[float] = []
    if workers is not None:  # workers started (and idle in the pool) before the clock
        import ray

        from sealstream.distributed._shard import acquire, release

        t0 = time.perf_counter()
        warm = acquire(workers)
        cpu0 = ray.get([a.cpu_s.remote() for a in warm])
        ray.get([a.phase_times.remote() for a in warm])
        release(warm, healthy=True)
        start_s = time.perf_counter() - t0
    job: Any = Job(pipeline) if workers is None else DistributedJob(pipeline, workers=workers)
    t0 = time.perf_counter()
    c0 = time.process_time()
    summary = job.run()
    coord_cpu = time.process_time() - c0
    wall = time.perf_counter() - t0
    worker_cpu = 0.0
    each: list[float] = []
    phases: dict[str, tuple[int, float, float]] = {}
    if warm:
        import ray

        # in the job's worker order (worker i reads partitions i, i + N, ...)
        ids = [a._actor_id for a in warm]
        order = [a for a in getattr(job.merger, "actors", warm) if a._actor_id in ids] or warm
        cpu1 = ray.get([a.cpu_s.remote() for a in order])
        each = [c - cpu0[ids.index(a._actor_id)] for a, c in zip(order, cpu1, strict=True)]
        worker_cpu = sum(each)
        phases = _merge([*ray.get([a.phase_times.remote() for a in warm]),
                         getattr(getattr(job.merger, "phases", None), "totals", {})])
    rss = [_peak_rss_mb(p) for p in getattr(job.operator, "pids", [])]
    steps = getattr(job.merger, "step_bytes", None)
    rows_bytes = getattr(job.merger, "output_bytes", None)
    drain_pool()  # the next run measures fresh workers
    ck = summary.checkpoints.to_json()
    dist = summary.to_json().get("distributed") or {}
    events = summary.counters.events
    return {"label": label, "workers": workers, "wall_s": wall, "start_s": start_s,
            "engine_s": dist.get("engine_s", wall), "coord_cpu_s": coord_cpu,
            "worker_cpu_s": worker_cpu, "worker_cpu_each": each,
            "coord_bytes_per_event": (sum(steps) / events if steps and events else None),
            "control_bytes_per_event": ((sum(steps) - sum(rows_bytes or [])) / events
                                        if steps and events else None),
            "steps": len(steps) if steps else None,
            "events": summary.counters.events, "ckpts": ck["count"],
            "ck_ms": ck["mean_ms"], "ck_blocking_ms": ck["mean_blocking_ms"],
            "ck_bytes": ck["mean_bytes"], "worker_rss_mb": rss, "output": _output(d),
            "phases": phases}


def _merge(parts: list[Any]) -> dict[str, tuple[int, float, float]]:
    """Phase totals of every worker (and the coordinator) added up."""
    out: dict[str, list[float]] = {}
    for part in parts:
        for name, v in part.items():
            t = out.setdefault(name, [0.0, 0.0, 0.0])
            for i in range(3):
                t[i] += float(v[i])
    return {k: (int(v[0]), v[1], v[2]) for k, v in sorted(out.items())}


def _profile(runs: list[dict[str, Any]]) -> list[str]:
    """Where the time of the runs with workers went, per phase (all workers added)."""
    with_phases = [r for r in runs if r.get("phases")]
    if not with_phases:
        return []
    lines = ["| config | phase | calls | wall s | CPU s | CPU us / event |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for r in with_phases:
        for name, (calls, wall, cpu) in r["phases"].items():
            lines.append(f"| {r['label']} | {name} | {calls} | {wall:.2f} | {cpu:.2f} | "
                         f"{1e6 * cpu / max(1, r['events']):.2f} |")
    return lines


def _kafka_runs(w: Any, events: int, every: int, rounds: int = 1
                ) -> tuple[list[list[dict[str, Any]]], str]:
    """The Kafka case: the workload's partitions produced into a 3-partition topic of
    a local broker (``SEALSTREAM_TEST_KAFKA`` names another one), read to its end
    (``stop = "end"``) by one process and by 2 workers (each reading its partitions
    through its own consumer), side by side, ``rounds`` times (one pair per round:
    the load of a shared machine changes between rounds)."""
    import uuid

    from bench.harness import prepare_data
    from sealstream.testing.brokers import KafkaBroker, external_kafka, produce_files

    files = prepare_data(w, ROOT / "bench" / "data", events=events)
    broker = None
    bootstrap = external_kafka()
    if bootstrap is None:
        broker = KafkaBroker()
        broker.start()
        bootstrap = broker.bootstrap
    try:
        topic = f"scaleout-{uuid.uuid4().hex[:8]}"
        t0 = time.perf_counter()
        n = produce_files(bootstrap, topic, files)
        produced = time.perf_counter() - t0
        source = (f'kind = "kafka"\nbootstrap = "{bootstrap}"\ntopic = "{topic}"\n'
                  'stop = "end"')
        runs = [[_run(files, every, None, "kafka-single", source),
                 _run(files, every, 2, "kafka-workers-2", source)] for _ in range(rounds)]
    finally:
        if broker is not None:
            broker.close()
    note = (f"{n:,} events produced into a {len(files)}-partition topic of a local "
            f"noida-db broker in {produced:.1f} s, read to its end")
    return runs, note


def _table(runs: list[dict[str, Any]]) -> list[str]:
    base = runs[0]
    lines = [
        "| config | worker start s | engine s | wall s | events/s | vs single (engine) | "
        "coordinator CPU s / M events | coordinator share of CPU | workers' CPU s (each) | "
        "job CPU s | coordinator bytes / "
        "event (control only) | steps | checkpoints | mean ckpt ms (blocking) | "
        "worker peak RSS MB | output |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | --- | --- |",
    ]
    for r in runs:
        rate = r["events"] / r["engine_s"]
        rss = ", ".join(f"{m:.0f}" for m in r["worker_rss_mb"] if m is not None) or "-"
        same = "ok" if _same(r["output"], base["output"]) else "MISMATCH"
        per_m = r["coord_cpu_s"] / (r["events"] / 1e6)
        total = r["coord_cpu_s"] + r["worker_cpu_s"]
        share = f"{100 * r['coord_cpu_s'] / total:.1f}%" if r["workers"] else "-"
        bpe, ctl = r["coord_bytes_per_event"], r["control_bytes_per_event"]
        lines.append(
            f"| {r['label']} | {r['start_s']:.2f} | {r['engine_s']:.2f} | {r['wall_s']:.2f} "
            f"| {rate:,.0f} | {base['engine_s'] / r['engine_s']:.2f}x | {per_m:.2f} | "
            f"{share} | {', '.join(f'{c:.2f}' for c in r.get('worker_cpu_each', [])) or '-'} "
            f"| {total:.2f} | {'-' if bpe is None else f'{bpe:.4f} ({ctl:.5f})'} | "
            f"{r['steps'] or '-'} | "
            f"{r['ckpts']} | {r['ck_ms']:.0f} ({r['ck_blocking_ms']:.0f}) | {rss} | {same} |")
    return lines


KAFKA_HEADING = "## Kafka source"
PROFILE_NOTE = ("Where the time of the runs with workers went, per phase of a step, all "
                "workers added up (and the coordinator's waits): calls, wall seconds, the "
                "process's CPU seconds during the phase (Polars' threads included) and "
                "that CPU per event of the run.")


def _replace_kafka(old: str, section: str) -> str:
    """``old`` results with their newest Kafka section (the first, up to the next
    heading of its level) replaced by ``section``; the sections after it (earlier
    runs) kept."""
    at = old.find(KAFKA_HEADING + "\n")
    if at < 0:
        return old.rstrip("\n") + "\n\n" + section
    nxt = old.find("\n## ", at + len(KAFKA_HEADING))
    rest = "" if nxt < 0 else old[nxt + 1:]
    return old[:at].rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n\n" + rest


def main(argv: list[str] | None = None) -> int:
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    from bench.harness import STANDARD, Workload, prepare_data

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=STANDARD["events"])
    ap.add_argument("--keys", type=int, default=STANDARD["keys"])
    ap.add_argument("--every", type=int, default=500_000, help="checkpoint every N events")
    ap.add_argument("--kafka-events", type=int, default=600_000,
                    help="events of the Kafka case (0: no Kafka case)")
    ap.add_argument("--kafka-rounds", type=int, default=2,
                    help="times the Kafka pair (one process, 2 workers) is run")
    ap.add_argument("--only-kafka", action="store_true",
                    help="run the Kafka case alone (its section of the results replaced)")
    args = ap.parse_args(argv)
    w = Workload(events=args.events, keys=args.keys, partitions=STANDARD["partitions"],
                 disorder_ms=800, max_delay_ms=1000, size_ms=60_000,
                 checkpoint_every_ms=1000, seed=42)
    files = [] if args.only_kafka else prepare_data(w, ROOT / "bench" / "data")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    # address="local": a Ray of its own, even beside another one on the machine;
    # started again (3 tries) when Ray gives up on its node: Ray 2.60 waits a
    # hard-coded 30 s for it to register, which a loaded machine exceeds
    for attempt in range(3):
        try:
            ray.init(address="local", num_cpus=os.cpu_count() or 1, include_dashboard=False,
                     _node_ip_address="127.0.0.1", log_to_driver=False,
                     configure_logging=False)
            break
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception then
            if attempt == 2 or "timed out during startup" not in str(exc):
                raise
            print(f"ray: {exc}; starting it again", file=sys.stderr)
            ray.shutdown()
    ray_start = time.perf_counter() - t0
    try:
        runs: list[dict[str, Any]] = []
        if not args.only_kafka:
            runs = [_run(files, args.every, None, "single")]
            for n in (1, 2, 3):
                runs.append(_run(files, args.every, n, f"workers-{n}"))
        kafka: list[list[dict[str, Any]]] = []
        if args.kafka_events > 0:
            kafka, note = _kafka_runs(w, args.kafka_events, args.every,
                                      max(1, args.kafka_rounds))
    finally:
        ray.shutdown()
    load_after = os.getloadavg()[0]
    section: list[str] = []
    if kafka:
        section = [
            KAFKA_HEADING,
            "",
            f"The same job reading a Kafka topic: {note} (`stop = \"end\"`) by one "
            "process and by 2 workers, each reading its partitions through its own "
            "consumer (assigned), the coordinator planning and recording the steps "
            "from three numbers per partition. Output compared with the single "
            f"process. Load average (1 min) {load_before:.1f} before and "
            f"{load_after:.1f} after. The pair is run {len(kafka)} time(s), each "
            "worker run right after its single-process run and compared with it.",
            "",
        ]
        for i, pair in enumerate(kafka):
            section += [f"Round {i + 1}:", "", *_table(pair), ""]
        section += [PROFILE_NOTE, "", *_profile([r for pair in kafka for r in pair]), ""]
    out = RESULTS / "scaleout.md"
    if args.only_kafka:
        old = out.read_text() if out.is_file() else "# sealstream scale-out on Ray\n"
        text = _replace_kafka(old, "\n".join(section))
    else:
        lines = [
            "# sealstream scale-out on Ray",
            "",
            f"Workload: {args.events:,} events, {args.keys:,} keys, "
            f"{STANDARD['partitions']} JSONL partitions, tumbling 60 s, count + sum, "
            f"checkpoint every {args.every:,} events, on this machine ({os.cpu_count()} "
            f"cores). One driver process; a local Ray started once in {ray_start:.1f} s "
            "and the workers started before each run (both apart); wall time of the job "
            "from one run. Outputs compared with the single process (floats within 1e-9 "
            f"relative). Load average (1 min) {load_before:.1f} before and "
            f"{load_after:.1f} after the runs (the machine is shared). Coordinator CPU: "
            "this process's CPU time during the job (Ray's threads in it included); its "
            "share is of the coordinator's plus the workers' CPU time. Bytes: what the "
            "coordinator received per event; in brackets the control part alone "
            "(summaries, references), the rest being output: the identities of the "
            "results the workers staged themselves (for the receipts), late events and "
            "bad records.",
            "",
            *_table(runs),
            "",
            PROFILE_NOTE,
            "",
            *_profile(runs),
            "",
            *section,
        ]
        text = on_top(out, lines, started)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    return 0 if all(_same(r["output"], g[0]["output"]) for g in (runs, *kafka) if g
                    for r in g) else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
