"""Stories with a Kafka source and Kafka outputs: the job reads a topic to its end
and writes results, late events and bad records to three topics. Killed at every
protocol step in turn, or at random instants, each output topic read
``read_committed`` equals an uninterrupted run's, exactly once."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
from _kafka_story import assert_topics_match, kafka_source_spec, kafka_spec, produce_input
from _story import make_input, run, run_killed_randomly, write_spec

from sealstream._runtime.crash import POINTS


@pytest.fixture(scope="module")
def story(kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The input topic and the output topics of an uninterrupted run."""
    d = tmp_path_factory.mktemp("k2k-ref")
    names = make_input(d, events=600, bad_every=97)
    topic = produce_input(kafka.bootstrap, d, names)
    spec = write_spec(d, names, errors=True)
    topics = kafka_spec(spec, kafka.bootstrap)
    kafka_source_spec(spec, kafka.bootstrap, topic)
    started = time.monotonic()
    res = run(spec)
    assert res.returncode == 0, res.stderr
    return {"input": topic, "expected": topics, "names": names,
            "seconds": time.monotonic() - started}


def _job(d: Path, kafka: Any, story: dict[str, Any]) -> tuple[Path, dict[str, str]]:
    d.mkdir(parents=True, exist_ok=True)
    spec = write_spec(d, story["names"], errors=True)
    topics = kafka_spec(spec, kafka.bootstrap)
    kafka_source_spec(spec, kafka.bootstrap, story["input"])
    return spec, topics


def test_killed_at_every_protocol_step_in_turn(tmp_path: Path, kafka: Any,
                                              story: dict[str, Any]) -> None:
    """The steps where the Kafka output's state changes (every named step with
    SEALSTREAM_CHAOS_SEEDS set above 1: a Kafka-source run takes seconds to start)."""
    spec, topics = _job(tmp_path, kafka, story)
    points = ["after_manifest_publish", "kafka_in_transaction", "after_commit_late"]
    if int(os.environ.get("SEALSTREAM_CHAOS_SEEDS", "1")) > 1:
        points = [p for p in POINTS if p != "after_write_suppress"] + ["kafka_in_transaction"]
    for point in points:
        crashed = run(spec, crash_at=f"{point}:2")
        if crashed.returncode == 0:
            break
        assert crashed.returncode == -9, f"{point}: {crashed.stderr}"
    else:
        final = run(spec)
        assert final.returncode == 0, final.stderr
    assert_topics_match(kafka.bootstrap, topics, story["expected"])


def test_random_sigkills(tmp_path: Path, kafka: Any, story: dict[str, Any]) -> None:
    """A few seeds by default; SEALSTREAM_CHAOS_SEEDS=N for more."""
    for seed in range(int(os.environ.get("SEALSTREAM_CHAOS_SEEDS", "1"))):
        spec, topics = _job(tmp_path / f"s{seed}", kafka, story)

        def fresh(spec: Path = spec) -> None:
            text = spec.read_text()
            for section in ("sink", "late", "errors"):
                old = text.split(f"[{section}]", 1)[1].split('topic = "', 1)[1].split('"', 1)[0]
                text = text.replace(f'topic = "{old}"', f'topic = "{kafka.new_topic(2)}"')
            spec.write_text(text)

        kills = run_killed_randomly(spec, random.Random(100 + seed), story["seconds"],
                                    max_rounds=3, reset=fresh)
        assert kills >= 1
        import tomllib

        doc = tomllib.loads(spec.read_text())
        topics = {s: doc[s]["topic"] for s in ("sink", "late", "errors")}
        assert_topics_match(kafka.bootstrap, topics, story["expected"])
