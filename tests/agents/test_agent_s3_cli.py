"""Issue 30: ``sealstream checkpoints list/verify/inspect`` and ``agents repair`` on an
agent store in S3 (``s3://bucket/prefix``, a real SeaweedFS server).

The same LangGraph thread is written to S3 and to SQLite: the reports agree verdict
for verdict, before and after a row object is tampered with in the bucket. Inspection
takes no lease and writes nothing (every key and ETag of the prefix is the same
after it), and it sees a SIGKILLed writer's committed but unapplied journal. Repair
takes the writer's lease: refused in one line naming the holder while a live writer
process holds it, then it moves the damaged checkpoint aside."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from test_agent_tamper import T, _alter_json, _set, _thread  # noqa: E402

from sealstream.agents import EffectLedger  # noqa: E402
from sealstream.agents._s3store import row_key  # noqa: E402
from sealstream.agents.langgraph import SealstreamSaver  # noqa: E402
from sealstream.cli import main  # noqa: E402
from sealstream.errors import LockHeldError  # noqa: E402

KEY = "s3-cli-agent-key"

# A writer process: saves one checkpoint of execution "w" (crashing at CRASH if
# given), then holds the store open (and its lease) until its stdin closes.
WRITER = """
import sys
from sealstream._runtime.crash import CrashPoints
from sealstream.agents import AgentCheckpoint, AgentCheckpointStore
url, crash = sys.argv[1], sys.argv[2]
store = AgentCheckpointStore(url, encryption_key=None)
if crash:
    store.rows.crash = CrashPoints(crash)
store.save(AgentCheckpoint("w", node="n0", state={"i": 0}))
print("holding", flush=True)
sys.stdin.read()
store.close()
"""


@pytest.fixture
def env(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SEALSTREAM_CHECKPOINT_KEY", KEY)
    monkeypatch.delenv("SEALSTREAM_ENCRYPTION_KEY", raising=False)
    return s3_server


def _client(server: Any) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                        aws_access_key_id=server.access_key,
                        aws_secret_access_key=server.secret_key)


def _objects(server: Any, prefix: str) -> dict[str, str]:
    """Every key under ``prefix`` with its ETag."""
    out: dict[str, str] = {}
    for page in _client(server).get_paginator("list_objects_v2").paginate(
            Bucket=server.bucket, Prefix=prefix + "/"):
        out.update({o["Key"]: o["ETag"] for o in page.get("Contents", [])})
    return out


def _write(url: str) -> list[str]:
    saver = SealstreamSaver(url)
    ids = _thread(saver)
    ledger = EffectLedger(saver.store, T)
    ledger.request_approval("refund-1", {"amount": 5})
    ledger.close()
    saver.close()
    return ids


def _report(url: str, capsys: pytest.CaptureFixture[str], command: str = "list") -> Any:
    assert main(["checkpoints", command, url, "--json"]) in (0, 1)
    return json.loads(capsys.readouterr().out)


def _shape(data: Any) -> list[Any]:
    """A report without what differs between two stores (ids, times, the location)."""
    return [(e["execution"], e["namespace"], e["head"] is not None,
             [(c["verdict"], c["reason"]) for c in e["checkpoints"]],
             [a["id"] for a in e["pending_approvals"]], len(e["open_intents"]),
             len(e["moved_aside"]), e["ledger_problems"]) for e in data["executions"]]


def _writer(url: str, crash: str = "") -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WRITER, url, crash], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ))


def test_cli_reports_an_s3_agent_store_as_sqlite_and_writes_nothing(
        env: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = f"agents-cli-{uuid.uuid4().hex[:10]}"
    url, lite = f"s3://{env.bucket}/{prefix}", f"sqlite:///{tmp_path / 'agents.db'}"
    ids, lite_ids = _write(url), _write(lite)
    before = _objects(env, prefix)

    data, lite_data = _report(url, capsys), _report(lite, capsys)
    assert data["kind"] == "agents" and env.secret_key not in json.dumps(data)
    (ex,) = data["executions"]
    assert ex["execution"] == T and ex["head"] == ids[-1]
    assert [c["id"] for c in ex["checkpoints"]] == ids[::-1]
    assert _shape(data) == _shape(lite_data)
    assert main(["checkpoints", "verify", url]) == 0
    assert "pending" in capsys.readouterr().out
    assert main(["checkpoints", "inspect", url, ids[0]]) == 0
    assert ids[0] in capsys.readouterr().out
    assert _objects(env, prefix) == before  # no lease taken, no probe, nothing written

    # a row object altered in the bucket: the same verdict as on SQLite
    client = _client(env)
    obj = f"{prefix}/{row_key(('cp', T, '', ids[-1]))}"
    raw = client.get_object(Bucket=env.bucket, Key=obj)["Body"].read()
    client.put_object(Bucket=env.bucket, Key=obj, Body=_alter_json(raw))
    saver = SealstreamSaver(lite)
    raw = saver.store.rows.get("cp", T, "", lite_ids[-1])
    assert raw is not None
    _set(saver, "cp", lite_ids[-1], _alter_json(raw))
    saver.close()
    tampered = _objects(env, prefix)
    assert main(["checkpoints", "verify", url]) == 1
    assert "SIGNATURE_MISMATCH" in capsys.readouterr().out
    assert main(["checkpoints", "verify", lite]) == 1
    capsys.readouterr()
    assert _shape(_report(url, capsys, "verify")) == _shape(_report(lite, capsys, "verify"))
    assert main(["agents", "repair", url, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would move aside" in out and ids[-1] in out
    assert main(["checkpoints", "verify", url]) == 1  # a dry run changes no row
    capsys.readouterr()
    assert {k: v for k, v in _objects(env, prefix).items() if "/rows/" in k} == {
        k: v for k, v in tampered.items() if "/rows/" in k}

    # a live writer process holds the lease: inspection still reads, repair is refused
    writer = _writer(url)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "holding\n", (
            writer.stderr.read() if writer.stderr else "")
        held = _objects(env, prefix)
        assert main(["checkpoints", "list", url]) == 0
        assert "- w: 1 checkpoint(s)" in capsys.readouterr().out
        assert _objects(env, prefix) == held
        assert main(["agents", "repair", url]) == LockHeldError("").exit_code
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is locked by another process" in err[0]
        assert f'"pid": {writer.pid}' in err[0] and env.secret_key not in err[0]
    finally:
        assert writer.stdin is not None
        writer.stdin.close()
        code = writer.wait(timeout=300)
        for pipe in (writer.stdout, writer.stderr):
            if pipe is not None:
                pipe.close()
    assert code == 0
    assert main(["agents", "repair", url]) == 0
    assert "moved aside" in capsys.readouterr().out
    assert main(["checkpoints", "verify", url]) == 0
    capsys.readouterr()
    data = _report(url, capsys)
    (ex,) = [e for e in data["executions"] if e["execution"] == T]
    assert ex["head"] == ids[-2] and ex["moved_aside"] == [ids[-1]]


def test_inspection_sees_a_killed_writers_committed_journal_without_applying_it(
        env: Any, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = f"agents-cli-{uuid.uuid4().hex[:10]}"
    url = f"s3://{env.bucket}/{prefix}"
    writer = _writer(url, "s3_rows_committed")  # SIGKILLed after the commit point
    _, stderr = writer.communicate(timeout=300)
    assert writer.returncode == -signal.SIGKILL, stderr
    before = _objects(env, prefix)
    assert any("/journal/" in k for k in before), "no committed journal left to read"
    data = _report(url, capsys, "verify")
    (ex,) = data["executions"]
    assert ex["execution"] == "w" and len(ex["checkpoints"]) == 1
    assert ex["checkpoints"][0]["verdict"] == "ATOMIC_CHECKPOINT" and ex["head"]
    assert _objects(env, prefix) == before  # the reader redid nothing: no lease


def test_a_stream_store_or_an_empty_prefix_is_not_an_agent_store(env: Any) -> None:
    from sealstream.cli._agents import is_agent_store

    assert not is_agent_store(f"s3://{env.bucket}/nothing-{uuid.uuid4().hex[:10]}")
    prefix = f"stream-{uuid.uuid4().hex[:10]}"
    _client(env).put_object(Bucket=env.bucket, Key=f"{prefix}/LEASE", Body=json.dumps(
        {"holder": {"pid": 1}, "generation": 1, "expires_ms": 0, "released": True}
    ).encode())  # a stream checkpoint store's lease has no "seq"
    assert not is_agent_store(f"s3://{env.bucket}/{prefix}")


def test_the_console_shows_an_s3_agent_store_read_only(env: Any) -> None:
    pytest.importorskip("starlette")
    pytest.importorskip("jinja2")
    from starlette.testclient import TestClient

    from sealstream.console import create_app

    prefix = f"agents-console-{uuid.uuid4().hex[:10]}"
    url = f"s3://{env.bucket}/{prefix}"
    ids = _write(url)
    client = _client(env)
    obj = f"{prefix}/{row_key(('cp', T, '', ids[-1]))}"
    raw = client.get_object(Bucket=env.bucket, Key=obj)["Body"].read()
    client.put_object(Bucket=env.bucket, Key=obj, Body=_alter_json(raw))
    before = _objects(env, prefix)
    with TestClient(create_app([url])) as c:
        assert 'href="/agents/0"' in c.get("/").text
        page = c.get("/agents/0").text
    assert T in page and "refund-1" in page and "SIGNATURE_MISMATCH" in page
    assert all(i in page for i in ids) and env.secret_key not in page
    assert _objects(env, prefix) == before
