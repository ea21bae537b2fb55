"""`sealstream console s3://bucket/prefix` on a real SeaweedFS server, its checkpoints
written by real runs: every page reads as on a directory store, a damaged checkpoint is
a verdict (kept in the history once recovery moved it under rejected/), the bucket's
listing is byte-identical after browsing (no probe, no lease, no claim), an unreachable
endpoint is a page that says so within a bounded time, and no credential is shown."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import test_console_routes as routes
from _consolekit import emitted_window, story

from scenarios._story import in_process, run
from sealstream.checkpoint import manifest as mf
from sealstream.errors import CheckpointError
from sealstream.testing.lifeline import die_with_parent


def _client(server: Any) -> Any:
    import boto3

    env = server.env()
    return boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])


def _listing(server: Any) -> list[tuple[str, str, int, str]]:
    """Every object of the bucket: key, ETag, size, last modified."""
    c = _client(server)
    out: list[tuple[str, str, int, str]] = []
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=server.bucket):
        out.extend((o["Key"], o["ETag"], o["Size"], o["LastModified"].isoformat())
                   for o in page.get("Contents", []))
    return sorted(out)


@pytest.fixture
def s3_env(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SEALSTREAM_S3_RETRY_S", "3")  # as `sealstream console` sets it
    return s3_server


def _story(d: Path, server: Any) -> tuple[Path, str]:
    url = f"s3://{server.bucket}/console-{uuid.uuid4().hex[:12]}"
    spec = story(d, url=url, env={**server.env(), mf.KEY_ENV: ""})
    return spec, url


@pytest.fixture(scope="module")
def s3_story(s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One finished story run into the test server's bucket (its directory and store
    URL), made once for the tests that only read it (each checks that it stays so)."""
    d = tmp_path_factory.mktemp("console-s3")
    _, url = _story(d, s3_server)
    return d, url


def _pages(c: Any, extra: tuple[str, ...] = ()) -> str:
    return "".join(c.get(p).text for p in ("/", "/s/0/0/history", "/s/0/0/charts",
                                           "/s/0/0/cp/1", *extra))


def test_every_route_on_an_s3_store_reads_and_never_writes(
        tmp_path: Path, s3_env: Any, make_client: Any, s3_story: tuple[Path, str]) -> None:
    job, url = s3_story
    prefix = url.split("/", 3)[3]
    keys = [k for k, *_ in _listing(s3_env) if k.startswith(prefix + "/cp-")]
    n = len({k.split("/")[1] for k in keys})
    assert n > 3
    before = _listing(s3_env)
    c = make_client(url)
    index = routes._ok(c.get("/"))
    assert "s3: <code>" in index and url in index
    routes._walk(c, None, n)
    # window lookup, its proof verifying offline against the store's signed manifest
    w = emitted_window(job)
    q = f"key={w['key']}&start={w['window_start']}&end={w['window_end']}"
    looked = routes._ok(c.get(f"/s/0/0/window?{q}"))
    assert 'id="window-status">emitted<' in looked and "proof-download" in looked
    resp = c.get(f"/s/0/0/window/proof?{q}")
    assert resp.status_code == 200 and "attachment" in resp.headers["content-disposition"]
    proof = tmp_path / "proof.json"
    proof.write_bytes(resp.content)
    # (`receipts verify --checkpoints` reads directories only: the manifest it names)
    signed = json.loads(resp.content)["checkpoint"]
    manifest = tmp_path / "MANIFEST.json"
    manifest.write_bytes(_client(s3_env).get_object(
        Bucket=s3_env.bucket, Key=f"{prefix}/cp-{signed:012d}/MANIFEST.json")["Body"].read())
    res = in_process("receipts", "verify", str(proof), "--manifest", str(manifest))
    assert res.returncode == 0, res.stdout + res.stderr
    page = _pages(c)
    assert s3_env.secret_key not in page and s3_env.access_key not in page
    assert _listing(s3_env) == before  # read-only: not an object created, replaced, deleted
    # the store the console opens refuses the writes a run makes, before any request
    from sealstream.console._objstores import open_s3

    store = open_s3(url)
    for write in (lambda: store.move_aside(n, "TEST"),
                  lambda: store.delete(1), lambda: store.claim(n + 1)):
        with pytest.raises(CheckpointError, match="the console never writes"):
            write()
    with pytest.raises(CheckpointError, match="the console never writes"), store.locked():
        pass
    assert _listing(s3_env) == before


def test_a_damaged_checkpoint_in_s3_is_a_verdict_and_stays_in_the_history_moved_aside(
        tmp_path: Path, s3_env: Any, make_client: Any) -> None:
    spec, url = _story(tmp_path, s3_env)
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    s3 = _client(s3_env)
    newest = max(k for k, *_ in _listing(s3_env)
                 if k.startswith(f"{prefix}/cp-") and k.endswith("/state.arrow"))
    cid = int(newest.split("/")[1].removeprefix("cp-"))
    data = s3.get_object(Bucket=bucket, Key=newest)["Body"].read()
    s3.put_object(Bucket=bucket, Key=newest,
                  Body=data[:100] + bytes([data[100] ^ 0x40]) + data[101:])
    before = _listing(s3_env)
    c = make_client(url)
    rows = routes._rows(routes._ok(c.get("/s/0/0/history")))
    assert rows[0] == {"id": str(cid), "verdict": "INCONSISTENT_STATE",
                       "reason": "HASH_MISMATCH", "aside": False}
    detail = routes._ok(c.get(f"/s/0/0/cp/{cid}"))
    assert 'data-verdict="INCONSISTENT_STATE"' in detail
    assert "does not match its SHA-256 in the manifest" in detail
    assert _listing(s3_env) == before
    # recovery moves it under rejected/ and resumes; the console still shows it
    res = run(spec, env={**s3_env.env(), mf.KEY_ENV: ""})
    assert res.returncode == 0, res.stderr
    assert any(k.startswith(f"{prefix}/rejected/cp-{cid:012d}-") for k, *_ in
               _listing(s3_env))
    before = _listing(s3_env)
    rows = routes._rows(routes._ok(c.get("/s/0/0/history")))
    aside = [r for r in rows if r["aside"]]
    assert aside == [{"id": str(cid), "verdict": "INCONSISTENT_STATE",
                      "reason": "HASH_MISMATCH", "aside": True}]
    assert int(rows[0]["id"]) > cid and rows[0]["verdict"] == "ATOMIC_CHECKPOINT"
    page = routes._ok(c.get(f"/s/0/0/aside/0/{cid}"))
    assert "moved aside" in page and "HASH_MISMATCH" in page
    assert "does not match its SHA-256" in page
    assert _listing(s3_env) == before


def test_an_unreachable_s3_endpoint_is_a_page_with_the_error(
        make_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    secret = "console-secret-" + uuid.uuid4().hex
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "console-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("SEALSTREAM_S3_RETRY_S", "1")
    started = time.monotonic()
    c = make_client("s3://nowhere-bucket/ckpt")
    page = routes._ok(c.get("/"))
    took = time.monotonic() - started
    assert "cannot read this store" in page
    assert "the server did not answer" in page and f"127.0.0.1:{port}" in page
    assert secret not in page and "console-key-id" not in page
    assert took < 60, took  # bounded by the retry budget, not botocore's minutes
    resp = c.get("/s/0/0/history")
    assert resp.status_code == 404 and "not found" in resp.text


def _serve(*args: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """``sealstream console ARGS --port 0`` and the URL it prints when bound."""
    proc = subprocess.Popen([sys.executable, "-m", "sealstream", "console", *args,
                             "--port", "0"], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, env=env,
                            preexec_fn=die_with_parent())  # not left by a killed pytest
    assert proc.stderr is not None
    printed = []
    for line in proc.stderr:  # blocks until the line (or the end: a failed start)
        printed.append(line)
        m = re.search(r"serving (http://\S+?:\d+/)", line)
        if m is not None:
            return proc, m.group(1)
    proc.wait(timeout=60)
    raise AssertionError(f"the console did not start: {printed}")


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


def test_the_console_command_takes_the_endpoint_and_bounds_an_unreachable_one(
        s3_server: Any, s3_story: tuple[Path, str]) -> None:
    """`--endpoint-url` instead of AWS_ENDPOINT_URL; without SEALSTREAM_S3_RETRY_S an
    unreachable endpoint is retried for the console's 3 s, not a run's 30 s."""
    import httpx

    _, url = s3_story
    env = {k: v for k, v in os.environ.items()
           if k not in ("AWS_ENDPOINT_URL", "SEALSTREAM_S3_RETRY_S")}
    env.update({k: v for k, v in s3_server.env().items() if k != "AWS_ENDPOINT_URL"})
    before = _listing(s3_server)
    proc, home = _serve(url, "--endpoint-url", s3_server.endpoint, env=env)
    try:
        page = httpx.get(home, timeout=120).text
        assert "story" in page and "ATOMIC_CHECKPOINT" in page and url in page
        assert s3_server.secret_key not in page
    finally:
        _stop(proc)
    assert _listing(s3_server) == before
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc, home = _serve(url, "--endpoint-url", f"http://127.0.0.1:{port}", env=env)
    try:
        # from the bound server's first request: its start-up (a Python process and its
        # imports, 10-20 s at load 50) is not what the 3 s budget bounds
        started = time.monotonic()
        page = httpx.get(home, timeout=120).text
        took = time.monotonic() - started
        assert "cannot read this store" in page and "did not answer for 3 s" in page
        assert took < 30, took  # well under a run's 30 s budget
    finally:
        _stop(proc)
