"""Story: a producer keeps publishing to a JetStream stream WHILE the job
(``kind = "nats"``, ``stop = "never"``) is SIGKILLed at random instants, its newest
checkpoint damaged between restarts (only while an older one remains). Once the
producer has stopped, a ``stop = "end"`` run finishes. The committed output (out,
late, errors) equals, byte for byte after sorting, one uninterrupted run of the same
recorded plan (``SEALSTREAM_KEEP_PLANS``, replayed into a fresh checkpoint store),
and every published message is counted exactly once.

Kill instants are calibrated on the job's own checkpoint log lines (killed after the
k-th, k random), never on a timer; the producer is paced by the same lines, so
messages arrive while the job runs. Seeds: ``SEALSTREAM_NATS_LIVE_SEEDS`` (default 1).
"""

from __future__ import annotations

import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import sealstream
from sealstream.checkpoint.manifest import KEY_ENV

SRC = Path(sealstream.__file__).resolve().parents[1]
SEEDS = list(range(int(os.environ.get("SEALSTREAM_NATS_LIVE_SEEDS", "1"))))
ROUNDS = 24
PER_ROUND = 40


def spec_text(jet: Any, stop: str) -> str:
    subjects = json.dumps([jet.s(p) for p in ("a", "b", "c")])
    return f"""
[pipeline]
name = "nats_live"

[source]
kind = "nats"
servers = "{jet.url}"
stream = "{jet.stream}"
subjects = {subjects}
key = "user"
time = "ts"
stop = "{stop}"

[watermark]
max_delay_ms = 500

[window]
kind = "tumbling"
size_ms = 1000

[aggregates]
n = "count"
total = "sum(amount)"

[sink]
kind = "jsonl"
path = "out"

[late]
kind = "jsonl"
path = "late"

[errors]
kind = "jsonl"
path = "errors"

[checkpoint]
path = "ckpt"
every_ms = 50
keep = 2
"""


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(SRC)
    e["SEALSTREAM_KEEP_PLANS"] = "1"
    for k in (KEY_ENV, "SEALSTREAM_CRASH_AT", "SEALSTREAM_PAUSE_AT"):
        e.pop(k, None)
    return e


def run_end(d: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "sealstream", "run", "end.toml", "--quiet"],
                       cwd=d, env=env(), capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.returncode == 0, r.stderr


class Job:
    """A ``stop = "never"`` run whose stderr (its JSON event lines) a thread reads."""

    def __init__(self, d: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sealstream", "run", "never.toml"], cwd=d, env=env(),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        with self.proc.stderr:
            for text in self.proc.stderr:
                self.lines.put(text)
        self.lines.put("")

    def checkpoints(self, n: int, on_checkpoint: Callable[[], None],
                    give_up: Callable[[], bool]) -> None:
        """Read until the n-th checkpoint line, or until ``give_up`` is true while
        the job logs nothing (one that has caught up with a finished producer)."""
        found = 0
        while found < n:
            try:
                text = self.lines.get(timeout=0.5)
            except queue.Empty:
                if give_up():
                    return
                continue
            self.seen.append(text)
            if not text:
                self.proc.wait()
                raise AssertionError(
                    f"the job ended (rc={self.proc.returncode}): {''.join(self.seen)}")
            if text.startswith('{"event": "checkpoint"'):
                found += 1
                on_checkpoint()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def message(user: str, ts: int, amount: int) -> bytes:
    return json.dumps({"user": user, "ts": ts, "amount": amount}).encode()


class Producer(threading.Thread):
    """Publishes rounds of messages to subjects a and b, to c from halfway, a late
    message and a bad one now and then. The content is fixed; only its timing
    varies (a round per credit; the job's checkpoints hand credits out)."""

    def __init__(self, jet: Any) -> None:
        super().__init__(daemon=True)
        self.jet = jet
        self.credits = threading.Semaphore(4)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for r in range(ROUNDS):
                self.credits.acquire()
                items: list[tuple[str, bytes | dict[str, Any]]] = []
                for subject, user in (("a", "x"), ("b", "y"), ("c", "z")):
                    if subject == "c" and r < ROUNDS // 2:
                        continue
                    items += [(subject, message(f"{user}{i % 3}", r * 400 + i * 10, i))
                              for i in range(PER_ROUND)]
                    if r % 5 == 4:  # far behind the watermark: late (or on time after
                        items.append((subject, message(user, 0, 7)))  # a restart's plan)
                    if r % 7 == 3:
                        items.append((subject, b"not json"))
                self.jet.publish(items)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


def damage_newest(d: Path, rng: random.Random) -> None:
    """Flip a byte of a file of the newest checkpoint while an older one remains
    (damaging the only one is a refusal by contract, not a fall-back)."""
    cps = sorted((d / "ckpt").glob("cp-*"))
    if len(cps) < 2:
        return
    files = sorted(p for p in cps[-1].iterdir() if p.is_file())
    if not files:
        return
    f = rng.choice(files)
    data = bytearray(f.read_bytes())
    if data:
        data[rng.randrange(len(data))] ^= 0x5A
        f.write_bytes(bytes(data))


def committed(d: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for role in ("out", "late", "errors"):
        lines: list[str] = []
        for f in sorted((d / role).glob("part-*.jsonl")):
            lines += f.read_text(encoding="utf-8").splitlines()
        out[role] = sorted(lines)
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_random_kills_while_a_producer_publishes_then_stop_end_equals_the_plan_run(
    jet: Any, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    jet.create(["a", "b", "c"])
    jet.publish([("a", message("w", 0, 0)), ("b", message("w", 0, 0))])
    d = tmp_path / "job"
    d.mkdir()
    (d / "never.toml").write_text(spec_text(jet, "never"), encoding="utf-8")
    (d / "end.toml").write_text(spec_text(jet, "end"), encoding="utf-8")
    producer = Producer(jet)
    producer.start()

    def credit() -> None:
        for _ in range(rng.randint(1, 3)):
            producer.credits.release()

    kills = 0
    while producer.is_alive():
        job = Job(d)
        try:
            job.checkpoints(rng.randint(1, 4), credit, give_up=lambda: not producer.is_alive())
        finally:
            job.kill()
        kills += 1
        if rng.random() < 0.5:
            damage_newest(d, rng)
    producer.join()
    assert producer.error is None, producer.error
    run_end(d)
    got = committed(d)

    # one uninterrupted run of the recorded plan: same stream, a fresh store
    ref = tmp_path / "ref"
    (ref / "ckpt").mkdir(parents=True, mode=0o700)
    shutil.copytree(d / "ckpt" / "plans", ref / "ckpt" / "plans")
    (ref / "end.toml").write_text(spec_text(jet, "end"), encoding="utf-8")
    run_end(ref)
    assert got == committed(ref)

    assert kills >= 3
    # every message exactly once: counted in a result or written as late, bad ones as errors
    good = 2 + ROUNDS * PER_ROUND * 2 + (ROUNDS - ROUNDS // 2) * PER_ROUND
    stale = sum(1 for r in range(ROUNDS) if r % 5 == 4) * 2 + sum(
        1 for r in range(ROUNDS // 2, ROUNDS) if r % 5 == 4)
    bad = sum(1 for r in range(ROUNDS) if r % 7 == 3) * 2 + sum(
        1 for r in range(ROUNDS // 2, ROUNDS) if r % 7 == 3)
    assert sum(json.loads(x)["n"] for x in got["out"]) + len(got["late"]) == good + stale
    assert len(got["errors"]) == bad
    assert len(got["late"]) >= 1
