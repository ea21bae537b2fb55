"""Story: checkpoints in S3 (`[checkpoint] url = "s3://bucket/prefix"`, a real
SeaweedFS server): SIGKILL mid-protocol, resume, the output equals an uninterrupted
run exactly once; `sealstream checkpoints list|verify|inspect|prune s3://...` judge
what the run left; damaged checkpoints give the directory store's verdicts, are
kept aside under rejected/ and the run falls back with exact output; SIGKILLs at
random instants with the newest checkpoint damaged between restarts; the server
itself SIGKILLed mid-run and restarted."""

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
from _story import assert_same_output, in_process, make_input, run, uninterrupted, write_spec

STORY = {"errors": True, "bad_every": 97}

expected = uninterrupted(**STORY)


def _s3_story(d: Path, server: Any) -> tuple[Path, str, dict[str, str]]:
    """The story with its checkpoints under a fresh prefix; (spec, url, env)."""
    url = f"s3://{server.bucket}/story-{uuid.uuid4().hex[:12]}"
    spec = write_spec(d, make_input(d, bad_every=97), errors=True)
    spec.write_text(spec.read_text().replace('path = "ckpt"', f"url = {json.dumps(url)}"))
    return spec, url, server.env()


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return in_process("checkpoints", *args, env=dict(env))


def _objects(url: str, env: dict[str, str]) -> Any:
    import boto3

    from sealstream._objects.s3 import S3Objects

    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    return S3Objects(bucket, prefix, env["AWS_ENDPOINT_URL"], client=client)


def _damage(objects: Any, rel: str, how: str) -> None:
    """Behind the store's back: flip a byte, truncate, or delete an object."""
    data = objects.get(rel)
    assert data is not None, rel
    objects.delete(rel)
    if how == "flip":
        objects.create(rel, data[:100] + bytes([data[100] ^ 0x40]) + data[101:])
    elif how == "truncate":
        objects.create(rel, data[: len(data) // 2])


@pytest.fixture
def s3_env(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.mark.parametrize("point", ["after_retention", "before_manifest_publish",
                                   "after_write_state"])
def test_kill_then_resume_from_s3(tmp_path: Path, expected: Path, point: str,
                                  s3_env: Any) -> None:
    spec, url, env = _s3_story(tmp_path, s3_env)
    crashed = run(spec, crash_at=f"{point}:3", env=env)
    assert crashed.returncode == -9, f"{point} was not reached: {crashed.stderr}"
    assert not (tmp_path / "ckpt").exists()
    resumed = run(spec, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_output(tmp_path, expected)

    listed = _cli(env, "list", url, "--json")
    assert listed.returncode == 0, listed.stderr
    cps = json.loads(listed.stdout)["checkpoints"]
    assert 1 <= len(cps) <= 3 and all(c["complete"] for c in cps)
    verified = _cli(env, "verify", url, "--json", "--spec", str(spec))
    assert verified.returncode == 0, verified.stderr
    data = json.loads(verified.stdout)
    assert {c["verdict"] for c in data["checkpoints"]} == {"ATOMIC_CHECKPOINT"}
    assert data["resume_from"] == cps[-1]["id"]
    shown = _cli(env, "inspect", url, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["id"] == cps[-1]["id"]
    pruned = _cli(env, "prune", url, "--keep", "1", "--json")
    assert pruned.returncode == 0, pruned.stderr
    after = json.loads(_cli(env, "list", url, "--json").stdout)["checkpoints"]
    assert [c["id"] for c in after] == [cps[-1]["id"]]
    everything = listed.stdout + listed.stderr + verified.stdout + pruned.stdout + shown.stdout
    assert env["AWS_SECRET_ACCESS_KEY"] not in everything + resumed.stderr


@pytest.mark.parametrize("blob,how,verdict", [
    ("state.arrow", "flip", "INCONSISTENT_STATE"),
    ("state.arrow", "truncate", "PARTIAL_CHECKPOINT_REJECT"),
    ("receipts.json", "delete", "PARTIAL_CHECKPOINT_REJECT"),
    ("MANIFEST.json", "delete", "PARTIAL_CHECKPOINT_REJECT"),
    ("receipts.json", "flip", "INCONSISTENT_STATE"),
])
def test_corrupt_newest_checkpoint_falls_back(tmp_path: Path, expected: Path, s3_env: Any,
                                              blob: str, how: str, verdict: str) -> None:
    spec, url, env = _s3_story(tmp_path, s3_env)
    assert run(spec, crash_at="after_retention:3", env=env).returncode == -9
    cps = json.loads(_cli(env, "list", url, "--json").stdout)["checkpoints"]
    newest = cps[-1]["id"]
    objects = _objects(url, env)
    _damage(objects, f"cp-{newest:012d}/{blob}", how)
    verified = _cli(env, "verify", url, "--json")
    assert verified.returncode == 1 and "Traceback" not in verified.stderr, verified.stderr
    data = json.loads(verified.stdout)
    assert {c["id"]: c["verdict"] for c in data["checkpoints"]}[newest] == verdict
    assert data["resume_from"] == cps[-2]["id"]
    resumed = run(spec, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_output(tmp_path, expected)
    # the damaged checkpoint is kept aside as evidence, named with its id and reason
    kept = objects.keys(f"rejected/cp-{newest:012d}-")
    assert kept, objects.keys("rejected/")
    assert not objects.keys(f"cp-{newest:012d}/")


def test_encrypted_checkpoints_in_s3(tmp_path: Path, expected: Path, s3_env: Any) -> None:
    spec, url, env = _s3_story(tmp_path, s3_env)
    env = {**env, "SEALSTREAM_ENCRYPTION_KEY": "ab" * 32}
    assert run(spec, crash_at="after_retention:3", env=env).returncode == -9
    resumed = run(spec, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_output(tmp_path, expected)
    from sealstream.checkpoint import crypto

    objects = _objects(url, env)
    blobs = [k for k in objects.keys("cp-") if not k.rsplit("/", 1)[-1].startswith(".")]
    assert blobs and all(crypto.is_envelope(objects.get(k) or b"") for k in blobs)
    verified = _cli(env, "verify", url, "--json")
    assert verified.returncode == 0, verified.stderr


def _newest_complete(env: dict[str, str], url: str) -> int | None:
    """The newest complete checkpoint, when an older complete one is there to fall back
    to: with none left, damaging it makes the next start refuse, as it must (a store
    whose every checkpoint is rejected is not started over silently)."""
    listed = _cli(env, "list", url, "--json")
    if listed.returncode == 2 and "does not exist" in listed.stderr:
        return None  # killed before it created the store (a loaded machine starts slowly)
    assert listed.returncode == 0, listed.stderr
    done = [c["id"] for c in json.loads(listed.stdout)["checkpoints"] if c["complete"]]
    return done[-1] if len(done) >= 2 else None


def test_random_sigkills_with_the_newest_checkpoint_damaged_between_restarts(
        tmp_path: Path, s3_env: Any) -> None:
    from _story import reference_run

    story = {"events": 3000, "every_events": 400, "batch_size": 100, "bad_every": 0}
    reference_run(tmp_path / "ref", **story)
    typical = float((tmp_path / "ref" / "duration").read_text())
    d = tmp_path / "killed"
    spec = write_spec(d, make_input(d, events=3000), every_events=400, batch_size=100)
    url = f"s3://{s3_env.bucket}/chaos-{uuid.uuid4().hex[:12]}"
    spec.write_text(spec.read_text().replace('path = "ckpt"', f"url = {json.dumps(url)}"))
    env = s3_env.env()
    objects = _objects(url, env)
    rng = random.Random(30)
    damages = [("state.arrow", "flip", "INCONSISTENT_STATE"),
               ("state.arrow", "truncate", "PARTIAL_CHECKPOINT_REJECT"),
               ("MANIFEST.json", "delete", "PARTIAL_CHECKPOINT_REJECT")]
    kills = damaged = 0
    expected_s = typical * 3  # checkpoints in S3 cost more than in a directory
    for _round in range(8):
        timer = rng.uniform(0.1, 0.9) * expected_s
        started = time.monotonic()
        with subprocess.Popen([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                              env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) as proc:
            try:
                _, err = proc.communicate(timeout=timer)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.communicate()
                kills += 1
            else:
                assert proc.returncode == 0, err
                if kills and damaged:
                    break
                # finished before a kill landed: start over, timed by this run
                for key in objects.keys():
                    objects.delete(key)
                for sub in ("out", "late", "errors"):
                    for f in (d / sub).glob("*") if (d / sub).is_dir() else []:
                        f.unlink()
                expected_s = time.monotonic() - started
                continue
        newest = _newest_complete(env, url)
        if newest is None:
            # killed before two checkpoints were complete (on a loaded machine the
            # start alone can outlast the timer): the next kills come later, so that
            # the rounds make progress instead of killing every start (a CI run saw
            # 7 kills and nothing to damage)
            expected_s *= 1.6
            continue
        blob, how, verdict = damages[damaged % len(damages)]
        _damage(objects, f"cp-{newest:012d}/{blob}", how)
        damaged += 1
        verified = _cli(env, "verify", url, "--json")
        judged = {c["id"]: c["verdict"] for c in json.loads(verified.stdout)["checkpoints"]}
        assert judged[newest] == verdict, verified.stdout
    else:
        final = run(spec, env=env)
        assert final.returncode == 0, final.stderr
    assert kills >= 1 and damaged >= 1
    assert_same_output(d, tmp_path / "ref")
    assert objects.keys("rejected/")  # every damaged checkpoint was kept as evidence


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_the_s3_server_killed_mid_checkpoint_and_restarted(tmp_path: Path, expected: Path,
                                                          own_s3: Any) -> None:
    """The run stops itself between writing a checkpoint's state and its manifest; the
    server is SIGKILLed there, the run goes on against no server (retrying), and the
    server comes back within the retry budget: the run finishes, output exact."""
    spec, url, env = _s3_story(tmp_path, own_s3)
    env = {**env, "SEALSTREAM_S3_RETRY_S": "300", "SEALSTREAM_PAUSE_AT": "after_write_state:2"}
    with subprocess.Popen([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                          env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True) as proc:
        deadline = time.monotonic() + 120
        while not _stopped(proc.pid):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        own_s3.kill()
        os.kill(proc.pid, signal.SIGCONT)  # it writes on, into a dead server
        own_s3.start()
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert_same_output(tmp_path, expected)
    verified = _cli(env, "verify", url, "--json")
    assert verified.returncode == 0, verified.stderr


def test_every_checkpoints_command_and_replay_read_an_s3_store(tmp_path: Path, expected: Path,
                                                              s3_env: Any) -> None:
    spec, url, env = _s3_story(tmp_path, s3_env)
    assert run(spec, crash_at="after_retention:3", env=env).returncode == -9
    cps = [c["id"] for c in json.loads(_cli(env, "list", url, "--json").stdout)["checkpoints"]]
    assert len(cps) >= 2
    diff = _cli(env, "diff", url, str(cps[-2]), str(cps[-1]), "--json")
    assert diff.returncode == 0, diff.stderr
    exported = _cli(env, "export", url, "--to", str(tmp_path / "open.jsonl"), "--json")
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "open.jsonl").is_file()
    row = json.loads((sorted((tmp_path / "out").glob("*.jsonl"))[0]).read_text().splitlines()[0])
    window = _cli(env, "window", url, "--key", str(row["key"]), "--start",
                  str(row["window_start"]), "--end", str(row["window_end"]), "--json")
    assert window.returncode == 0, window.stdout + window.stderr
    shown = json.loads(window.stdout)
    assert shown["manifest"]["verdict"] == "ATOMIC_CHECKPOINT"
    assert shown["checkpoint"]["status"] in ("emitted", "open")
    replayed = subprocess.run(
        [sys.executable, "-m", "sealstream", "replay", str(spec), "--from", "start", "--to",
         str(tmp_path / "replay"), "--quiet"], capture_output=True, text=True, timeout=300,
        env={**os.environ, **env})
    assert replayed.returncode == 0, replayed.stderr
    assert (tmp_path / "replay" / "out").is_dir()
    resumed = run(spec, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_output(tmp_path, expected)


def test_two_runs_of_one_job_on_one_prefix(tmp_path: Path, expected: Path, s3_env: Any) -> None:
    """The first run stops itself mid-checkpoint holding the lease; a second run of the
    same job on the same prefix is refused in one line (exit 1) and writes nothing; the
    first goes on and its output is exact."""
    spec, url, env = _s3_story(tmp_path, s3_env)
    with subprocess.Popen([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                          env={**os.environ, **env, "SEALSTREAM_PAUSE_AT": "after_write_state:2"},
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as first:
        deadline = time.monotonic() + 120
        while not _stopped(first.pid):
            assert first.poll() is None, first.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        before = _objects(url, env).keys()
        second = run(spec, env=env)
        assert second.returncode == 1, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "locked by another run" in lines[0], second.stderr
        assert f'"pid": {first.pid}' in lines[0]
        assert _objects(url, env).keys() == before
        os.kill(first.pid, signal.SIGCONT)
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert_same_output(tmp_path, expected)
