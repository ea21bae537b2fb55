"""Story: a bounded job reads its inputs from S3 (``[source] paths =
["s3://bucket/.../in/p*.jsonl"]``, a real SeaweedFS server). Its output equals the
output of the same files on local disk (partition names aside: the object's URL names
the partition); SIGKILLed at random instants and resumed, exactly once; an object
replaced under a resumed job is refused in one line (exit 1); a glob matching no
object, or a missing bucket, in one line (exit 2). No credential in any message."""

from __future__ import annotations

import json
import random
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
if str(SCENARIOS) not in sys.path:
    sys.path.insert(0, str(SCENARIOS))

from _story import (  # noqa: E402
    assert_same_output,
    make_input,
    run,
    run_killed_randomly,
    uninterrupted,
    write_spec,
)

STORY = {"errors": True, "bad_every": 97}

expected = uninterrupted(**STORY)


def _client(server: Any) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                        aws_access_key_id=server.access_key,
                        aws_secret_access_key=server.secret_key)


def _s3_job(d: Path, server: Any, pattern: str = "in/p*.jsonl") -> tuple[Path, str]:
    """The story's inputs uploaded under a fresh prefix (and removed from the local
    disk, so that nothing can be read from there), its spec reading ``pattern``."""
    root = f"s3://{server.bucket}/src-{uuid.uuid4().hex[:12]}"
    names = make_input(d, bad_every=97)
    client = _client(server)
    for name in names:
        client.put_object(Bucket=server.bucket, Key=f"{root.split('/', 3)[3]}/{name}",
                          Body=(d / name).read_bytes())
        (d / name).unlink()
    (d / "in").rmdir()
    spec = write_spec(d, names, errors=True)
    text = re.sub(r"(?m)^paths = \[.*\]$", f"paths = [{json.dumps(f'{root}/{pattern}')}]",
                  spec.read_text(), count=1)
    spec.write_text(text)
    return spec, root


def _localised(d: Path, root: str) -> Path:
    """The job's outputs with the objects' URLs named as the local files' paths."""
    into = d / "localised"
    for sub in ("out", "late", "errors"):
        (into / sub).mkdir(parents=True)
        for f in sorted((d / sub).glob("*.jsonl")):
            if not f.name.startswith((".", "_")):
                (into / sub / f.name).write_text(f.read_text().replace(f"{root}/", ""))
    return into


def _one_line(err: str, server: Any) -> None:
    assert err.count("\n") == 1 and err.startswith("sealstream: error: "), err
    assert server.secret_key not in err and server.access_key not in err, err


def test_inputs_in_s3_give_the_output_of_local_files(tmp_path: Path, expected: Path,
                                                     s3_server: Any) -> None:
    spec, root = _s3_job(tmp_path, s3_server)
    res = run(spec, env=s3_server.env())
    assert res.returncode == 0, res.stderr
    errors = (tmp_path / "errors").glob("*.jsonl")
    assert any(f"{root}/in/p0.jsonl" in f.read_text() for f in errors), \
        "bad records name the object's URL"
    assert_same_output(_localised(tmp_path, root), expected)
    # each object downloaded once into the cache next to the spec
    cached = sorted(p.name for p in (tmp_path / ".sealstream-cache" / "s3").rglob("p*.jsonl"))
    assert cached == ["p0.jsonl", "p1.jsonl", "p2.jsonl"]


def test_sigkill_and_resume_with_inputs_in_s3_is_exact(tmp_path: Path, expected: Path,
                                                       s3_server: Any) -> None:
    spec, root = _s3_job(tmp_path, s3_server)
    typical = float((expected / "duration").read_text())
    kills = run_killed_randomly(spec, random.Random(11), typical, env=s3_server.env())
    assert kills >= 1
    assert_same_output(_localised(tmp_path, root), expected)


def test_an_object_changed_under_a_resumed_job_is_refused(tmp_path: Path,
                                                         s3_server: Any) -> None:
    spec, root = _s3_job(tmp_path, s3_server)
    crashed = run(spec, crash_at="after_manifest_publish:2", env=s3_server.env())
    assert crashed.returncode == -9, crashed.stderr
    # the object grows: its first bytes are intact (a local file may grow), but an
    # object is immutable, so another version is a change
    client = _client(s3_server)
    key = f"{root.split('/', 3)[3]}/in/p0.jsonl"
    body = client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read()
    client.put_object(Bucket=s3_server.bucket, Key=key,
                      Body=body + b'{"user": "u1", "ts": 1700000000000, "amount": 1}\n')
    resumed = run(spec, env=s3_server.env())
    assert resumed.returncode == 1, resumed.stderr
    _one_line(resumed.stderr, s3_server)
    assert f"partition '{root}/in/p0.jsonl' changed since its checkpoint" in resumed.stderr
    assert "the object is now ETag" in resumed.stderr


@pytest.mark.parametrize("where", ["nothing", "bucket"])
def test_no_object_or_no_bucket_is_one_line_exit_2(tmp_path: Path, s3_server: Any,
                                                   where: str) -> None:
    spec, root = _s3_job(tmp_path, s3_server, pattern="in/q*.jsonl")
    if where == "bucket":
        spec.write_text(spec.read_text().replace(f"s3://{s3_server.bucket}/",
                                                 "s3://no-such-bucket-here/"))
    res = run(spec, env=s3_server.env())
    assert res.returncode == 2, res.stderr
    _one_line(res.stderr, s3_server)
    needle = ("matches no object" if where == "nothing"
              else "bucket 'no-such-bucket-here' does not exist")
    assert needle in res.stderr, res.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_csv_and_parquet_objects_give_the_output_of_local_files(tmp_path: Path, kind: str,
                                                                s3_server: Any) -> None:
    import polars as pl

    from sealstream.testing.specs import files_source, spec_text

    root = f"s3://{s3_server.bucket}/src-{uuid.uuid4().hex[:12]}"
    client = _client(s3_server)
    runs = {}
    for where in ("local", "s3"):
        d = tmp_path / where
        (d / "in").mkdir(parents=True)
        paths = []
        for p in range(2):
            rows = pl.DataFrame({
                "user": [f"u{(i * 7 + p) % 5}" for i in range(300)],
                "ts": [1_700_000_000_000 + i * 137 - (i % 11) * 60 for i in range(300)],
                "amount": [float((i * 13 + p) % 29) for i in range(300)],
            })
            name = f"in/p{p}.{kind}"
            if kind == "csv":
                rows.write_csv(d / name)
            else:
                rows.write_parquet(d / name)
            if where == "s3":
                client.put_object(Bucket=s3_server.bucket,
                                  Key=f"{root.split('/', 3)[3]}/{name}",
                                  Body=(d / name).read_bytes())
                (d / name).unlink()
                paths.append(f"{root}/in/p*.{kind}")
            else:
                paths.append(name)
        spec = d / "spec.toml"
        spec.write_text(spec_text("s3kinds", files_source(sorted(set(paths)), kind=kind),
                                  batch_size=40, every_events=100))
        res = run(spec, env=s3_server.env())
        assert res.returncode == 0, res.stderr
        runs[where] = sorted(
            line for f in (d / "out").glob("*.jsonl") if not f.name.startswith((".", "_"))
            for line in f.read_text().splitlines() if line.strip())
    assert runs["local"] and runs["s3"] == runs["local"]
