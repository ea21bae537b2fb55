"""Shared pieces of the live crash stories (growing files, a NATS stream): a job
with ``stop = "never"`` run in a subprocess, its stderr read by one pump thread,
SIGKILLed after its k-th checkpoint line (never after a fixed time) while a feeder
thread keeps adding input, its newest checkpoint damaged between restarts; the
recorded plan (``SEALSTREAM_KEEP_PLANS``) replayed into a fresh checkpoint store,
and the committed output read back for comparison."""

from __future__ import annotations

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

import sealstream
from sealstream.checkpoint.manifest import KEY_ENV
from sealstream.testing.specs import files_source, spec_text, tumbling

SRC = Path(sealstream.__file__).resolve().parents[1]


def live_spec(pipeline: str, source: str, idle_ms: int | None = None) -> str:
    """A spec of the live stories: pipeline ``pipeline``, the ``[source]`` section's
    lines ``source`` (its key and time included), then the same watermark (``idle_ms``
    when given), window, aggregates, outputs and checkpoints (every 50 ms, 2 kept)."""
    return spec_text(pipeline, source, key=None, time=None, max_delay_ms=500, idle_ms=idle_ms,
                     window=tumbling(1000), late=True, errors=True, every_ms=50, keep=2)


def files_spec(stop: str, idle_ms: int | None = None) -> str:
    """The spec of the growing-file stories: in/*.jsonl followed (polled every
    20 ms) until ``stop``."""
    source = files_source(["in/*.jsonl"]) + f"""
key = "user"
time = "ts"
follow = true
poll_ms = 20
stop = "{stop}"
"""
    return live_spec("live", source, idle_ms)


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(SRC)
    e["SEALSTREAM_KEEP_PLANS"] = "1"
    for k in (KEY_ENV, "SEALSTREAM_CRASH_AT", "SEALSTREAM_PAUSE_AT"):
        e.pop(k, None)
    return e


def start(d: Path, spec: str = "spec.toml") -> subprocess.Popen[str]:
    """The job of ``spec`` in ``d``, its stderr piped (read it through ``Log``)."""
    return subprocess.Popen(
        [sys.executable, "-m", "sealstream", "run", spec, "--json"], cwd=d, env=env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the job (its log pump closes the pipe when it has drained it)."""
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def run_quiet(d: Path, spec: str = "spec.toml", timeout: float | None = None) -> None:
    """A ``--quiet`` run of ``spec`` in ``d`` to its end; it must exit 0."""
    r = subprocess.run([sys.executable, "-m", "sealstream", "run", spec, "--quiet"],
                       cwd=d, env=env(), capture_output=True, text=True, timeout=timeout,
                       check=False)
    assert r.returncode == 0, r.stderr


class Log:
    """The job's stderr, read by a thread into a queue (lines in order)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        with self.proc.stderr:
            for text in self.proc.stderr:
                self.lines.put(text)
        self.lines.put("")

    def next(self, give_up: Callable[[], bool] | None = None) -> str | None:
        """The next line; "" at the end; None when ``give_up`` said so."""
        while True:
            try:
                text = self.lines.get(timeout=0.5 if give_up is not None else None)
            except queue.Empty:
                assert give_up is not None
                if give_up():
                    return None
                continue
            self.seen.append(text)
            return text

    def checkpoints(self, n: int, on_checkpoint: Callable[[], None] | None = None,
                    give_up: Callable[[], bool] | None = None) -> list[str]:
        """Read until the n-th checkpoint line; the checkpoint lines read. With
        ``give_up``: stop early once it is true and the job has logged nothing for a
        while (a job that has caught up with finished input logs no checkpoints)."""
        found: list[str] = []
        while len(found) < n:
            text = self.next(give_up)
            if text is None:
                break
            if not text:
                self.proc.wait()
                raise AssertionError(
                    f"the job ended (rc={self.proc.returncode}): {''.join(self.seen)}")
            if text.startswith('{"event": "checkpoint"'):
                found.append(text)
                if on_checkpoint is not None:
                    on_checkpoint()
        return found

    def wait_for(self, fragment: str) -> None:
        while True:
            text = self.next()
            assert text, f"the job ended without logging {fragment!r}: {''.join(self.seen)}"
            if fragment in text:
                return

    def rest(self) -> str:
        """Everything until the job closed its stderr."""
        while self.next():
            pass
        self.proc.wait()
        return "".join(self.seen)


class Feeder(threading.Thread):
    """Adds a round of input per credit (subclasses write the rounds): the job's
    checkpoints hand the credits out, so input keeps arriving while the job runs
    (and its kills fall mid-stream)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.credits = threading.Semaphore(4)


def damage_newest(d: Path, rng: random.Random, *, only_with_older: bool) -> None:
    """Flip a byte of a file of the newest checkpoint; with ``only_with_older``, only
    while an older one remains (where damaging the only one is a refusal by
    contract, not a fall-back)."""
    cps = sorted((d / "ckpt").glob("cp-*"))
    if len(cps) < (2 if only_with_older else 1):
        return
    files = sorted(p for p in cps[-1].iterdir() if p.is_file())
    if not files:
        return
    f = rng.choice(files)
    data = bytearray(f.read_bytes())
    if data:
        data[rng.randrange(len(data))] ^= 0x5A
        f.write_bytes(bytes(data))


def kill_while_fed(d: Path, spec: str, feeder: Feeder, rng: random.Random, *,
                   only_with_older: bool) -> int:
    """Start ``feeder``; while it is alive, run the job of ``spec`` in ``d`` and
    SIGKILL it after its k-th checkpoint line (k random in 1..4; each checkpoint
    line hands the feeder 1 to 3 credits), or once the feeder has finished and the
    job logs nothing; after a kill, half the time ``damage_newest``. Joins the
    feeder; returns the number of kills."""
    feeder.start()

    def credit() -> None:
        for _ in range(rng.randint(1, 3)):
            feeder.credits.release()

    kills = 0
    while feeder.is_alive():
        proc = start(d, spec)
        try:
            Log(proc).checkpoints(rng.randint(1, 4), credit,
                                  give_up=lambda: not feeder.is_alive())
        finally:
            kill(proc)
        kills += 1
        if rng.random() < 0.5:
            damage_newest(d, rng, only_with_older=only_with_older)
    feeder.join()
    return kills


def committed(d: Path) -> dict[str, list[str]]:
    """The committed lines of out, late and errors, each sorted."""
    out: dict[str, list[str]] = {}
    for role in ("out", "late", "errors"):
        lines: list[str] = []
        for f in sorted((d / role).glob("part-*.jsonl")):
            lines += f.read_text(encoding="utf-8").splitlines()
        out[role] = sorted(lines)
    return out


def copy_plans(d: Path, ref: Path) -> None:
    """A fresh checkpoint store in ``ref`` holding only the step plans recorded in
    ``d`` (for one uninterrupted run of the same plan)."""
    (ref / "ckpt").mkdir(parents=True, mode=0o700)
    shutil.copytree(d / "ckpt" / "plans", ref / "ckpt" / "plans")
