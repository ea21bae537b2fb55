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
import random
import sys
from pathlib import Path
from typing import Any

import pytest

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
if str(SCENARIOS) not in sys.path:
    sys.path.insert(0, str(SCENARIOS))

from _live_story import (  # noqa: E402
    Feeder,
    committed,
    copy_plans,
    kill_while_fed,
    live_spec,
    run_quiet,
)

SEEDS = list(range(int(os.environ.get("SEALSTREAM_NATS_LIVE_SEEDS", "1"))))
ROUNDS = 24
PER_ROUND = 40


def spec_text(jet: Any, stop: str) -> str:
    subjects = json.dumps([jet.s(p) for p in ("a", "b", "c")])
    return live_spec("nats_live", f"""
kind = "nats"
servers = "{jet.url}"
stream = "{jet.stream}"
subjects = {subjects}
key = "user"
time = "ts"
stop = "{stop}"
""")


def run_end(d: Path) -> None:
    run_quiet(d, "end.toml", timeout=300)


def message(user: str, ts: int, amount: int) -> bytes:
    return json.dumps({"user": user, "ts": ts, "amount": amount}).encode()


class Producer(Feeder):
    """Publishes rounds of messages to subjects a and b, to c from halfway, a late
    message and a bad one now and then. The content is fixed; only its timing
    varies (a round per credit; the job's checkpoints hand credits out)."""

    def __init__(self, jet: Any) -> None:
        super().__init__()
        self.jet = jet
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
    # damaging the only checkpoint is a refusal by contract, not a fall-back
    kills = kill_while_fed(d, "never.toml", producer, rng, only_with_older=True)
    assert producer.error is None, producer.error
    run_end(d)
    got = committed(d)

    # one uninterrupted run of the recorded plan: same stream, a fresh store
    ref = tmp_path / "ref"
    copy_plans(d, ref)
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
