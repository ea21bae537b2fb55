"""NATS JetStream: sealstream's source against a bare nats-py consumer, same stream.

    python -m bench.nats [--events N] [--subjects N] [--batch N] [--repeat N]

Starts a local ``nats-server`` with JetStream (``sealstream.testing.brokers.NatsServer``,
stopped by its PID), creates a file-backed stream with ``--subjects`` subjects, and
publishes the standard workload's events (``sealstream.testing.datagen.generate``: Zipf
keys, ``{"user":..,"ts":..,"amount":..}``), one subject per partition. Then, each
``--repeat`` times (median kept), in the same run:

* ``bare nats-py``: one ephemeral pull consumer per subject (no acks), ``fetch(batch)``
  until the subject's last sequence, ``json.loads`` of each value: the limit this
  server and client allow for a Python reader that touches every record;
* ``bare nats-py, inbox pull``: the same consumers asked directly with pull requests
  answered at an inbox and collected by a callback (how sealstream reads), ``json.loads``
  of each value: the fair limit for sealstream's source;
* ``sealstream source``: :class:`sealstream.sources.nats.NatsSource`, ``poll(batch)``
  per subject until its end position: typed columns (key, time, amount) and bad-record
  checks, the work the engine's source does;
* ``sealstream run``: ``sealstream run`` of the standard pipeline (tumbling 60 s,
  count and sum) with ``kind = "nats"``, ``stop = "end"``, a checkpoint every second,
  when this build has live runs (else the row says why it is missing).

Written to ``bench/results/nats.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
STREAM = "BENCH"


def subjects(n: int) -> list[str]:
    return [f"bench.p{i}" for i in range(n)]


def publish(url: str, files: list[Path], subs: list[str]) -> int:
    """Publish each file's lines to its subject (core publish, then a flush and a
    check that the stream holds them all); the number of messages."""
    import nats
    from nats.js.api import StorageType, StreamConfig

    async def go() -> int:
        nc = await nats.connect(url)
        js = nc.jetstream(timeout=30)
        await js.add_stream(StreamConfig(name=STREAM, subjects=subs, storage=StorageType.FILE))
        total = 0
        for path, sub in zip(files, subs, strict=True):
            with open(path, "rb") as f:
                for n, line in enumerate(f, 1):
                    await nc.publish(sub, line.rstrip(b"\n"))
                    total += 1
                    if n % 20_000 == 0:  # keep the server's inbound buffer bounded
                        await nc.flush(timeout=60)
        await nc.flush(timeout=60)
        deadline = time.monotonic() + 120
        while (await js.stream_info(STREAM)).state.messages < total:
            if time.monotonic() > deadline:
                raise RuntimeError("the stream did not receive every message")
            await asyncio.sleep(0.1)
        await nc.close()
        return total

    return asyncio.run(go())


def bare(url: str, subs: list[str], batch: int) -> tuple[int, float]:
    """A plain nats-py pull consumer per subject, reading to the end, json.loads each."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    async def go() -> tuple[int, float]:
        nc = await nats.connect(url)
        js = nc.jetstream(timeout=30)
        n = 0
        touched = 0.0
        t0 = time.perf_counter()
        for sub in subs:
            last = (await js.get_last_msg(STREAM, sub)).seq
            info = await js.add_consumer(STREAM, ConsumerConfig(
                deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE,
                filter_subject=sub, mem_storage=True, inactive_threshold=30.0))
            psub = await js.pull_subscribe_bind(durable=info.name, stream=STREAM)
            seq = 0
            while seq < last:
                msgs = await psub.fetch(batch, timeout=5)
                for m in msgs:
                    touched += json.loads(m.data)["amount"]
                n += len(msgs)
                seq = msgs[-1].metadata.sequence.stream
            await psub.unsubscribe()
        dt = time.perf_counter() - t0
        await nc.close()
        return n, dt

    return asyncio.run(go())


def bare_raw(url: str, subs: list[str], batch: int) -> tuple[int, float]:
    """nats-py with pull requests answered at an inbox and a callback that collects the
    messages (what sealstream does), ``json.loads`` of each value."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    async def go() -> tuple[int, float]:
        nc = await nats.connect(url)
        js = nc.jetstream(timeout=30)
        n = 0
        touched = 0.0
        t0 = time.perf_counter()
        for sub in subs:
            last = (await js.get_last_msg(STREAM, sub)).seq
            info = await js.add_consumer(STREAM, ConsumerConfig(
                deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE,
                filter_subject=sub, mem_storage=True, inactive_threshold=30.0))
            buf: list[Any] = []
            done = asyncio.Event()
            want = [0]

            async def cb(m: Any, buf: list[Any] = buf, done: asyncio.Event = done,
                         want: list[int] = want) -> None:
                if m.headers and "Status" in m.headers:
                    done.set()
                    return
                buf.append(m)
                if len(buf) >= want[0]:
                    done.set()

            inbox = nc.new_inbox()
            isub = await nc.subscribe(inbox, cb=cb, pending_msgs_limit=-1,
                                      pending_bytes_limit=-1)
            seq = 0
            while seq < last:
                done.clear()
                want[0] = batch
                await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{info.name}",
                                 json.dumps({"batch": batch, "no_wait": True}).encode(),
                                 reply=inbox)
                await asyncio.wait_for(done.wait(), 30)
                msgs = list(buf)
                buf.clear()
                for m in msgs:
                    touched += json.loads(m.data)["amount"]
                n += len(msgs)
                if msgs:
                    seq = int(msgs[-1].reply.split(".")[5])
            await isub.unsubscribe()
        dt = time.perf_counter() - t0
        await nc.close()
        return n, dt

    return asyncio.run(go())


def ours(url: str, subs: list[str], batch: int) -> tuple[int, float]:
    from sealstream.sources import FieldPlan
    from sealstream.sources.nats import NatsSettings, NatsSource

    plan = FieldPlan(key="user", time="ts", fields={"amount": "numeric"})
    src = NatsSource(NatsSettings.from_table({"servers": url, "stream": STREAM,
                                              "subjects": subs}), plan)
    n = 0
    t0 = time.perf_counter()
    try:
        for sub in subs:
            part = src.open(sub, None)
            end = part.end()
            assert end is not None
            while part.position < end:
                chunk = part.poll(batch, 5000)
                assert chunk is not None
                n += chunk.events.height + chunk.bad.height
            part.close()
    finally:
        src.close()
    return n, time.perf_counter() - t0


def run_job(url: str, subs: list[str], work: Path) -> tuple[float | None, str]:
    """``sealstream run`` of the standard pipeline on the stream: (seconds, note)."""
    from sealstream.testing.specs import spec_text

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    spec = work / "pipeline.toml"
    source = (f'kind = "nats"\nservers = "{url}"\nstream = "{STREAM}"\n'
              f'subjects = {json.dumps(subs)}\nstop = "end"')
    spec.write_text(spec_text("nats_bench", source, every_ms=1000))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec)], cwd=work,
                          capture_output=True, text=True, check=False)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return None, lines[-1] if lines else f"exit {proc.returncode}"
    return dt, ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--subjects", type=int, default=3)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    from sealstream.testing.brokers import NatsServer
    from sealstream.testing.datagen import generate

    tmp = Path(tempfile.mkdtemp(prefix="sealstream-bench-nats-"))
    subs = subjects(args.subjects)
    try:
        files = generate(tmp / "data", events=args.events, keys=args.keys,
                         partitions=args.subjects, seed=0)
        with NatsServer(data_dir=tmp / "nats") as server:
            t0 = time.perf_counter()
            total = publish(server.url, [Path(f) for f in files], subs)
            print(f"published {total:,} messages in {time.perf_counter() - t0:.1f} s")
            rows: dict[str, list[float]] = {"bare nats-py": [], "bare nats-py, inbox pull": [],
                                            "sealstream source": [], "sealstream run": []}
            note = ""
            for r in range(args.repeat):
                n, dt = bare(server.url, subs, args.batch)
                assert n == total, (n, total)
                rows["bare nats-py"].append(n / dt)
                n, dt = bare_raw(server.url, subs, args.batch)
                assert n == total, (n, total)
                rows["bare nats-py, inbox pull"].append(n / dt)
                n, dt = ours(server.url, subs, args.batch)
                assert n == total, (n, total)
                rows["sealstream source"].append(n / dt)
                run_dt, note = run_job(server.url, subs, tmp / f"run{r}")
                if run_dt is not None:
                    rows["sealstream run"].append(total / run_dt)
                print(f"repeat {r + 1}: " + ", ".join(
                    f"{k} {v[-1]:,.0f}/s" for k, v in rows.items() if v))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(args, total, rows, note)
    return 0


def report(args: Any, total: int, rows: dict[str, list[float]], note: str) -> None:
    base = statistics.median(rows["bare nats-py"])
    lines = [
        "# NATS JetStream source",
        "",
        f"{total:,} events of the standard workload in one file-backed stream, "
        f"{args.subjects} subjects (one partition each), on a local nats-server; "
        f"fetch/poll batches of {args.batch:,}; median of {args.repeat}. "
        "Produced by `python -m bench.nats`.",
        "",
        "| reader | events/s | vs bare nats-py | vs bare inbox pull |",
        "|---|---:|---:|---:|",
    ]
    inbox = statistics.median(rows["bare nats-py, inbox pull"])
    for name, rates in rows.items():
        if rates:
            med = statistics.median(rates)
            lines.append(f"| {name} | {med:,.0f} | {med / base:.0%} | {med / inbox:.0%} |")
        else:
            lines.append(f"| {name} | - | not measured: {note or 'no run'} | - |")
    lines += [
        "",
        "`bare nats-py`: a pull consumer per subject, nats-py's `fetch` in batches, "
        "`json.loads` of each value. `bare nats-py, inbox pull`: the same consumer asked "
        "with pull requests answered at an inbox, messages collected by a callback (the "
        "technique sealstream's source uses), `json.loads` of each value. "
        "`sealstream source`: `NatsSource.poll` (typed columns, bad-record "
        "checks, gap checks). `sealstream run`: the whole job (tumbling 60 s, count and "
        "sum, checkpoint every second, `stop = \"end\"`), process start included.",
        "",
        f"Machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end "
        "of the run (other jobs share the machine: compare rows of one run, not runs).",
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nats.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
