"""Live benchmark: the standard workload read from a Kafka-protocol topic.

    python -m bench.live [--events N] [--keys N] [--repeat N] [--bootstrap HOST:PORT]

The standard workload (``sealstream.testing.datagen.generate``: 3 partitions, Zipf
keys, tumbling 60 s, ``max_delay_ms = 1000``), 2,000,000 events by default, is
produced into a 3-partition topic of the local broker (``noida-db``, started here
on 127.0.0.1 and stopped by its PID; ``--bootstrap`` names another broker). In one
run it reports:

* ``fetch-only loop``: a confluent-kafka consumer reading every partition to its
  end, taking each message's value, no parse: the comparator of the target (the
  run at least 70 % of it), measured alternating with the run;
* ``bare consumer``: a confluent-kafka consumer loop reading every partition to
  its end and ``json.loads``-ing each value, nothing else: the limit this broker
  and client allow;
* ``kafka source``: sealstream's Kafka source alone (``consume(n)`` batches turned
  into typed columns by the shared columnar parser), to its end;
* ``sealstream kafka``: ``sealstream run`` of the standard pipeline on the topic,
  ``stop = "end"``, checkpoint every second (its summary's rate; target: at least
  70 % of the fetch-only loop's);
* ``sealstream jsonl``: the same pipeline on the same events in JSONL files;
* latency: events produced at a fixed rate into a live (``stop = "never"``) run;
  per window, from the moment the watermark passes its end (the producer's clock
  when the event that moves W past it was produced) to its result being committed
  (the commit time the sink's files show), p50 and p99 (target p99 under the
  checkpoint interval + 0.5 s);
* memory: peak RSS of a live run fed at a steady rate, after the first
  ``--rss-first`` events and at the end of ``--rss-events`` (target: within 10 %).

A part that cannot run here (no runtime support yet, no broker) is reported as
skipped with the reason. Results go to ``bench/results/live.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sealstream.sources._kafka_log import RECEIVE_MAX_BYTES

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work" / "live"
RESULTS = ROOT / "bench" / "results"
TARGET = 0.70


def produce_files(bootstrap: str, topic: str, files: list[Path]) -> int:
    """Each JSONL file's lines into one partition (file i -> partition i), in order."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                  "batch.num.messages": 10000, "queue.buffering.max.messages": 1000000,
                  "compression.type": "none"})
    n = 0
    for part, path in enumerate(files):
        with open(path, "rb") as f:
            for line in f:
                line = line.rstrip(b"\n")
                if not line:
                    continue
                while True:
                    try:
                        p.produce(topic, line, partition=part)
                        break
                    except BufferError:
                        p.poll(0.05)
                n += 1
                if n % 50_000 == 0:
                    p.poll(0)
    if p.flush(300) != 0:
        raise RuntimeError("the producer could not deliver every event")
    return n


def bare_consumer(bootstrap: str, topic: str, partitions: int) -> tuple[int, float]:
    """Read every partition to its end, json-parsing each value: (events, seconds)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-bare",
                  "receive.message.max.bytes": RECEIVE_MAX_BYTES,
                  "enable.auto.commit": False, "enable.partition.eof": True,
                  "isolation.level": "read_committed"})
    tps = [TopicPartition(topic, p, 0) for p in range(partitions)]
    t0 = time.perf_counter()
    c.assign(tps)
    done: set[int] = set()
    n = 0
    loads = json.loads
    while len(done) < partitions:
        for m in c.consume(10_000, 1.0):
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    done.add(m.partition())
                continue
            loads(m.value())
            n += 1
    dt = time.perf_counter() - t0
    c.close()
    return n, dt


def _cpu_self() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _cpu_children() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def fetch_only_cpu(bootstrap: str, topic: str, partitions: int) -> tuple[int, float, float]:
    """:func:`fetch_only` with its CPU seconds (user + system, all of this process's
    threads, librdkafka's included, over the loop): (events, seconds, CPU s)."""
    c0 = _cpu_self()
    n, s = fetch_only(bootstrap, topic, partitions)
    return n, s, _cpu_self() - c0


def fetch_only(bootstrap: str, topic: str, partitions: int) -> tuple[int, float]:
    """The comparator of the Kafka run: a confluent-kafka consumer reading every
    partition to its end, touching each message's value and nothing else (no parse):
    what fetching alone costs with this client and broker. (events, seconds)"""
    from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-fetch",
                  "receive.message.max.bytes": RECEIVE_MAX_BYTES,
                  "enable.auto.commit": False, "enable.partition.eof": True,
                  "isolation.level": "read_committed"})
    tps = [TopicPartition(topic, p, 0) for p in range(partitions)]
    t0 = time.perf_counter()
    c.assign(tps)
    done: set[int] = set()
    n = 0
    while len(done) < partitions:
        msgs = c.consume(10_000, 1.0)
        errors = [m for m in msgs if m.error() is not None]
        for m in errors:
            if m.error().code() == KafkaError._PARTITION_EOF:
                done.add(m.partition())
        values = list(map(Message.value, msgs))
        n += len(values) - len(errors)
    dt = time.perf_counter() - t0
    c.close()
    return n, dt


def source_only(bootstrap: str, topic: str) -> tuple[int, float]:
    """sealstream's Kafka source to the end of every partition: (events, seconds)."""
    from sealstream.sources import FieldPlan
    from sealstream.sources.kafka import KafkaSettings, KafkaSource

    plan = FieldPlan(key="user", time="ts", fields={"amount": "numeric"})
    t0 = time.perf_counter()
    src = KafkaSource(KafkaSettings(bootstrap, topic, stop="end"), plan)
    parts = [src.open(name, None) for name in src.discover()]
    ends = [p.end() or 0 for p in parts]
    n = 0
    live = list(zip(parts, ends, strict=True))
    while live:
        rest = []
        for part, end in live:
            if part.position >= end:
                continue
            c = part.poll(50_000, 100)
            if c is not None:
                n += c.events.height + c.bad.height
            rest.append((part, end))
        live = rest
    dt = time.perf_counter() - t0
    for part in parts:
        part.close()
    src.close()
    return n, dt


def sealstream_run(wd: Path, source_toml: str, timeout: float,
                   src: Path | None = None) -> dict[str, Any]:
    """``sealstream run`` of the standard pipeline in ``wd``; its JSON summary, with
    ``cpu_s``: the whole process's CPU seconds (user + system, every thread).
    ``src``: the sealstream sources to run (default: this checkout's)."""
    from sealstream.testing.specs import spec_text

    wd.mkdir(parents=True, exist_ok=True)
    for sub in ("out", "ckpt"):
        subprocess.run(["rm", "-rf", str(wd / sub)], check=True)
    (wd / "spec.toml").write_text(spec_text("live_bench", source_toml, every_ms=1000))
    env = {**os.environ, "PYTHONPATH": str(src or ROOT / "src")}
    t0 = time.perf_counter()
    c0 = _cpu_children()
    proc = subprocess.run(
        [sys.executable, "-m", "sealstream", "run", "spec.toml", "--summary-json",
         "summary.json"],
        cwd=wd, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )
    wall = time.perf_counter() - t0
    cpu = _cpu_children() - c0
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1],
                "wall_s": wall}
    summary: dict[str, Any] = {"wall_s": wall, "cpu_s": cpu}
    summary.update(json.loads((wd / "summary.json").read_text()))
    return summary


def _rate(events: int, seconds: float) -> float:
    return events / seconds if seconds > 0 else 0.0


def median_of(repeat: int, fn: Callable[[], tuple[int, float]]) -> tuple[int, float]:
    runs = [fn() for _ in range(repeat)]
    secs = statistics.median(r[1] for r in runs)
    return runs[0][0], secs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.live")
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bootstrap", default=None)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--before", type=Path, default=None,
                    help="sealstream sources of the code before a change: its Kafka run "
                    "alternates with the fetch-only loop and this checkout's")
    args = ap.parse_args(argv)

    from sealstream.testing.brokers import KafkaBroker, create_topic
    from sealstream.testing.datagen import generate
    from sealstream.testing.specs import files_source

    WORK.mkdir(parents=True, exist_ok=True)
    data = WORK / f"data-{args.events}-{args.keys}"
    files = sorted(data.glob("p*.jsonl"))
    if len(files) != 3:
        files = generate(data, events=args.events, keys=args.keys, partitions=3)
    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        broker = KafkaBroker(data_dir=WORK / "broker")
        broker.start()
        bootstrap = broker.bootstrap
    results: dict[str, Any] = {"events": args.events, "keys": args.keys, "bootstrap": bootstrap,
                               "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "load": f"{os.getloadavg()[0]:.2f}"}
    try:
        topic = f"bench-{args.events}-{int(time.time())}"
        create_topic(bootstrap, topic, 3)
        t0 = time.perf_counter()
        produced = produce_files(bootstrap, topic, files)
        results["produce_s"] = time.perf_counter() - t0
        print(f"produced {produced:,} events in {results['produce_s']:.1f} s", flush=True)

        n, s = median_of(args.repeat, lambda: bare_consumer(bootstrap, topic, 3))
        results["bare"] = {"events": n, "seconds": s, "rate": _rate(n, s)}
        print(f"bare consumer: {n:,} events, {_rate(n, s):,.0f}/s", flush=True)
        n, s = median_of(args.repeat, lambda: source_only(bootstrap, topic))
        results["source"] = {"events": n, "seconds": s, "rate": _rate(n, s)}
        print(f"kafka source: {n:,} events, {_rate(n, s):,.0f}/s", flush=True)

        kafka_toml = (f'kind = "kafka"\nbootstrap = "{bootstrap}"\ntopic = "{topic}"\n'
                      'stop = "end"')
        # the target's pair side by side: fetch-only loop and the run, alternating
        # (and the code before a change, when --before names it)
        runs, fetches, befores, empties = [], [], [], []
        empty_topic = f"{topic}-empty"
        create_topic(bootstrap, empty_topic, 3)
        empty_toml = kafka_toml.replace(f'topic = "{topic}"', f'topic = "{empty_topic}"')
        for _ in range(args.repeat):
            fetches.append(fetch_only_cpu(bootstrap, topic, 3))
            if args.before is not None:
                befores.append(sealstream_run(WORK / "run-kafka-before", kafka_toml, 3600,
                                              src=args.before))
            runs.append(sealstream_run(WORK / "run-kafka", kafka_toml, 3600))
            # start-up and exit: the same run on an empty topic (its CPU is left out)
            empties.append(sealstream_run(WORK / "run-kafka-empty", empty_toml, 3600))
        n, s = fetches[0][0], statistics.median(f[1] for f in fetches)
        results["fetch"] = {"events": n, "seconds": s, "rate": _rate(n, s),
                            "cpu_s": statistics.median(f[2] for f in fetches),
                            "single": [[f[1], f[2]] for f in fetches]}
        print(f"fetch-only loop: {n:,} events, {_rate(n, s):,.0f}/s", flush=True)
        idle = statistics.median(float(r.get("cpu_s", 0.0)) for r in empties
                                 if "error" not in r) if empties else 0.0
        results["startup_cpu_s"] = idle
        results["sealstream_kafka"] = _summarise(runs, produced, idle)
        if befores:
            results["sealstream_kafka_before"] = _summarise(befores, produced, idle)
        results["load_after"] = f"{os.getloadavg()[0]:.2f}"
        runs = [sealstream_run(WORK / "run-jsonl", files_source(files), 3600)
                for _ in range(args.repeat)]
        results["sealstream_jsonl"] = _summarise(runs, produced)
        for k in ("sealstream_kafka", "sealstream_jsonl"):
            print(f"{k}: {results[k]}", flush=True)
    finally:
        if broker is not None:
            broker.stop()
    write_report(results, args.out)
    return 0


def _summarise(runs: list[dict[str, Any]], events: int, idle_cpu: float = 0.0
               ) -> dict[str, Any]:
    """Medians of the runs; ``cpu_s``: the process's CPU less ``idle_cpu`` (start-up
    and exit, measured on an empty topic)."""
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        return {"skipped": errors[0]}
    secs = statistics.median(float(r.get("seconds", r["wall_s"])) for r in runs)
    out = {"events": events, "seconds": secs, "rate": _rate(events, secs),
           "single": [[float(r.get("seconds", r["wall_s"])), float(r.get("cpu_s", 0.0))]
                      for r in runs]}
    if all("cpu_s" in r for r in runs):
        out["cpu_s"] = statistics.median(float(r["cpu_s"]) for r in runs) - idle_cpu
        out["wall_s"] = statistics.median(float(r["wall_s"]) for r in runs)
    return out


TITLE = "# Live benchmark (Kafka-protocol broker)"


def write_report(results: dict[str, Any], out: Path) -> None:
    """``live.json`` (this run), and this run's section at the top of ``live.md``
    above the earlier ones (kept: their analysis is written by hand)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "live.json").write_text(json.dumps(results, indent=2) + "\n")
    fetch = results.get("fetch", {})
    bare = fetch.get("rate") or 0.0
    lines = [
        f"## {results.get('when', '')}: {results['events']:,} events, load "
        f"{results.get('load', '-')} -> {results.get('load_after', '-')}",
        "",
        f"{results['events']:,} events of the standard workload, {results['keys']:,} keys, "
        "3 partitions; tumbling 60 s; checkpoint every second; `stop = \"end\"`.",
        "Broker: noida-db (a Kafka-protocol broker) on 127.0.0.1 unless `--bootstrap`. "
        "The fetch-only loop and the Kafka runs alternate (median of the repeats); a run's "
        "rate is its summary's (events over the engine's time, start-up left out). CPU s: "
        "user + system of every thread (the loop: its own; a run: the whole process less "
        f"the median of the same run on an empty topic, {results.get('startup_cpu_s', 0):.2f} "
        "s: start-up and exit).",
        "",
        "| reader | events/s | vs fetch-only loop | CPU s | fetch-only CPU / CPU |",
        "|---|---:|---:|---:|---:|",
    ]
    fcpu = fetch.get("cpu_s")
    for key, label in (("fetch", "confluent-kafka fetch-only loop (the comparator)"),
                       ("bare", "bare confluent-kafka loop + json.loads"),
                       ("source", "sealstream Kafka source alone (typed columns)"),
                       ("sealstream_kafka_before", "sealstream run, kind = \"kafka\", "
                        "the code before (`--before`)"),
                       ("sealstream_kafka", "sealstream run, kind = \"kafka\""),
                       ("sealstream_jsonl", "sealstream run, the same events in JSONL (CPU s: "
                        "the whole process, start-up included)")):
        r = results.get(key)
        if r is None and key == "sealstream_kafka_before":
            continue
        r = r or {}
        if "rate" in r:
            ratio = f"{r['rate'] / bare:.2f}" if bare else "-"
            cpu = r.get("cpu_s")
            cpu_s = f"{cpu:.2f}" if cpu is not None else "-"
            by_cpu = f"{fcpu / cpu:.2f}" if cpu and fcpu else "-"
            lines.append(f"| {label} | {r['rate']:,.0f} | {ratio} | {cpu_s} | {by_cpu} |")
        else:
            lines.append(f"| {label} | skipped: {r.get('skipped', 'not run')} | - | - | - |")
    k = results.get("sealstream_kafka", {})
    if "rate" in k and bare:
        ok = k["rate"] >= TARGET * bare
        lines += ["", f"Target: sealstream kind = \"kafka\" >= {TARGET:.0%} of the "
                  f"fetch-only loop: {'met' if ok else 'NOT met'} by rate "
                  f"({k['rate'] / bare:.2f}x)"
                  + (f"; by CPU {fcpu / k['cpu_s']:.2f}x." if fcpu and k.get("cpu_s")
                     else ".")]
    old = (out / "live.md").read_text() if (out / "live.md").exists() else ""
    if old.startswith(TITLE):
        old = old[len(TITLE):].lstrip("\n")
    if old and not old.startswith("## "):
        old = "## Earlier run\n\n" + old
    (out / "live.md").write_text("\n".join([TITLE, "", *lines, "", old]).rstrip("\n") + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
