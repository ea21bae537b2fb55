"""Story: lose the disk, resume elsewhere. A job whose input, checkpoints, results,
late events and bad records all live in S3 (a real SeaweedFS server) runs in
directory A and is SIGKILLed after its third checkpoint; directory A is then
deleted entirely (its `.sealstream-cache` of the downloaded input too), and the
same spec, written into a fresh directory B as another machine would have it,
resumes from the checkpoints in S3: the committed output is exactly that of an
uninterrupted run, each window, late event and bad record once."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

from _story import assert_same_output, make_input, run, uninterrupted

from sealstream.testing.specs import files_source, spec_text

STORY = {"errors": True, "bad_every": 97}

expected = uninterrupted(**STORY)

SECTIONS = ("out", "late", "errors")
AGGREGATES = {"n": "count", "total": "sum(amount)", "low": "min(amount)",
              "high": "max(amount)", "avg": "mean(amount)", "first_i": "first(i)",
              "last_amount": "last(amount)"}


def _objects(url: str, server: Any) -> Any:
    import boto3

    from sealstream._objects.s3 import S3Objects

    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                          aws_access_key_id=server.access_key,
                          aws_secret_access_key=server.secret_key)
    return S3Objects(bucket, prefix, server.endpoint, client=client)


def _spec(root: str, inputs: list[str]) -> str:
    """The story's spec (as _story.write_spec writes it) with every path in S3."""
    text = spec_text("story", files_source(inputs), batch_size=50,
                     window='kind = "tumbling"\nsize_ms = 2000\nallowed_lateness_ms = 500',
                     aggregates=AGGREGATES, late=True, errors=True,
                     checkpoint=f'url = "{root}/ckpt"', every_events=120, keep=3)
    for sub in SECTIONS:
        assert f'path = "{sub}"' in text, sub
        text = text.replace(f'path = "{sub}"', f'path = "{root}/{sub}"')
    return text


def test_kill_lose_the_directory_resume_from_another(tmp_path: Path, expected: Path,
                                                      s3_server: Any) -> None:
    root = f"s3://{s3_server.bucket}/elsewhere-{uuid.uuid4().hex[:12]}"
    staging = tmp_path / "staging"
    names = make_input(staging, bad_every=97)
    inputs = _objects(f"{root}/in", s3_server)
    for name in names:  # the input is in S3 too: machine A's copy goes with its disk
        assert inputs.create(name.removeprefix("in/"), (staging / name).read_bytes())
    text = _spec(root, [f"{root}/{name}" for name in names])

    machine_a = tmp_path / "a"
    machine_a.mkdir()
    (machine_a / "spec.toml").write_text(text)
    crashed = run(machine_a / "spec.toml", crash_at="after_manifest_publish:3",
                  env=s3_server.env())
    assert crashed.returncode == -9, f"the crash point was not reached: {crashed.stderr}"
    assert (machine_a / ".sealstream-cache").is_dir()  # A held a cache of the input
    shutil.rmtree(machine_a)  # the disk is lost

    machine_b = tmp_path / "b"
    machine_b.mkdir()
    (machine_b / "spec.toml").write_text(text)
    resumed = run(machine_b / "spec.toml", env=s3_server.env())
    assert resumed.returncode == 0, resumed.stderr
    assert not machine_a.exists()
    assert sorted(p.name for p in machine_b.iterdir()) == [".sealstream-cache", "spec.toml"]

    got = tmp_path / "got"
    for sub in SECTIONS:
        objects = _objects(f"{root}/{sub}", s3_server)
        keys = [k for k in objects.keys() if not k.startswith(".probe/")]
        assert keys and all(k.startswith("part-") and k.endswith(".jsonl") for k in keys), keys
        (got / sub).mkdir(parents=True)
        for key in keys:
            # late events and bad records name their partition: here the object's URL,
            # in the reference run the local file's relative path
            body = objects.get(key).decode().replace(f"{root}/in/", "in/")
            (got / sub / key).write_text(body)
    assert_same_output(got, expected)
    assert s3_server.secret_key not in crashed.stderr + resumed.stderr
