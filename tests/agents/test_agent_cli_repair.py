"""Issue 19: `sealstream checkpoints list/verify/inspect` understand an agent store
(per execution: checkpoints with verdicts, pending approvals, open ledger intents),
and `sealstream agents repair [--dry-run]` moves damaged checkpoints aside and
re-establishes a verified head (the same as AgentCheckpointStore.repair)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance.test_utils import generate_config  # noqa: E402
from test_agent_tamper import T, _alter_json, _set, _thread  # noqa: E402

from sealstream.agents import EffectLedger  # noqa: E402
from sealstream.agents.langgraph import SealstreamSaver  # noqa: E402
from sealstream.cli import main  # noqa: E402


def test_cli_lists_verifies_and_repairs_an_agent_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SEALSTREAM_CHECKPOINT_KEY", "cli-agent-key")
    monkeypatch.delenv("SEALSTREAM_ENCRYPTION_KEY", raising=False)
    url = f"sqlite:///{tmp_path / 'agents.db'}"
    saver = SealstreamSaver(url)
    ids = _thread(saver)
    ledger = EffectLedger(saver.store, T)
    ledger.request_approval("refund-1", {"amount": 5})
    ledger.close()
    saver.close()

    assert main(["checkpoints", "verify", url]) == 0
    assert "pending" in capsys.readouterr().out
    assert main(["checkpoints", "list", url, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (ex,) = data["executions"]
    assert ex["execution"] == T and ex["head"] == ids[-1]
    assert [c["id"] for c in ex["checkpoints"]] == ids[::-1]
    assert [a["id"] for a in ex["pending_approvals"]] == ["refund-1"]

    saver = SealstreamSaver(url)
    raw = saver.store.rows.get("cp", T, "", ids[-1])
    assert raw is not None
    _set(saver, "cp", ids[-1], _alter_json(raw))  # the newest is damaged
    saver.close()
    assert main(["checkpoints", "verify", url]) == 1
    assert "SIGNATURE_MISMATCH" in capsys.readouterr().out
    assert main(["checkpoints", "inspect", url, ids[-1]]) == 0
    assert main(["agents", "repair", url, "--dry-run"]) == 0
    assert "would move aside" in capsys.readouterr().out
    assert main(["checkpoints", "verify", url]) == 1  # a dry run changes nothing
    assert main(["agents", "repair", url]) == 0
    assert main(["checkpoints", "verify", url]) == 0
    saver = SealstreamSaver(url)
    got = saver.get_tuple(generate_config(T))
    assert got is not None and got.config["configurable"]["checkpoint_id"] == ids[-2]
    assert saver.store.quarantined(T) == [ids[-1]]
    saver.close()


def test_positional_idempotency_keys_tell_two_identical_calls_apart(tmp_path: Path) -> None:
    from sealstream.agents import Tool

    calls: list[str] = []
    tool = Tool("charge", lambda key, args: calls.append(key) or {"ok": key[:6]})
    db = tmp_path / "agents.db"
    for attempt in range(2):  # the second attempt re-runs the step after a "restart"
        ledger = EffectLedger(db, "e", key=b"k", encryption_key=None)
        ledger.begin_step(7)
        for _ in range(2):  # the same tool with the same arguments, twice in a loop
            ledger.perform(tool, None, {"amount": 1})
        ledger.close()
        assert len(calls) == 2, attempt  # two effects, never repeated on the re-run
    assert calls[0] != calls[1]
