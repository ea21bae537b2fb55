"""Story: a never-ending Kafka job, telling its consumer group the positions after
each checkpoint, while its broker is SIGKILLed and restarted again and again. The
process survives every restart (shorter than ``fail_after_ms``; librdkafka aborted it
with ``rd_kafka_enq_once_del_source_return: eonce->refcnt > 0`` when the group's
offsets went out as an admin request nobody waited for), keeps checkpointing, and a
``stop = "end"`` run then gives the results of the same events in files, exactly once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_kafka_runs import file_source, kafka_source, produce_lines, results, run, write_spec

from sealstream.testing.datagen import generate

ck = pytest.importorskip("confluent_kafka")

RESTARTS = 3
#: how long the broker stays away: longer than a group request's timeout (5 s), so
#: that requests in flight time out while it is down (what made librdkafka abort)
DOWN_S = 7.0


class _Events:
    """The run's JSON event lines (stderr), collected by a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.checkpoints: list[dict[str, Any]] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict) and ev.get("event") == "checkpoint":
                self.checkpoints.append(ev)

    def wait_checkpoints(self, n: int, limit_s: float = 180) -> None:
        deadline = time.monotonic() + limit_s
        while len(self.checkpoints) < n:
            code = self.proc.poll()
            assert code is None, (f"the run ended with {code} (-6: SIGABRT) while the broker "
                                  f"restarted: {self.lines[-5:]}")
            assert time.monotonic() < deadline, f"no checkpoint {n}: {self.lines[-5:]}"
            time.sleep(0.05)

    def finish(self) -> int:
        code = self.proc.wait(120)
        self._t.join(30)
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        return code


def test_broker_sigkilled_and_restarted_while_the_job_fetches(
        own_kafka: Any, tmp_path: Path) -> None:
    files = generate(tmp_path / "data", events=6000, keys=20, partitions=2, seed=8)
    topic = own_kafka.new_topic(partitions=2)
    produce_lines(own_kafka.bootstrap, topic, files, pause_every=500)
    own_kafka.broker.stop()  # a graceful stop persists every record (a SIGKILL may not)
    own_kafka.broker.start()
    d = tmp_path / "run"
    # the default consumer group (the pipeline's name) is told after each checkpoint
    never = write_spec(d, kafka_source(own_kafka.bootstrap, topic, stop="never",
                                       extra="fail_after_ms = 120000"), every="every_ms = 100")
    proc = subprocess.Popen([sys.executable, "-m", "sealstream", "run", str(never)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    events = _Events(proc)
    try:
        events.wait_checkpoints(1)
        for _ in range(RESTARTS):
            seen = len(events.checkpoints)
            own_kafka.broker.kill()
            time.sleep(DOWN_S)  # the outage's length (the verdict waits for checkpoints)
            own_kafka.broker.start()
            # the job goes on: checkpoints after the broker is back (each tells the group)
            events.wait_checkpoints(seen + 3)
        proc.send_signal(signal.SIGINT)
        assert events.finish() == 0, events.lines[-5:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
    end = write_spec(d, kafka_source(own_kafka.bootstrap, topic, stop="end"), name="end.toml")
    r = run(end)
    assert r.returncode == 0, r.stderr
    ref = tmp_path / "ref"
    assert run(write_spec(ref, file_source(files))).returncode == 0
    got = results(d)
    assert len(got) == len({g[:3] for g in got})  # exactly once
    assert got == results(ref)
