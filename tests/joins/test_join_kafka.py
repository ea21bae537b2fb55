"""Stories of a several-source job reading Kafka topics (a real Kafka-protocol broker,
docs/joins.md): the click-through rate from two topics equals the same join over the
same events in files (results, late events and bad records); one topic and one file
source; a second run reads only what is new on either topic; an app change is refused
naming the source; SIGKILLs at random instants and damaged checkpoints: exactly once;
a topic deleted mid-run stops the run in one line naming the source and the topic."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scenarios"))

from _join_case import CTR_FIELDS, ctr_spec, source_block  # noqa: E402
from _story import (  # noqa: E402
    assert_same_output,
    committed,
    newest_checkpoint,
    run,
    run_killed_randomly,
)

ck = pytest.importorskip("confluent_kafka")

def _input(d: Path, seed: int = 7, n: int = 400, start_ms: int = 1_700_000_000_000
           ) -> dict[str, list[Path]]:
    """Two partitions per source: disorder below max_delay_ms, a few events far
    behind (late), a few bad lines."""
    rng = random.Random(seed)
    out: dict[str, list[Path]] = {}
    for src, (k, t, v) in CTR_FIELDS.items():
        out[src] = []
        for p in range(2):
            now = start_ms
            lines = []
            for i in range(n):
                now += rng.randint(0, 200)
                ts = now - rng.randint(0, 800) - (20_000 if rng.random() < 0.02 else 0)
                rec: dict[str, Any] = {k: f"ad{rng.randint(0, 8)}", t: ts,
                                       v: round(rng.uniform(0, 3), 2)}
                lines.append("{oops" if i % 97 == 50 else json.dumps(rec))
            path = d / "data" / src / f"p{p}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(lines) + "\n")
            out[src].append(path)
    return out


def _produce(bootstrap: str, topic: str, files: list[Path]) -> None:
    """File i's lines into partition i, in order."""
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i, f in enumerate(files):
        for ln in f.read_bytes().split(b"\n"):
            if ln:
                p.produce(topic, ln, partition=i)
        p.poll(0)
    assert p.flush(60) == 0


def _kafka(name: str, bootstrap: str, topic: str, stop: str = "end") -> str:
    return source_block(name, "kafka", settings={
        "bootstrap": bootstrap, "topic": topic, "stop": stop, "fail_after_ms": 20000})


def _files(name: str, files: list[Path]) -> str:
    return source_block(name, "jsonl", settings={"paths": [str(f) for f in files]})


def _spec(d: Path, sources: list[str], every: tuple[str, int] = ("every_events", 200),
          name: str = "spec.toml") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    spec = d / name
    spec.write_text(ctr_spec(
        sources, left="impressions",
        window={"kind": "tumbling", "size_ms": 5000, "allowed_lateness_ms": 500},
        aggregates={"clicks.n": "count", "clicks.bids": "sum(bid)",
                    "impressions.n": "count", "impressions.cost": "sum(cost)"},
        checkpoint={"path": "ckpt", every[0]: every[1], "keep": 20}))
    return spec


def _ok(spec: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    r = run(spec, *extra)
    assert r.returncode == 0, r.stderr
    return r


def _renamed(d: Path, to: Path, names: dict[str, str]) -> Path:
    """A copy of a run's output over files, with the partitions in ``names`` named as
    the topics' (file i of a source is partition i of its topic: same offsets), their
    bad records named by offset."""
    for sub in ("out", "late", "errors"):
        (to / sub).mkdir(parents=True)
        for f in (d / sub).glob("*.jsonl"):
            rows = [json.loads(ln) for ln in f.read_text().splitlines() if ln.strip()]
            for r in rows:
                if r.get("_partition") in names:
                    r["_partition"] = names[r["_partition"]]
                    if sub == "errors":
                        r["_line"] = r["_offset"]
            (to / sub / f.name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return to


def test_ctr_from_two_topics_equals_the_same_join_from_files(kafka: Any, tmp_path: Path
                                                              ) -> None:
    files = _input(tmp_path)
    topics = {src: kafka.new_topic(partitions=2) for src in CTR_FIELDS}
    for src, t in topics.items():
        _produce(kafka.bootstrap, t, files[src])
    ref = _spec(tmp_path / "files", [_files(s, files[s]) for s in CTR_FIELDS])
    _ok(ref)
    names = {str(f): f"{topics[s]}/{i}" for s in CTR_FIELDS for i, f in enumerate(files[s])}
    assert committed(ref.parent, "late") and committed(ref.parent, "errors")
    assert any(r["clicks.n"] is None for r in committed(ref.parent, "out"))  # left join

    both = _spec(tmp_path / "kafka", [_kafka(s, kafka.bootstrap, topics[s]) for s in CTR_FIELDS])
    _ok(both)
    assert_same_output(both.parent, _renamed(ref.parent, tmp_path / "want-both", names))

    # one topic and one file source: the same again
    mixed = _spec(tmp_path / "mixed", [_kafka("clicks", kafka.bootstrap, topics["clicks"]),
                                       _files("impressions", files["impressions"])])
    _ok(mixed)
    clicks = {n: t for n, t in names.items() if t.startswith(topics["clicks"])}
    assert_same_output(mixed.parent, _renamed(ref.parent, tmp_path / "want-mixed", clicks))

    # the checkpoint bound both topics' positions: a second run reads only what is new
    more = _input(tmp_path / "more", seed=8, n=50, start_ms=1_800_000_000_000)
    for src, t in topics.items():
        _produce(kafka.bootstrap, t, more[src])
    summary = tmp_path / "summary.json"
    _ok(both, "--summary-json", str(summary))
    this_run = json.loads(summary.read_text())["this_run"]
    assert this_run["events"] + this_run["bad_records"] == 4 * 50

    # a replay from the start into a new destination reads both topics again: the
    # output of the two runs, once
    dest = tmp_path / "replayed"
    r = subprocess.run([sys.executable, "-m", "sealstream", "replay", str(both), "--from",
                        "start", "--to", str(dest), "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert_same_output(dest, both.parent)
    # and from partition offsets (named as the union names them): offset 0 of every
    # partition of both topics is the start again
    origin = ",".join(f"{t}/{i}=0" for t in topics.values() for i in range(2))
    dest = tmp_path / "replayed-offsets"
    r = subprocess.run([sys.executable, "-m", "sealstream", "replay", str(both), "--from",
                        origin, "--to", str(dest), "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert_same_output(dest, both.parent)


def test_an_app_change_is_refused_naming_the_source(kafka: Any, tmp_path: Path) -> None:
    files = _input(tmp_path, n=50)
    topics = {src: kafka.new_topic(partitions=2) for src in CTR_FIELDS}
    for src, t in topics.items():
        _produce(kafka.bootstrap, t, files[src])
    spec = _spec(tmp_path / "job", [_kafka(s, kafka.bootstrap, topics[s]) for s in CTR_FIELDS])
    _ok(spec)
    other = kafka.new_topic(partitions=2)
    spec.write_text(spec.read_text().replace(topics["clicks"], other))
    r = run(spec)
    assert r.returncode != 0
    assert f'sources.clicks.partitions: ["{topics["clicks"]}"] -> ["{other}"]' in r.stderr, \
        r.stderr


def test_random_sigkills_and_damaged_checkpoints_exactly_once(kafka: Any, tmp_path: Path
                                                              ) -> None:
    """The topics hold every event; the job (stop = "end") is killed after its 3rd
    checkpoint, its newest state damaged, killed after its 2nd, its newest manifest
    truncated, then SIGKILLed at random instants until it finishes: the output equals
    an uninterrupted run's, exactly once (recorded steps replayed as planned)."""
    files = _input(tmp_path, seed=3, n=600)
    topics = {src: kafka.new_topic(partitions=2) for src in CTR_FIELDS}
    for src, t in topics.items():
        _produce(kafka.bootstrap, t, files[src])
    sources = [_kafka(s, kafka.bootstrap, topics[s]) for s in CTR_FIELDS]
    clean = _spec(tmp_path / "clean", sources, every=("every_events", 150))
    started = time.monotonic()
    _ok(clean)
    typical = time.monotonic() - started

    spec = _spec(tmp_path / "chaos", sources, every=("every_events", 150))
    d = spec.parent
    assert run(spec, crash_at="after_retention:3").returncode == -signal.SIGKILL
    state = newest_checkpoint(d) / "state.arrow"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    assert run(spec, crash_at="after_retention:2").returncode == -signal.SIGKILL
    manifest = newest_checkpoint(d) / "MANIFEST.json"
    manifest.write_bytes(manifest.read_bytes()[:40])
    assert run_killed_randomly(spec, random.Random(5), typical) >= 1
    assert any((d / "ckpt" / "rejected").iterdir())
    assert_same_output(d, clean.parent)


def _wait_event(proc: subprocess.Popen[str], want: Any, limit_s: float = 120) -> None:
    """Read the run's JSON event lines on stderr until ``want(event)``; a silent run
    is killed by a watchdog (a hang fails, never blocks)."""
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


def test_a_topic_deleted_mid_run_stops_it_in_one_line(kafka: Any, tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient

    files = _input(tmp_path, n=100)
    topics = {src: kafka.new_topic(partitions=2) for src in CTR_FIELDS}
    for src, t in topics.items():
        _produce(kafka.bootstrap, t, files[src])
    spec = _spec(tmp_path / "job", [_kafka(s, kafka.bootstrap, topics[s], stop="never")
                                    for s in CTR_FIELDS], every=("every_ms", 200))
    proc = subprocess.Popen([sys.executable, "-m", "sealstream", "run", str(spec), "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_event(proc, lambda ev: ev.get("event") == "checkpoint")
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        for f in admin.delete_topics([topics["impressions"]]).values():
            f.result(30)
        assert proc.stderr is not None
        err = proc.stderr.read()
        assert proc.wait(120) == 1, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        assert proc.stderr is not None
        proc.stderr.close()
    lines = [ln for ln in err.splitlines() if not ln.startswith("{")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"sources.impressions: kafka topic '{topics['impressions']}' disappeared" \
        in lines[0], lines[0]
    # what was committed before stays committed, once
    got = [(r["key"], r["window_start"]) for r in committed(spec.parent, "out")]
    assert len(got) == len(set(got))


BAD = {
    "stop never beside a bounded file": (
        'kind = "kafka"\nbootstrap = "127.0.0.1:1"\ntopic = "c"\nstop = "never"\n'
        'key = "ad"\ntime = "ts"',
        "sources.clicks.stop: every source of a several-source job stops the same way"),
    "parquet beside a topic": (
        'kind = "kafka"\nbootstrap = "127.0.0.1:1"\ntopic = "c"\nstop = "end"\n'
        'key = "ad"\ntime = "ts"',
        "sources.impressions.kind: 'parquet': a parquet file source is not supported yet "
        "in a several-source job with a live source"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_live_setting_not_supported_is_one_line(case: str, tmp_path: Path) -> None:
    clicks, want = BAD[case]
    kind = "parquet" if "parquet" in case else "jsonl"
    data = tmp_path / f"imp.{kind}"
    data.write_bytes(b"")
    spec = _spec(tmp_path, [f"[sources.clicks]\n{clicks}\n",
                            f'[sources.impressions]\nkind = "{kind}"\npaths = ["{data}"]\n'
                            'key = "ad_id"\ntime = "shown_at"\n'])
    r = run(spec)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and want in lines[0], r.stderr
