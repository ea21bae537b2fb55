"""Stories of ``sealstream run`` on a Kafka topic (a real Kafka-protocol broker):
``stop = "end"`` equals the same events in files; message keys and timestamps;
malformed messages; resume reads only what is new; expired offsets; a broker
that is not there; SIGTERM then resume; SIGKILLs at random instants while a
producer keeps writing, with corrupted checkpoints: exactly once."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sealstream.testing.datagen import generate

ck = pytest.importorskip("confluent_kafka")

SPEC = """
[pipeline]
name = "kafka_story"

[source]
{source}

[watermark]
max_delay_ms = 1000

[window]
kind = "tumbling"
size_ms = 10000

[aggregates]
n = "count"
total = "sum(amount)"

[sink]
kind = "jsonl"
path = "out"

[errors]
kind = "jsonl"
path = "errors"

[late]
kind = "jsonl"
path = "late"

[checkpoint]
path = "ckpt"
{every}
keep = 4
"""


def write_spec(d: Path, source: str, every: str = "every_ms = 200",
               name: str = "spec.toml") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    spec = d / name
    spec.write_text(SPEC.format(source=source, every=every))
    return spec


def kafka_source(bootstrap: str, topic: str, stop: str = "end", key: str = "user",
                 time_field: str = "ts", extra: str = "") -> str:
    return (f'kind = "kafka"\nbootstrap = "{bootstrap}"\ntopic = "{topic}"\n'
            f'stop = "{stop}"\nkey = "{key}"\ntime = "{time_field}"\n{extra}')


def file_source(files: list[Path]) -> str:
    return f'kind = "jsonl"\npaths = {json.dumps([str(f) for f in files])}\nkey = "user"\n' \
           'time = "ts"'


def run(spec: Path, *extra: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet",
                           *extra], capture_output=True, text=True, timeout=timeout)


def committed(d: Path, sub: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for f in sorted((d / sub).glob("*.jsonl")) if (d / sub).is_dir() else []:
        if not f.name.startswith((".", "_")):
            out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


def results(d: Path) -> list[tuple[Any, ...]]:
    """Committed results, sorted; totals rounded (a float sum's last bits depend on
    the order of its additions, i.e. on how reading was split into steps)."""
    return sorted((r["key"], r["window_start"], r["window_end"], r["n"], round(r["total"], 6))
                  for r in committed(d, "out"))


def produce_lines(bootstrap: str, topic: str, files: list[Path],
                  pause_every: int = 0, pause_s: float = 0.0) -> int:
    """File i's lines into partition i (in order); optionally paced."""
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    n = 0
    lines = [[ln for ln in f.read_bytes().split(b"\n") if ln] for f in files]
    at = [0] * len(files)
    while any(at[i] < len(lines[i]) for i in range(len(files))):
        for i in range(len(files)):
            step = pause_every or len(lines[i])
            for ln in lines[i][at[i]:at[i] + step]:
                p.produce(topic, ln, partition=i)
                n += 1
            at[i] += step
        p.poll(0)
        if pause_s:
            p.flush(30)
            time.sleep(pause_s)
    assert p.flush(60) == 0
    return n


def test_stop_end_reads_what_files_would(kafka: Any, tmp_path: Path) -> None:
    files = generate(tmp_path / "data", events=6000, keys=40, partitions=3, bad_fraction=0.01,
                     late_fraction=0.01, seed=1)
    topic = kafka.new_topic(partitions=3)
    produce_lines(kafka.bootstrap, topic, files)
    k = tmp_path / "kafka"
    group = f"g-{topic}"
    r = run(write_spec(k, kafka_source(kafka.bootstrap, topic, extra=f'group = "{group}"')))
    assert r.returncode == 0, r.stderr
    # the group was told the final checkpoint's offsets (for lag tools)
    c = ck.Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group})
    tps = c.committed([ck.TopicPartition(topic, i) for i in range(3)], timeout=30)
    c.close()
    assert [tp.offset for tp in tps] == [
        sum(1 for ln in f.read_bytes().split(b"\n") if ln) for f in files]
    f = tmp_path / "files"
    r = run(write_spec(f, file_source(files)))
    assert r.returncode == 0, r.stderr
    assert results(k) == results(f) and results(k)
    # bad records and late events: the same offsets, named by topic/partition
    names = {str(p): f"{topic}/{i}" for i, p in enumerate(files)}
    for sub in ("errors", "late"):
        got = sorted((r["_partition"], r["_offset"]) for r in committed(k, sub))
        want = sorted((names[r["_partition"]], r["_offset"]) for r in committed(f, sub))
        assert got == want and got, sub
    # resume: a second run reads only what was produced since
    more = generate(tmp_path / "more", events=300, keys=5, partitions=3, seed=2,
                    start_ms=1_800_000_000_000)
    produce_lines(kafka.bootstrap, topic, more)
    summary = tmp_path / "summary.json"
    r = run(k / "spec.toml", "--summary-json", str(summary))
    assert r.returncode == 0, r.stderr
    assert json.loads(summary.read_text())["this_run"]["events"] == 300


def test_message_keys_and_timestamps(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.new_topic(partitions=1)
    p = ck.Producer({"bootstrap.servers": kafka.bootstrap})
    rows = [(b"a", 1_000, 1.0), (b"b", 2_000, 2.0), (b"a", 3_000, 4.0), (None, 4_000, 8.0),
            (b"a", 12_000, 16.0)]
    for key, ts, amount in rows:
        p.produce(topic, json.dumps({"amount": amount}).encode(), key=key, timestamp=ts,
                  partition=0)
    p.produce(topic, b"{oops", key=b"a", timestamp=5_000, partition=0)
    assert p.flush(30) == 0
    d = tmp_path / "run"
    r = run(write_spec(d, kafka_source(kafka.bootstrap, topic, key="@key",
                                       time_field="@timestamp")))
    assert r.returncode == 0, r.stderr
    got = {(x["key"], x["window_start"]): (x["n"], x["total"]) for x in committed(d, "out")}
    assert got == {("a", 0): (2, 5.0), ("b", 0): (1, 2.0), ("a", 10_000): (1, 16.0)}
    bad = sorted((x["_partition"], x["_offset"]) for x in committed(d, "errors"))
    assert bad == [(f"{topic}/0", 3), (f"{topic}/0", 5)]
    # checkpoints inspect --spec: the lag against the broker's end offset, now
    for _ in range(2):
        p.produce(topic, b'{"amount": 1}', key=b"a", partition=0)
    assert p.flush(30) == 0
    res = subprocess.run([sys.executable, "-m", "sealstream", "checkpoints", "inspect",
                          str(d / "ckpt"), "--json", "--spec", str(d / "spec.toml")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    parts = json.loads(res.stdout)["partitions"]
    assert [(x["next_offset"], x["end_offset"], x["lag"]) for x in parts] == [(6, 8, 2)]


def _delete_records(bootstrap: str, topic: str, partition: int, before: int) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.delete_records([ck.TopicPartition(topic, partition, before)]).values():
        f.result(30)


def test_expired_offsets_refuse_to_resume(kafka: Any, tmp_path: Path) -> None:
    files = generate(tmp_path / "data", events=20, keys=2, partitions=1, seed=3)
    topic = kafka.new_topic(partitions=1)
    produce_lines(kafka.bootstrap, topic, files)
    d = tmp_path / "run"
    spec = write_spec(d, kafka_source(kafka.bootstrap, topic))
    assert run(spec).returncode == 0
    produce_lines(kafka.bootstrap, topic, files)  # 20 more: offsets 20..39
    _delete_records(kafka.bootstrap, topic, 0, 25)
    r = run(spec)
    assert r.returncode == 1
    msg = r.stderr.strip().splitlines()[-1]
    assert f"{topic}/0" in msg and "20" in msg and "25" in msg, msg
    assert "replay" in msg and "--start-over" in msg, msg


def test_a_broker_that_is_not_there_fails_the_start_naming_it(tmp_path: Path) -> None:
    from sealstream.testing.brokers import free_port

    address = f"127.0.0.1:{free_port()}"
    spec = write_spec(tmp_path, kafka_source(address, "events", extra="fail_after_ms = 1500"))
    t0 = time.monotonic()
    r = run(spec)
    assert r.returncode == 1
    assert address in r.stderr.strip().splitlines()[-1]
    assert time.monotonic() - t0 < 90  # bounded: fail_after_ms, start-up and one query


def _wait_line(proc: subprocess.Popen[str], want: Any, limit_s: float = 120) -> None:
    """Read the run's stderr lines (its JSON events) until ``want(event)``; a run
    silent for ``limit_s`` is killed by a watchdog (a hang fails, never blocks)."""
    assert proc.stderr is not None
    watchdog = threading.Timer(limit_s, proc.kill)
    watchdog.start()
    try:
        for line in proc.stderr:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if want(ev):
                return
    finally:
        watchdog.cancel()
    raise AssertionError(f"the run ended (exit {proc.wait()}) before the awaited event")


def _drain(proc: subprocess.Popen[str]) -> threading.Thread:
    assert proc.stderr is not None
    t = threading.Thread(target=proc.stderr.read, daemon=True)
    t.start()
    return t


def _finish(proc: subprocess.Popen[str], drain: threading.Thread) -> int:
    code = proc.wait(120)
    drain.join(30)
    assert proc.stderr is not None
    proc.stderr.close()
    return code


def _start(spec: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "sealstream", "run", str(spec), "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_sigint_then_sigterm_stop_a_never_ending_run_gracefully_and_it_resumes(
        kafka: Any, tmp_path: Path) -> None:
    """SIGINT stops a stop = "never" run (final checkpoint, exit 0); it resumes with
    what was produced since and SIGTERM stops it the same way; a stop = "end" run
    then finishes: the results are those of the events in files, exactly once."""
    files = generate(tmp_path / "data", events=3000, keys=20, partitions=2, seed=4)
    topic = kafka.new_topic(partitions=2)
    thirds: list[list[Path]] = [[], [], []]
    for f in files:
        lines = f.read_text().splitlines(keepends=True)
        cut = -(-len(lines) // 3)
        for i in range(3):
            part = tmp_path / f"third{i}-{f.name}"
            part.write_text("".join(lines[i * cut:(i + 1) * cut]))
            thirds[i].append(part)
    d = tmp_path / "run"
    never = write_spec(d, kafka_source(kafka.bootstrap, topic, stop="never"))
    produced = 0
    for i, sig in enumerate((signal.SIGINT, signal.SIGTERM)):
        produced += produce_lines(kafka.bootstrap, topic, thirds[i])
        proc = _start(never)
        _wait_line(proc, lambda ev, n=produced: ev.get("event") == "checkpoint"
                   and ev["events"] >= n)
        proc.send_signal(sig)
        drain = _drain(proc)
        assert _finish(proc, drain) == 0
    produce_lines(kafka.bootstrap, topic, thirds[2])
    end = write_spec(d, kafka_source(kafka.bootstrap, topic, stop="end"), name="end.toml")
    r = run(end)
    assert r.returncode == 0, r.stderr
    ref = tmp_path / "ref"
    assert run(write_spec(ref, file_source(files))).returncode == 0
    assert results(d) == results(ref)


def _corrupt_newest(d: Path, rng: random.Random) -> None:
    """Flip a byte of a file of the newest checkpoint (when an older one remains)."""
    cps = sorted((d / "ckpt").glob("cp-*"))
    if len(cps) < 2:
        return
    files = sorted(p for p in cps[-1].iterdir() if p.is_file())
    if not files:  # killed while it was being written: nothing to damage
        return
    victim = rng.choice(files)
    data = bytearray(victim.read_bytes())
    if data:
        data[rng.randrange(len(data))] ^= 0xFF
        victim.write_bytes(bytes(data))


SEEDS = [int(s) for s in os.environ.get("SEALSTREAM_KAFKA_CRASH_SEEDS", "1").split(",")]
ROUNDS = int(os.environ.get("SEALSTREAM_KAFKA_CRASH_ROUNDS", "2"))


@pytest.mark.parametrize("seed", SEEDS)
def test_random_sigkills_while_a_producer_writes_exactly_once(
        kafka: Any, tmp_path: Path, seed: int) -> None:
    """Round after round, a producer writes a slice of the events while the job
    (stop = "never") runs; the job is SIGKILLed at a random instant after its first
    checkpoint of the round (calibrated by that event, not by a timer), and the
    newest checkpoint is sometimes corrupted before it restarts. Then a
    ``stop = "end"`` run finishes: the results equal one uninterrupted run over the
    same events, exactly once (no event is late in this workload whatever the
    interleaving of partitions)."""
    rng = random.Random(seed)
    files = generate(tmp_path / "data", events=4000, keys=30, partitions=3, seed=seed)
    slices: list[list[Path]] = [[] for _ in range(ROUNDS)]
    for f in files:
        lines = f.read_text().splitlines(keepends=True)
        cut = -(-len(lines) // ROUNDS)
        for i in range(ROUNDS):
            part = tmp_path / f"slice{i}-{f.name}"
            part.write_text("".join(lines[i * cut:(i + 1) * cut]))
            slices[i].append(part)
    topic = kafka.new_topic(partitions=3)
    d = tmp_path / "run"
    never = write_spec(d, kafka_source(kafka.bootstrap, topic, stop="never"))
    end = write_spec(d, kafka_source(kafka.bootstrap, topic, stop="end"), name="end.toml")
    for i in range(ROUNDS):
        producer = threading.Thread(
            target=produce_lines, args=(kafka.bootstrap, topic, slices[i]),
            kwargs={"pause_every": 100, "pause_s": 0.02}, daemon=True)
        producer.start()  # new records arrive: the run has something to checkpoint
        proc = _start(never)
        _wait_line(proc, lambda ev: ev.get("event") == "checkpoint")
        drain = _drain(proc)
        time.sleep(rng.uniform(0.0, 0.3))  # a random instant (the kill is not a sync)
        proc.send_signal(signal.SIGKILL)
        assert _finish(proc, drain) == -signal.SIGKILL
        producer.join(120)
        if rng.random() < 0.5:
            _corrupt_newest(d, rng)
    r = run(end)
    assert r.returncode == 0, r.stderr
    ref = tmp_path / "ref"
    assert run(write_spec(ref, file_source(files))).returncode == 0
    got = results(d)
    assert len(got) == len({g[:3] for g in got})  # exactly once
    assert got == results(ref)


def test_a_bad_message_without_errors_output_stops_naming_partition_and_offset(
        kafka: Any, tmp_path: Path) -> None:
    topic = kafka.new_topic(partitions=1)
    p = ck.Producer({"bootstrap.servers": kafka.bootstrap})
    p.produce(topic, b'{"user": "a", "ts": 1, "amount": 1}', partition=0)
    p.produce(topic, b"oops", partition=0)
    assert p.flush(30) == 0
    spec = write_spec(tmp_path, kafka_source(kafka.bootstrap, topic))
    spec.write_text(spec.read_text().replace('[errors]\nkind = "jsonl"\npath = "errors"\n', ""))
    r = run(spec)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].startswith(
        f"sealstream: error: {topic}/0: offset 1: invalid JSON"), r.stderr


def test_a_broker_lost_mid_run_fails_it_after_fail_after_ms_even_with_a_group(
        own_kafka: Any, tmp_path: Path) -> None:
    """With a consumer group to tell the positions to after each checkpoint, a
    broker that goes away still fails the run (exit 1, one line naming the address)
    once fail_after_ms has passed: the group's commit never holds the run (a
    synchronous commit waited for the broker for ever). What was committed stays."""
    topic = own_kafka.new_topic(partitions=1)
    files = generate(tmp_path / "data", events=200, keys=5, partitions=1, seed=2)
    produce_lines(own_kafka.bootstrap, topic, files)
    spec = write_spec(tmp_path / "run", kafka_source(
        own_kafka.bootstrap, topic, stop="never",
        extra=f'group = "g-{topic}"\nfail_after_ms = 3000'))
    proc = subprocess.Popen([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    assert proc.stderr is not None
    drain = threading.Thread(target=lambda: lines.extend(proc.stderr or []), daemon=True)
    drain.start()
    ckpt = tmp_path / "run" / "ckpt"
    deadline = time.monotonic() + 120
    while not list(ckpt.glob("cp-*")):
        assert time.monotonic() < deadline and proc.poll() is None, lines
        time.sleep(0.05)
    time.sleep(1.0)
    own_kafka.broker.kill()
    try:
        code = _finish(proc, drain)  # a run still going after 120 s fails the test
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    assert code == 1
    errors = [ln for ln in lines if ln.startswith("sealstream: error:")]
    assert len(errors) == 1 and own_kafka.bootstrap in errors[0], lines[-5:]
    # the committed checkpoint is kept: a stop = "end" run against the broker back
    # resumes from it and reads nothing twice
    own_kafka.broker.start()
    end = write_spec(tmp_path / "run", kafka_source(own_kafka.bootstrap, topic, stop="end"),
                     name="end.toml")
    r = run(end)
    assert r.returncode == 0, r.stderr
    ref = tmp_path / "ref"
    assert run(write_spec(ref, file_source(files))).returncode == 0
    assert results(tmp_path / "run") == results(ref)
