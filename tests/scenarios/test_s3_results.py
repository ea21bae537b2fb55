"""Story: results, late events and bad records in S3 (`[sink]/[late]/[errors] path =
"s3://bucket/prefix"`, a real SeaweedFS server), checkpoints in S3 too, so that
nothing of the job lives on the worker's disk. SIGKILL at a crash point or at random
instants (the newest checkpoint damaged between restarts, so that the run falls back
and reads its committed output back from S3 to drop what it already wrote): the
objects under the prefixes are exactly the directory output of an uninterrupted run,
no staging object is left, and `sealstream compare` / `replay` read the prefixes."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from _story import assert_same_output, make_input, run, uninterrupted, write_spec

STORY = {"errors": True, "bad_every": 97}

expected = uninterrupted(**STORY)

SECTIONS = ("out", "late", "errors")


def _objects(url: str, server: Any) -> Any:
    import boto3

    from sealstream._objects.s3 import S3Objects

    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                          aws_access_key_id=server.access_key,
                          aws_secret_access_key=server.secret_key)
    return S3Objects(bucket, prefix, server.endpoint, client=client)


def _s3_spec(spec: Path, root: str, kind: str = "jsonl") -> None:
    """Point the story's outputs and checkpoints at prefixes under ``root``."""
    text = spec.read_text().replace('path = "ckpt"', f'url = "{root}/ckpt"')
    for sub in SECTIONS:
        text = text.replace(f'path = "{sub}"', f'path = "{root}/{sub}"')
    if kind == "parquet":
        text = text.replace('[sink]\nkind = "jsonl"', '[sink]\nkind = "parquet"')
    spec.write_text(text)


def _story(d: Path, server: Any, **kw: Any) -> tuple[Path, str]:
    root = f"s3://{server.bucket}/results-{uuid.uuid4().hex[:12]}"
    spec = write_spec(d, make_input(d, bad_every=97), errors=True)
    _s3_spec(spec, root, **kw)
    return spec, root


def _download(root: str, server: Any, into: Path) -> None:
    """The committed objects of each output, as files of a directory output; no
    staging object may be left once a run finished."""
    for sub in SECTIONS:
        objects = _objects(f"{root}/{sub}", server)
        keys = objects.keys()
        assert [k for k in keys if k.startswith(".part-")] == [], f"{sub}: staging left"
        (into / sub).mkdir(parents=True, exist_ok=True)
        # a run SIGKILLed during its store probe can leave its probe object, which
        # the next run's probe deletes once a minute old (docs/object-storage.md)
        for key in [k for k in keys if not k.startswith(".probe/")]:
            assert key.startswith("part-") and key.endswith(".jsonl"), key
            (into / sub / key).write_bytes(objects.get(key))


def _sealstream(server: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sealstream", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **server.env()})


@pytest.mark.parametrize("point", ["after_sink_prepare:3", "after_manifest_publish:3",
                                   "after_retention:3"])
def test_kill_then_resume_with_results_in_s3(tmp_path: Path, expected: Path, s3_server: Any,
                                             point: str) -> None:
    spec, root = _story(tmp_path, s3_server)
    crashed = run(spec, crash_at=point, env=s3_server.env())
    assert crashed.returncode == -9, f"{point} was not reached: {crashed.stderr}"
    resumed = run(spec, env=s3_server.env())
    assert resumed.returncode == 0, resumed.stderr
    assert not any((tmp_path / sub).exists() for sub in (*SECTIONS, "ckpt"))
    _download(root, s3_server, tmp_path / "got")
    assert_same_output(tmp_path / "got", expected)
    compared = _sealstream(s3_server, "compare", f"{root}/out", str(expected / "out"))
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "equal" in compared.stdout
    assert s3_server.secret_key not in crashed.stderr + resumed.stderr + compared.stdout


def test_parquet_results_in_s3_equal_the_directory_output(tmp_path: Path, expected: Path,
                                                         s3_server: Any) -> None:
    spec, root = _story(tmp_path, s3_server, kind="parquet")
    assert run(spec, crash_at="after_manifest_publish:2", env=s3_server.env()).returncode == -9
    resumed = run(spec, env=s3_server.env())
    assert resumed.returncode == 0, resumed.stderr
    keys = _objects(f"{root}/out", s3_server).keys()
    assert keys and all(k.startswith("part-") and k.endswith(".parquet") for k in keys), keys
    compared = _sealstream(s3_server, "compare", f"{root}/out", str(expected / "out"),
                           "--json")
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert json.loads(compared.stdout)["equal"] is True


def test_replay_of_a_job_whose_results_are_in_s3(tmp_path: Path, expected: Path,
                                                 s3_server: Any) -> None:
    """The replay writes its own outputs to its local destination; the job's S3 prefixes
    are neither written nor taken for a local directory."""
    spec, root = _story(tmp_path, s3_server)
    assert run(spec, env=s3_server.env()).returncode == 0
    before = {sub: _objects(f"{root}/{sub}", s3_server).keys() for sub in SECTIONS}
    replayed = _sealstream(s3_server, "replay", str(spec), "--from", "start", "--to",
                           str(tmp_path / "replay"), "--quiet")
    assert replayed.returncode == 0, replayed.stderr
    assert_same_output(tmp_path / "replay", expected)
    assert {sub: _objects(f"{root}/{sub}", s3_server).keys() for sub in SECTIONS} == before


def _damage(objects: Any, key: str, how: str) -> None:
    data = objects.get(key)
    assert data is not None, key
    objects.delete(key)
    if how == "flip":
        objects.create(key, data[:100] + bytes([data[100] ^ 0x40]) + data[101:])
    elif how == "truncate":
        objects.create(key, data[: len(data) // 2])


def _complete(server: Any, url: str) -> list[int]:
    listed = _sealstream(server, "checkpoints", "list", url, "--json")
    assert listed.returncode == 0, listed.stderr
    return [c["id"] for c in json.loads(listed.stdout)["checkpoints"] if c["complete"]]


def test_random_sigkills_with_results_in_s3_and_the_newest_checkpoint_damaged(
        tmp_path: Path, expected: Path, s3_server: Any) -> None:
    """A kill after checkpoint 3, then SIGKILLs at random instants; after each kill the
    newest complete checkpoint is damaged (while an older one remains), so the next run
    falls back and must drop, by reading the committed objects back from S3, what the
    later epochs already published."""
    started = time.monotonic()
    spec, root = _story(tmp_path / "timed", s3_server)
    assert run(spec, env=s3_server.env()).returncode == 0
    typical = time.monotonic() - started
    d = tmp_path / "killed"
    spec, root = _story(d, s3_server)
    ckpt = _objects(f"{root}/ckpt", s3_server)
    rng = random.Random(30)
    damages = [("state.arrow", "flip"), ("MANIFEST.json", "delete"),
               ("state.arrow", "truncate")]
    env = {**os.environ, **s3_server.env()}

    def damage_newest() -> int:
        done = _complete(s3_server, f"{root}/ckpt")
        if len(done) < 2:
            return 0  # one to damage, one to fall back to (none left is a refusal)
        blob, how = damages[rng.randrange(len(damages))]
        _damage(ckpt, f"cp-{done[-1]:012d}/{blob}", how)
        return 1

    assert run(spec, crash_at="after_retention:3", env=s3_server.env()).returncode == -9
    damaged = damage_newest()
    kills = 0
    for _round in range(6):
        timer = rng.uniform(0.05, 0.5) * typical
        with subprocess.Popen([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) as proc:
            try:
                _, err = proc.communicate(timeout=timer)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.communicate()
                kills += 1
            else:
                assert proc.returncode == 0, err
                break
        damaged += damage_newest()
    else:
        final = run(spec, env=s3_server.env())
        assert final.returncode == 0, final.stderr
    assert damaged >= 1, damaged
    rejected = ckpt.keys("rejected/")
    assert rejected  # the damaged checkpoints were judged and kept aside
    _download(root, s3_server, d / "got")
    assert_same_output(d / "got", expected)
    print(f"random kills: {kills}, damaged checkpoints: {damaged}")


def test_refused_credentials_are_one_line_without_them(tmp_path: Path,
                                                       s3_server: Any) -> None:
    spec = write_spec(tmp_path, make_input(tmp_path, bad_every=97), errors=True)
    url = f"s3://{s3_server.bucket}/denied-{uuid.uuid4().hex[:8]}/out"
    spec.write_text(spec.read_text().replace('path = "out"', f'path = "{url}"'))
    wrong = {**s3_server.env(), "AWS_SECRET_ACCESS_KEY": "wrong" + s3_server.secret_key[5:]}
    failed = run(spec, env=wrong)
    assert failed.returncode == 1, failed.stderr
    lines = failed.stderr.strip().splitlines()
    assert len(lines) == 1, failed.stderr
    assert f"cannot open the results output {url}" in lines[0], lines[0]
    assert "access denied" in lines[0], lines[0]
    assert s3_server.secret_key[5:] not in failed.stderr
    assert s3_server.access_key not in failed.stderr
