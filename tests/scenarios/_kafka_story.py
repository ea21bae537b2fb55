"""The crash stories with Kafka outputs: the same job as ``_story``, its results,
late events and bad records going to three topics, read back ``read_committed``
and compared with an uninterrupted run into files."""

from __future__ import annotations

import json
import math
import re
import uuid
from pathlib import Path
from typing import Any

from _story import committed

from sealstream.testing.brokers import create_topic
from sealstream.testing.kafka_read import read_committed

OUTPUTS = (("sink", "out", ("key", "window_start", "window_end")),
           ("late", "late", ("_partition", "_offset")),
           ("errors", "errors", ("_partition", "_offset")))


def kafka_spec(spec: Path, bootstrap: str, topics: dict[str, str] | None = None,
               checkpoint: str = "ckpt") -> dict[str, str]:
    """Turn a ``_story`` spec's outputs into Kafka topics (new ones unless given);
    returns section -> topic."""
    text = spec.read_text()
    if topics is None:
        topics = {}
        for section, _, _ in OUTPUTS:
            topics[section] = f"s-{uuid.uuid4().hex[:12]}"
            create_topic(bootstrap, topics[section], 2)
    for section, sub, _ in OUTPUTS:
        text = text.replace(
            f'[{section}]\nkind = "jsonl"\npath = "{sub}"',
            f'[{section}]\nkind = "kafka"\nbootstrap = "{bootstrap}"\n'
            f'topic = "{topics[section]}"\npath = "staging-{sub}"')
    text = re.sub(r'\[checkpoint\]\npath = "[^"]*"', f'[checkpoint]\npath = "{checkpoint}"',
                  text)
    spec.write_text(text)
    return topics


def _norm(v: Any) -> Any:
    return ("f", v) if isinstance(v, float) else (type(v).__name__, v)


def kafka_source_spec(spec: Path, bootstrap: str, topic: str) -> None:
    """Make a ``_story`` spec read ``topic`` (to its end) instead of its files."""
    text = re.sub(r'\[source\]\nkind = "jsonl"\npaths = \[[^\]]*\]',
                  f'[source]\nkind = "kafka"\nbootstrap = "{bootstrap}"\ntopic = "{topic}"\n'
                  'stop = "end"', spec.read_text())
    spec.write_text(text)


def produce_input(bootstrap: str, d: Path, names: list[str]) -> str:
    """A new topic with one partition per input file, holding its lines in order."""
    from confluent_kafka import Producer

    topic = f"in-{uuid.uuid4().hex[:12]}"
    create_topic(bootstrap, topic, len(names))
    p = Producer({"bootstrap.servers": bootstrap})
    for i, name in enumerate(names):
        for line in (d / name).read_text().splitlines():
            if line:
                p.produce(topic, line.encode(), partition=i)
    assert p.flush(60) == 0
    return topic


def assert_topics_match(bootstrap: str, topics: dict[str, str],
                        expected: Path | dict[str, str]) -> None:
    """Each topic, read read_committed, holds each row of the uninterrupted run's
    output (a directory of JSON Lines outputs, or topics) exactly once, with its
    value (floats within 1e-9)."""
    for section, sub, ident in OUTPUTS:
        msgs = read_committed(bootstrap, topics[section])
        got = [json.loads(m.value) for m in msgs]
        want = (committed(expected, sub) if isinstance(expected, Path)
                else [json.loads(m.value) for m in read_committed(bootstrap,
                                                                  expected[section])])
        ids_got = [tuple(_norm(r[k]) for k in ident) for r in got]
        assert len(ids_got) == len(set(ids_got)), f"{section}: duplicated output"
        by_id = {tuple(_norm(r[k]) for k in ident): r for r in want}
        assert sorted(map(repr, ids_got)) == sorted(map(repr, by_id)), f"{section}: different ids"
        for r in got:
            exp = by_id[tuple(_norm(r[k]) for k in ident)]
            assert r.keys() == exp.keys()
            for k, v in r.items():
                e = exp[k]
                if isinstance(e, float) and isinstance(v, float):
                    assert math.isclose(v, e, rel_tol=1e-9, abs_tol=1e-12), (section, k, v, e)
                else:
                    assert type(v) is type(e) and v == e, (section, k, v, e)
        for m in msgs:  # identity and token in the headers, the key is the row's
            names = [h[0] for h in m.headers]
            assert names == ["sealstream-id", "sealstream-token"]
