"""``[source] kind = "kafka"`` in a spec: the settings, their checks, the field plan."""

from __future__ import annotations

import pytest

from sealstream.errors import SpecError
from sealstream.pipeline import pipeline_from_dict
from sealstream.pipeline.kafka import KafkaSourceSpec


def spec(**source: object) -> dict[str, object]:
    src = {"kind": "kafka", "bootstrap": "127.0.0.1:9092", "topic": "clicks",
           "key": "user", "time": "ts", **source}
    return {
        "pipeline": {"name": "p"},
        "source": {k: v for k, v in src.items() if v is not None},
        "window": {"kind": "tumbling", "size_ms": 1000},
        "aggregates": {"n": "count"},
        "sink": {"kind": "jsonl", "path": "out"},
    }


def test_a_kafka_source_reads_its_settings() -> None:
    p = pipeline_from_dict(spec(group="g", start="time", start_time_ms=5, stop="end",
                                key="@key", time="@timestamp", fail_after_ms=1500,
                                client={"fetch.max.bytes": 1048576, "check.crcs": True}))
    s = p.source
    assert isinstance(s, KafkaSourceSpec)
    assert (s.live, s.stop_mode, s.group, s.start_time_ms) == (True, "end", "g", 5)
    settings = s.settings()
    assert settings.stop == "end" and settings.fail_after_ms == 1500
    assert dict(settings.client) == {"check.crcs": "true", "fetch.max.bytes": "1048576"}
    plan = p.field_plan()
    assert (plan.key, plan.time) == ("@key", "@timestamp")
    assert p.fingerprint_fields()["source"]["partitions"] == ["clicks"]
    assert pipeline_from_dict(spec()).source.stop_mode == "never"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"bootstrap": None}, "source.bootstrap: required setting is missing"),
        ({"topic": 3}, "source.topic: expected a string, got 3"),
        ({"start": "soon"}, "source.start: expected \"earliest\", \"latest\" or \"time\""),
        ({"start": "time"}, "start_time_ms"),
        ({"stop": "later"}, "source.stop: expected \"end\" or \"never\""),
        ({"fail_after_ms": 0}, "source.fail_after_ms: expected an integer > 0, got 0"),
        ({"paths": ["a.jsonl"]}, "source.paths: unknown setting for kind = \"kafka\""),
        ({"client": {"isolation.level": "read_uncommitted"}}, "'isolation.level' is set by"),
        ({"client": "x"}, "source.client: expected a table"),
        ({"key": ["a", "b"]}, "source.key: expected a string"),
    ],
)
def test_bad_kafka_settings_are_named(change: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(".", r"\.")):
        pipeline_from_dict(spec(**change))


def test_a_file_source_refuses_kafka_settings() -> None:
    d = spec()
    d["source"] = {"kind": "jsonl", "paths": ["in.jsonl"], "key": "u", "time": "t",
                   "topic": "x"}
    with pytest.raises(SpecError, match="source.topic: a setting of kind = \"kafka\""):
        pipeline_from_dict(d)
