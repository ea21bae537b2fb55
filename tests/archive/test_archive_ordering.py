"""The archive's segment is created on a writer thread while its step is applied in
memory; the step's plan (and so every manifest after it) names the segment only once
it is durable. Against a slow object store (a proxy in front of SeaweedFS that holds
every segment upload for seconds), a run SIGKILLed right after a step leaves every
recorded plan's segment in the store with the size and SHA-256 the plan names, and the
resume, with the broker's copy of what was read deleted, is exact."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from _archive_story import (
    delete_records,
    files_source,
    highest_read,
    kafka_source,
    newest_checkpoint_step,
    outcome,
    produce_lines,
    recorded_steps,
    run,
    write_spec,
)

from sealstream.testing.datagen import generate

pytest.importorskip("confluent_kafka")
pytest.importorskip("boto3")

#: how long the proxy holds each segment upload (a slow store): far longer than the
#: step that follows takes to reach the crash point, were it not waiting for it
HOLD_S = 2.0


def _recorded_segments(ckpt: Path) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for step in recorded_steps(ckpt):
        doc = json.loads((ckpt / "plans" / f"step-{step:012d}.json").read_text())
        if doc.get("archive"):
            out[step] = doc["archive"]
    return out


def test_a_plan_names_its_segment_only_once_it_is_durable(kafka: Any, tmp_path: Path
                                                           ) -> None:
    from s3_proxy import HeaderDroppingProxy
    from sealstream.testing.brokers import SeaweedServer

    files = generate(tmp_path / "data", events=80, keys=4, partitions=2, seed=5,
                     late_fraction=0.05, bad_fraction=0.05)
    topic = kafka.new_topic(partitions=2)
    produce_lines(kafka.bootstrap, topic, files)
    with SeaweedServer(anonymous=True) as s3, \
            HeaderDroppingProxy(s3.endpoint, drop=()) as proxy:
        base: Any = proxy._server.RequestHandlerClass

        class SlowSegments(base):  # type: ignore[misc,valid-type]
            def do_PUT(self) -> None:
                if "/seg-" in self.path:
                    time.sleep(HOLD_S)  # the upload lands late (a fault, not a verdict)
                self._forward()

        proxy._server.RequestHandlerClass = SlowSegments
        prefix = f"archive-{tmp_path.name}"
        d = tmp_path / "job"
        spec = write_spec(d, kafka_source(kafka.bootstrap, topic), batch=10, every=30,
                          archive=f"s3://{s3.bucket}/{prefix}", endpoint=proxy.url)
        r = run(spec, crash_at="batch:4", environ=s3.env())  # SIGKILL after step 4
        assert r.returncode == -9, r.stderr
        ckpt = d / "ckpt"
        named = _recorded_segments(ckpt)
        assert max(named) == 4, named  # the killed step's plan names its segment
        assert recorded_steps(ckpt)[-1] > newest_checkpoint_step(ckpt)
        client = s3.client()
        for step, entry in sorted(named.items()):
            got = client.get_object(Bucket=s3.bucket,
                                    Key=f"{prefix}/{entry['name']}")["Body"].read()
            assert (len(got), hashlib.sha256(got).hexdigest()) == \
                (entry["bytes"], entry["sha256"]), step
        # the broker forgets what was read: the resume reads it from those segments
        read = highest_read(ckpt)
        delete_records(kafka.bootstrap, topic,
                       {int(n.rsplit("/", 1)[1]): v for n, v in read.items()})
        r = run(spec, environ=s3.env())
        assert r.returncode == 0, r.stderr
    ref = tmp_path / "files"
    assert run(write_spec(ref, files_source(files), archive=None)).returncode == 0
    assert outcome(d) == outcome(ref)
