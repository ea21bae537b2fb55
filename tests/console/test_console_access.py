"""The console's token, its running-job view (a real metrics endpoint), its agent
threads view (a real agent store), and `sealstream console`'s own errors."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from sealstream.cli import main


def test_a_token_is_required_as_a_bearer_header_or_a_cookie(
        finished_job: Path, make_client: Any) -> None:
    c = make_client(finished_job / "ckpt", token="t0ken")
    for path in ("/", "/s/0/0/history", "/s/0/0/cp/1", "/static/console.css", "/api/job"):
        resp = c.get(path)
        assert resp.status_code == 401 and "story" not in resp.text, path
    assert c.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/", headers={"Authorization": "Bearer t0ken"}).status_code == 200
    assert c.get("/?token=nope").status_code == 401
    resp = c.get("/s/0/0/history?token=t0ken", follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == "/s/0/0/history"
    assert "httponly" in resp.headers["set-cookie"].lower()
    assert c.get("/s/0/0/history").status_code == 200  # the cookie carries it now


def test_loopback_binds_need_no_token_and_others_do() -> None:
    from sealstream.console._serve import is_loopback

    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.4", "example.org"))


def test_credentials_in_any_rendered_text_are_redacted() -> None:
    from sealstream.console._app import redact_text

    assert redact_text("cannot reach postgresql://bob:hunter2@db:5432/x now") == \
        "cannot reach postgresql://bob:***@db:5432/x now"
    assert redact_text("kafka://k?password=hunter2&x=1") == "kafka://k?password=***&x=1"
    assert redact_text("plain text, a:b@c") == "plain text, a:b@c"


def test_the_running_job_page_and_api_read_its_metrics_endpoint(make_client: Any) -> None:
    from sealstream.cli._metrics import MetricsServer, Snapshot

    server = MetricsServer(0, "story")
    try:
        server.update(Snapshot(pipeline="story", events=500, late_events=3, checkpoints=2,
                               watermark_ms=1_700_000_000_000,
                               partitions=(("t/0", 1_700_000_000_000), ("t/1", 1_700_000_002_000)),
                               holder="t/0", connected=True, lags=(("t/0", 40), ("t/1", 2)),
                               last_checkpoint_ms=12.5, last_checkpoint_bytes=4096))
        c = make_client(job=f"127.0.0.1:{server.port}")
        data = c.get("/api/job").json()
        assert data["ok"] and data["pipeline"] == "story"
        assert data["counts"]["events"] == 500 and data["counts"]["late_events"] == 3
        assert data["holder"] == "t/0" and data["connected"] is True
        assert data["watermark_iso"] == "2023-11-14T22:13:20.000Z"
        assert {p["partition"]: p["lag"] for p in data["partitions"]} == {"t/0": 40, "t/1": 2}
        assert data["last_checkpoint"]["bytes"] == 4096
        server.update(Snapshot(pipeline="story", events=900))
        again = c.get("/api/job").json()
        assert again["counts"]["events"] == 900 and again["rates"]["events"] > 0
        page = c.get("/job")
        assert page.status_code == 200 and 'id="job-holder">' in page.text
    finally:
        server.close()


def test_a_job_that_does_not_answer_is_said_so(make_client: Any) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    c = make_client(job=f"http://user:pw@127.0.0.1:{port}/metrics")
    data = c.get("/api/job").json()
    assert data["ok"] is False and "cannot read" in data["error"] and ":pw@" not in data["error"]
    page = c.get("/job")
    assert page.status_code == 200 and "cannot read" in page.text and ":pw@" not in page.text


def test_agent_threads_show_verdicts_approvals_nodes_forks_and_repairs(
        tmp_path: Path, make_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("langgraph.checkpoint.conformance")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "agents"))
    from langgraph.checkpoint.conformance.test_utils import (
        generate_checkpoint,
        generate_config,
        generate_metadata,
    )
    from test_agent_tamper import T, _alter_json, _set, _thread

    from sealstream.agents import AgentCheckpoint, EffectLedger
    from sealstream.agents.langgraph import SealstreamSaver

    monkeypatch.setenv("SEALSTREAM_CHECKPOINT_KEY", "console-agent-key")
    url = f"sqlite:///{tmp_path / 'agents.db'}"
    saver = SealstreamSaver(url)
    ids = _thread(saver)
    cfg = generate_config(T)
    cfg["configurable"]["checkpoint_id"] = ids[0]  # time travel: a fork from the first
    fork = saver.put(cfg, generate_checkpoint(), generate_metadata(step=9), {})
    fork_id = fork["configurable"]["checkpoint_id"]
    saver.store.save(AgentCheckpoint("order-17", node="charge-card"))
    ledger = EffectLedger(saver.store, T)
    ledger.request_approval("refund-1", {"amount": 5})
    ledger.close()
    raw = saver.store.rows.get("cp", T, "", ids[-1])
    assert raw is not None
    _set(saver, "cp", ids[-1], _alter_json(raw))  # a damaged checkpoint
    saver.close()
    c = make_client(url)
    index = c.get("/").text
    assert 'href="/agents/0"' in index
    page = c.get("/agents/0").text
    assert T in page and "refund-1" in page and "SIGNATURE_MISMATCH" in page
    assert all(i in page for i in [*ids, fork_id])
    assert page.count('class="fork"') == 1  # the fork, and only it
    row = next(r for r in page.split("<tr>") if r.startswith(f"<td><code>{fork_id}</code>"))
    assert f"<code>{ids[0]}</code>" in row and 'class="fork"' in row
    assert "charge-card" in page  # the agent thread's current node
    assert main(["agents", "repair", url]) == 0
    page = c.get("/agents/0").text
    assert "moved aside by a repair" in page and ids[-1] in page


def test_console_cli_errors_are_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert main(["console", str(tmp_path), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--port {port}: cannot listen there" in err
    assert main(["console"]) == 2  # a STORE is required
    assert "Missing argument" in capsys.readouterr().err


def test_a_loopback_console_serves_only_loopback_host_names(
        finished_job: Path, make_client: Any) -> None:
    """DNS rebinding: a web page whose name resolves to 127.0.0.1 sends its own Host."""
    from starlette.testclient import TestClient

    from sealstream.console import create_app

    app = create_app([str(finished_job / "ckpt")], allowed_hosts=["127.0.0.1", "localhost"])
    with TestClient(app, base_url="http://evil.example:8080") as c:
        assert c.get("/").status_code == 400
    with TestClient(app, base_url="http://127.0.0.1:8080") as c:
        assert c.get("/").status_code == 200
    with TestClient(app, base_url="http://localhost:8080") as c:
        assert c.get("/s/0/0/history").status_code == 200
