"""The live-worker case shared by tests/distributed/test_live_*.py: a 3-partition
Kafka topic (late events, bad records, integer keys), the output of one process
reading it to its end, the spec of a run over it in a test's directory, a
DistributedJob of it, and a progress hook that SIGKILLs a worker.

The story is made once per test process (the ``live_story`` fixture of
tests/distributed/conftest.py): the tests only read its topic and write their
outputs in directories of their own.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
if str(SCENARIOS) not in sys.path:  # _kafka_story imports _story as its neighbour
    sys.path.append(str(SCENARIOS))

from _kafka_story import kafka_source_spec, produce_input  # noqa: E402
from _story import assert_same_output, make_input, run, write_spec  # noqa: E402

EVENTS = 600
BATCH = 40
__all__ = ["BATCH", "EVENTS", "SPEC", "KillWorker", "LiveStory", "assert_same_output",
           "kafka_source_spec", "live_job", "live_spec", "make_input", "make_story",
           "produce_input", "run", "write_spec"]

SPEC: dict[str, Any] = {"every_events": 150, "batch_size": BATCH, "errors": True}


@dataclass(frozen=True)
class LiveStory:
    """The topic, the input files' names it was produced from, and the directory
    holding one process's output of it."""

    dir: Path
    names: list[str]
    topic: str


def make_story(bootstrap: str, d: Path) -> LiveStory:
    """Produce the topic and run one process over it to its end, in ``d``."""
    names = make_input(d, events=EVENTS, bad_every=97)
    topic = produce_input(bootstrap, d, names)
    spec = write_spec(d, names, **SPEC)
    kafka_source_spec(spec, bootstrap, topic)
    res = run(spec)
    assert res.returncode == 0, res.stderr
    return LiveStory(d, names, topic)


def live_spec(d: Path, bootstrap: str, story: LiveStory) -> Path:
    """The story's spec (Kafka source, ``stop = "end"``) with its outputs in ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    spec = write_spec(d, story.names, **SPEC)
    kafka_source_spec(spec, bootstrap, story.topic)
    return spec


def live_job(spec: Path, workers: int, **kw: Any) -> Any:
    """A DistributedJob of ``spec`` on ``workers`` workers (the connected Ray)."""
    from sealstream import load_spec
    from sealstream.distributed import DistributedJob

    return DistributedJob(load_spec(spec), workers=workers, **kw)


class KillWorker:
    """A progress hook that SIGKILLs one worker after a randomly drawn step."""

    def __init__(self, rng: random.Random, steps: int) -> None:
        self.rng, self.at, self.step = rng, rng.randrange(2, steps), 0
        self.killed: list[int] = []

    def __call__(self, job: Any) -> None:
        self.step += 1
        if self.step >= self.at and not self.killed and job.worker_pids:
            pid = self.rng.choice(job.worker_pids)
            os.kill(pid, signal.SIGKILL)
            self.killed.append(pid)
