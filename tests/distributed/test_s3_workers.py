"""`--workers` with results in S3: the coordinator stages them (no per-worker part
objects yet); the committed objects equal the single-process directory output."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from scenarios._story import assert_same_output as assert_same_dirs
from scenarios._story import make_input, reference_run, write_spec

WINDOW = 'kind = "tumbling"\nsize_ms = 2000\nallowed_lateness_ms = 500'
STORY = {"events": 600, "every_events": 300, "batch_size": 100}


def test_two_workers_with_results_in_s3(ray_cluster: Any, s3_server: Any, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from sealstream import load_spec
    from sealstream._objects.s3 import S3Objects
    from sealstream.distributed import DistributedJob

    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    reference_run(tmp_path / "ref", window=WINDOW, **STORY)
    d = tmp_path / "dist"
    spec = write_spec(d, make_input(d, events=STORY["events"]), window=WINDOW,
                      every_events=STORY["every_events"], batch_size=STORY["batch_size"])
    prefix = f"workers-{uuid.uuid4().hex[:12]}"
    text = spec.read_text()
    for sub in ("out", "late"):
        text = text.replace(f'path = "{sub}"', f'path = "s3://{s3_server.bucket}/{prefix}/{sub}"')
    spec.write_text(text)
    DistributedJob(load_spec(spec), workers=2).run()
    for sub in ("out", "late"):
        objects = S3Objects(s3_server.bucket, f"{prefix}/{sub}", s3_server.endpoint)
        keys = objects.keys()
        assert keys and not [k for k in keys if k.startswith(".part-")], keys
        (d / "got" / sub).mkdir(parents=True)
        for key in keys:
            data = objects.get(key)
            assert data is not None
            (d / "got" / sub / key).write_bytes(data)
    assert_same_dirs(d / "got", tmp_path / "ref")
