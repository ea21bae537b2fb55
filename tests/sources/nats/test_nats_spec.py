"""``[source] kind = "nats"`` in a spec, and what the command line says when the
stream cannot be read as promised (exit 1, one line naming the subject or address)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sealstream.errors import SpecError
from sealstream.pipeline import NatsSourceSpec, pipeline_from_dict
from sealstream.testing.brokers import free_port
from sealstream.testing.specs import spec_text, tumbling


def spec(**source: object) -> dict[str, Any]:
    src = {"kind": "nats", "servers": "nats://127.0.0.1:4222", "stream": "ORDERS",
           "subjects": ["orders.eu", "orders.us"], "key": "user", "time": "ts", **source}
    return {
        "pipeline": {"name": "orders"},
        "source": {k: v for k, v in src.items() if v is not None},
        "watermark": {"max_delay_ms": 1000},
        "window": {"kind": "tumbling", "size_ms": 60000},
        "aggregates": {"n": "count"},
        "sink": {"kind": "jsonl", "path": "out"},
    }


def test_a_nats_source_reads_its_settings() -> None:
    p = pipeline_from_dict(spec(stop="end", start="2023-11-14T22:13:20Z", fail_after_ms=500,
                                key="@key", time="@timestamp"))
    s = p.source
    assert isinstance(s, NatsSourceSpec) and s.live and s.stop_mode == "end"
    settings = s.settings()
    assert settings.subjects == ("orders.eu", "orders.us")
    assert settings.start == 1_700_000_000_000 and settings.fail_after_ms == 500
    assert p.fingerprint_fields()["source"]["partitions"] == ["orders.eu", "orders.us"]
    assert pipeline_from_dict(spec()).source.stop_mode == "never"
    timed = pipeline_from_dict(spec(start="time", start_time_ms=5)).source
    assert isinstance(timed, NatsSourceSpec) and timed.settings().start == 5


@pytest.mark.parametrize(("change", "message"), [
    ({"stream": None}, "source.stream: required"),
    ({"subjects": []}, "source.subjects must be a list"),
    ({"subjects": ["a", "a"]}, "twice"),
    ({"stream": "a.b"}, "source.stream must name"),
    ({"start": "soon"}, "source.start must be"),
    ({"stop": "later"}, "source.stop"),
    ({"fail_after_ms": 0}, "source.fail_after_ms"),
    ({"topic": "x"}, "source.topic: unknown setting for kind = \"nats\""),
])
def test_bad_nats_settings_are_named(change: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        pipeline_from_dict(spec(**change))


def test_a_file_source_refuses_nats_settings() -> None:
    d = spec()
    d["source"] = {"kind": "jsonl", "paths": ["a.jsonl"], "key": "u", "time": "t",
                   "stream": "ORDERS"}
    with pytest.raises(SpecError, match="source.stream: a setting of kind = \"nats\""):
        pipeline_from_dict(d)


def spec_toml(url: str, stream: str, subject: str) -> str:
    """A job reading ``subject`` of ``stream`` at ``url`` to its end, failing after 1 s
    without the server."""
    source = (f'kind = "nats"\nservers = "{url}"\nstream = "{stream}"\n'
              f'subjects = ["{subject}"]\nstop = "end"\nfail_after_ms = 1000')
    return spec_text("orders", source, max_delay_ms=0, window=tumbling(1000),
                     aggregates={"n": "count"}, every_events=1)


def run(d: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sealstream", "run", "spec.toml", "--quiet"],
                          cwd=d, capture_output=True, text=True, timeout=120,
                          env={**os.environ,
                               "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "src")})


def test_server_down_at_start_exits_1_naming_the_address(tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    (tmp_path / "spec.toml").write_text(spec_toml(url, "S", "a"))
    t0 = time.monotonic()
    res = run(tmp_path)
    assert res.returncode == 1 and url in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert time.monotonic() - t0 < 60


def test_messages_removed_before_a_resume_are_refused_not_skipped(
    jet: Any, tmp_path: Path
) -> None:
    """Run to the end, the stream's limit pushes out messages the job has not read,
    the next run refuses with exit 1 naming the subject and both positions."""
    jet.create(["a"], max_msgs=4)
    jet.publish([("a", {"user": "u", "ts": 1000 * i}) for i in range(3)])
    (tmp_path / "spec.toml").write_text(
        spec_toml(jet.url, jet.stream, jet.s("a")))
    res = run(tmp_path)
    assert res.returncode == 0, res.stderr
    jet.publish([("a", {"user": "u", "ts": 1000 * i}) for i in range(3, 10)])
    res = run(tmp_path)
    assert res.returncode == 1, res.stderr
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1
    assert repr(jet.s("a")) in line and "saved position 4" in line, line
    assert "earliest available 7" in line and "never skips" in line, line
