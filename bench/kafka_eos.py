"""Exactly-once into Kafka: ``python -m bench.kafka_eos`` (in ``make bench``).

The standard workload (``--events`` events over ``--keys`` keys, 3 partitions,
out of order by up to 0.8 s) is produced once into a 3-partition topic keyed by user
(murmur2, as the Java clients and Quix Streams partition: keys co-partitioned). Then,
on the same local broker, in the same run:

* ``sealstream kafka -> files``: the standard job (tumbling minute, count and sum)
  reading the topic into a JSON Lines directory, exactly once (the reference rate);
* ``sealstream files -> kafka``: the same job from the workload's files into a
  topic, each epoch one Kafka transaction;
* ``sealstream kafka -> kafka``: from the topic into a topic, exactly once;
* ``quix streams exactly-once``: Quix Streams 3.x, ``processing_guarantee =
  "exactly-once"``, the same tumbling window with count and sum, from the same topic
  (run from ``bench/.quix-venv``, see ``make bench-quix``; skipped without it). Its
  idle timeout (it stops once no message came for that long) is taken off its time.

Both tolerate 5 s of disorder (our watermark delay, Quix's grace), well above the
workload's, so that neither drops an event as late and the outputs can be compared
(their lateness rules differ: Quix closes windows per partition, sealstream by the
global watermark). The Quix output is read back ``read_committed`` and checked against ours: every
window it closed must be in our output with the same count and sum (Quix does not
close the last windows of a finite topic: they wait for later events).

Results go to ``bench/results/kafka_eos.{json,md}``. Targets (issue 17): Kafka to
Kafka at least 20 times Quix Streams' exactly-once rate, and at least 70% of
sealstream's own Kafka-to-files rate.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work" / "kafka_eos"
RESULTS = ROOT / "bench" / "results"
QUIX_PY = ROOT / "bench" / ".quix-venv" / "bin" / "python"
QUIX_IDLE_S = 10.0


def produce_keyed(bootstrap: str, topic: str, files: list[Path]) -> int:
    """Every line of the files into ``topic``, keyed by its user (murmur2)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                  "queue.buffering.max.messages": 1_000_000, "partitioner": "murmur2_random"})
    n = 0
    # the files interleaved line by line: each is in time order (up to its disorder) at
    # the same rate, so every partition of the topic stays in time order too
    handles = [open(path, "rb") for path in files]  # noqa: SIM115 - closed below
    try:
        for lines in itertools.zip_longest(*handles):
            for line in lines:
                line = (line or b"").rstrip(b"\n")
                if not line:
                    continue
                key = json.loads(line)["user"]
                while True:
                    try:
                        p.produce(topic, line, str(key).encode())
                        break
                    except BufferError:
                        p.poll(0.05)
                n += 1
    finally:
        for h in handles:
            h.close()
    if p.flush(300) != 0:
        raise RuntimeError("the producer could not deliver every event")
    return n


def sealstream_run(wd: Path, name: str, source: str, sink: str) -> dict[str, Any]:
    """``sealstream run`` of the standard job in a fresh ``wd``: wall time and summary."""
    from sealstream.testing.specs import spec_text

    subprocess.run(["rm", "-rf", str(wd)], check=True)
    wd.mkdir(parents=True)
    (wd / "spec.toml").write_text(spec_text(name, source, batch_size=100000, max_delay_ms=5000,
                                            sink=sink, every_ms=1000))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sealstream", "run", "spec.toml",
                           "--summary-json", "summary.json", "--quiet"],
                          cwd=wd, env=env, capture_output=True, text=True, timeout=7200)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"sealstream run in {wd} failed: {proc.stderr.strip()[-2000:]}")
    out: dict[str, Any] = {"wall_s": wall}
    out.update(json.loads((wd / "summary.json").read_text()))
    return out


def quix_run(bootstrap: str, src: str, dst: str) -> dict[str, Any] | None:
    if not QUIX_PY.exists():
        print("quix streams: bench/.quix-venv missing (make bench-quix); skipped", flush=True)
        return None
    state = WORK / "quix-state"
    subprocess.run(["rm", "-rf", str(state)], check=True)
    t0 = time.perf_counter()
    proc = subprocess.run([str(QUIX_PY), str(ROOT / "bench" / "quix_eos_job.py"), bootstrap,
                           src, dst, f"quix-{int(time.time())}", str(state), str(QUIX_IDLE_S)],
                          capture_output=True, text=True, timeout=7200, env={
                              k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(f"quix streams failed: {proc.stderr.strip()[-1500:]}", flush=True)
        return {"error": proc.stderr.strip()[-500:]}
    ran = json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]
    return {"wall_s": wall, "run_s": ran, "seconds": max(ran - QUIX_IDLE_S, 1e-9)}


def topic_windows(bootstrap: str, topic: str, quix: bool) -> dict[tuple[str, int], tuple[int,
                                                                                      float]]:
    from sealstream.testing.kafka_read import read_committed

    out = {}
    for m in read_committed(bootstrap, topic, timeout_s=600):
        v = json.loads(m.value)
        if quix:
            key = (m.key or b"").decode()
            out[(key, int(v["start"]))] = (int(v["n"]), float(v["total"] or 0))
        else:
            out[(str(v["key"]), int(v["window_start"]))] = (int(v["n"]),
                                                             float(v["total"] or 0))
    return out


def compare(ours: dict[Any, Any], theirs: dict[Any, Any]) -> dict[str, int]:
    missing = [k for k in theirs if k not in ours]
    differ = [k for k in theirs if k in ours and (
        ours[k][0] != theirs[k][0]
        or not math.isclose(ours[k][1], theirs[k][1], rel_tol=1e-9, abs_tol=1e-6))]
    for k in differ[:3]:
        print(f"  differs: {k}: ours {ours[k]}, quix {theirs[k]}", flush=True)
    return {"quix_windows": len(theirs), "ours": len(ours), "missing_in_ours": len(missing),
            "different": len(differ)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kafka_eos")
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--bootstrap", default=None)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    from sealstream.testing.brokers import KafkaBroker, create_topic
    from sealstream.testing.datagen import generate
    from sealstream.testing.specs import JSONL_OUT, files_source

    WORK.mkdir(parents=True, exist_ok=True)
    data = WORK / f"data-{args.events}-{args.keys}"
    files = sorted(data.glob("p*.jsonl"))
    if len(files) != 3:
        files = generate(data, events=args.events, keys=args.keys, partitions=3)
    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        subprocess.run(["rm", "-rf", str(WORK / "broker")], check=True)
        broker = KafkaBroker(data_dir=WORK / "broker")
        broker.start()
        bootstrap = broker.bootstrap
    res: dict[str, Any] = {"events": args.events, "keys": args.keys}
    try:
        stamp = int(time.time())
        topic = f"eos-in-{stamp}"
        create_topic(bootstrap, topic, 3)
        t0 = time.perf_counter()
        n = produce_keyed(bootstrap, topic, files)
        print(f"produced {n:,} events keyed by user in {time.perf_counter() - t0:.1f} s",
              flush=True)
        src_kafka = f'kind = "kafka"\nbootstrap = "{bootstrap}"\ntopic = "{topic}"\nstop = "end"'
        src_files = files_source(files)

        def sink_kafka(name: str) -> str:
            out = f"eos-{name}-{stamp}"
            create_topic(bootstrap, out, 3)
            return f'kind = "kafka"\nbootstrap = "{bootstrap}"\ntopic = "{out}"'

        runs = {
            "kafka_to_files": ("k2f", src_kafka, JSONL_OUT),
            "files_to_kafka": ("f2k", src_files, sink_kafka("f2k")),
            "kafka_to_kafka": ("k2k", src_kafka, sink_kafka("k2k")),
        }
        for label, (name, source, sink) in runs.items():
            r = sealstream_run(WORK / name, f"eos-{name}", source, sink)
            r["rate"] = n / r["wall_s"]
            res[label] = r
            print(f"sealstream {label}: {r['wall_s']:.1f} s, {r['rate']:,.0f} events/s",
                  flush=True)
        quix_out = f"eos-quix-{stamp}"
        create_topic(bootstrap, quix_out, 3)
        q = quix_run(bootstrap, topic, quix_out)
        if q is not None and "error" not in q:
            q["rate"] = n / q["seconds"]
            print(f"quix streams exactly-once: {q['seconds']:.1f} s, {q['rate']:,.0f} "
                  "events/s", flush=True)
            q["check"] = compare(topic_windows(bootstrap, f"eos-k2k-{stamp}", quix=False),
                                 topic_windows(bootstrap, quix_out, quix=True))
            print(f"quix output against ours: {q['check']}", flush=True)
        res["quix_exactly_once"] = q
    finally:
        if broker is not None:
            broker.close()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kafka_eos.json").write_text(json.dumps(res, indent=1, default=str))
    (args.out / "kafka_eos.md").write_text(report(res))
    print(report(res))
    return 0


def report(res: dict[str, Any]) -> str:
    rows = [("sealstream kafka -> files (exactly once)", res.get("kafka_to_files")),
            ("sealstream files -> kafka (exactly once)", res.get("files_to_kafka")),
            ("sealstream kafka -> kafka (exactly once)", res.get("kafka_to_kafka")),
            ("Quix Streams 3.x, exactly-once", res.get("quix_exactly_once"))]
    lines = [f"# Exactly-once into Kafka ({res['events']:,} events, {res['keys']:,} keys, "
             "tumbling minute, count + sum)", "", "| job | events/s |", "| --- | ---: |"]
    for label, r in rows:
        rate = f"{r['rate']:,.0f}" if r and "rate" in r else "skipped"
        lines.append(f"| {label} | {rate} |")
    k2k = (res.get("kafka_to_kafka") or {}).get("rate")
    k2f = (res.get("kafka_to_files") or {}).get("rate")
    q = res.get("quix_exactly_once") or {}
    lines.append("")
    if k2k and k2f:
        lines.append(f"Kafka -> Kafka is {k2k / k2f:.0%} of Kafka -> files (target >= 70%).")
    if k2k and q.get("rate"):
        lines.append(f"Kafka -> Kafka is {k2k / q['rate']:.1f} x Quix Streams' exactly-once "
                     "rate (target >= 20 x).")
        lines.append(f"Quix output checked against ours: {q.get('check')}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
