"""Crash -> resume -> the payment happens exactly once.

The story runs examples/agent_payment.py, a LangGraph agent (plan -> approve ->
pay) on SealstreamSaver and the effect ledger, against a fake payment provider (a
SQLite file with its own idempotency-key table). Each agent run is a real
process; the crash runs SIGKILL themselves at a named point
(``SEALSTREAM_CRASH_AT``):

* ``after_intent``: the intent is committed, the provider was never called;
* ``after_call``: the provider accepted the payment, the tool returned, and
  neither the outcome nor the next checkpoint was written;
* ``inside_checkpoint_commit``: the checkpoint after the payment is half written
  (manifest and blobs inserted, transaction not committed).

(The approval is granted before the first run, so each story needs two agent
processes; the pending-approval-across-restarts story is told in-process in
test_agent_graph.py, every crash point against a reference model in
test_agent_ledger.py.)

The resumed process must reconcile (asking the provider by idempotency key) and
end with exactly one payment and at most one submission.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.graph")

from sealstream.agents import EffectLedger  # noqa: E402
from sealstream.agents.langgraph import SealstreamSaver  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_payment.py"
THREAD = "invoice-2024-117"
APPROVAL = "pay-invoice-2024-117"
KEY = "scenario-signing-key"


def _env(crash: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SEALSTREAM_CRASH_AT", "SEALSTREAM_ENCRYPTION_KEY")}
    env["SEALSTREAM_CHECKPOINT_KEY"] = KEY
    if crash:
        env["SEALSTREAM_CRASH_AT"] = crash
    return env


def _start(work: Path, crash: str | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(EXAMPLE), "--dir", str(work), "step"],
                            env=_env(crash), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _provider(work: Path) -> dict[str, int]:
    conn = sqlite3.connect(work / "provider.db")
    try:
        def one(sql: str) -> int:
            return int(conn.execute(sql).fetchone()[0])

        return {"payments": one("SELECT COUNT(*) FROM payments"),
                "submits": one("SELECT COUNT(*) FROM requests WHERE kind = 'submit'")}
    finally:
        conn.close()


def _history(work: Path) -> list[Any]:
    saver = SealstreamSaver(work / "agents.db", key=KEY.encode(), encryption_key=None)
    try:
        return saver.store.history(THREAD)
    finally:
        saver.close()


def _story(work: Path, point: str) -> dict[str, Any]:
    """Approve the payment up front; run the agent and let it SIGKILL itself at
    ``point``; look at the provider; resume in a new process; look again."""
    ledger = EffectLedger(work / "agents.db", THREAD, key=KEY.encode(), encryption_key=None)
    ledger.request_approval(APPROVAL, {"payee": "ACME GmbH", "amount_cents": 125_000})
    ledger.decide(APPROVAL, True, by="test")
    ledger.close()
    crash = _start(work, crash=point if ":" in point else f"{point}:1")
    crash.communicate(timeout=120)
    after_crash = _provider(work)
    history_after_crash = _history(work)
    resume = _start(work)
    out, err = resume.communicate(timeout=120)
    return {"crash_code": crash.returncode, "after_crash": after_crash,
            "history_after_crash": history_after_crash,
            "resume_code": resume.returncode, "out": out, "err": err,
            "after_resume": _provider(work)}


def _verified_history(work: Path) -> None:
    """Every checkpoint and ledger row verifies; one effect, done; the final state
    and the summary checkpoint name the payment."""
    saver = SealstreamSaver(work / "agents.db", key=KEY.encode(), encryption_key=None)
    verdicts = [v for ns in saver.store.namespaces(THREAD)
                for v in saver.store.history(THREAD, ns)]
    assert verdicts and all(v.ok for v in verdicts), verdicts
    ledger = EffectLedger(saver.store, THREAD)
    assert all(v.ok for v in ledger.verify())
    effects = ledger.effects()
    assert len(effects) == 1 and effects[0].done
    tup = saver.get_tuple({"configurable": {"thread_id": THREAD}})
    assert tup is not None
    assert tup.checkpoint["channel_values"]["payment"] == effects[0].result
    summary = saver.store.latest(THREAD, "summary")
    assert summary is not None and summary.completed_actions[0]["key"] == effects[0].key
    saver.close()


def test_crash_between_intent_and_call_pays_once(tmp_path: Path) -> None:
    r = _story(tmp_path, "after_intent")
    assert r["crash_code"] == -signal.SIGKILL
    assert r["after_crash"] == {"payments": 0, "submits": 0}  # the intent, nothing else
    assert r["resume_code"] == 0, r["err"]
    assert "reconciling them first" in r["out"]
    # the provider had nothing under the key, so the call was issued once, with it
    assert "via=call-after-reconcile" in r["out"]
    assert r["after_resume"] == {"payments": 1, "submits": 1}
    _verified_history(tmp_path)


def test_crash_after_the_tool_returned_reconciles_without_paying_again(
        tmp_path: Path) -> None:
    r = _story(tmp_path, "after_call")
    assert r["crash_code"] == -signal.SIGKILL
    assert r["after_crash"] == {"payments": 1, "submits": 1}  # paid; nothing recorded
    assert r["resume_code"] == 0, r["err"]
    assert "reconciling them first" in r["out"]
    assert "via=reconcile" in r["out"]  # found under its key: recorded, not resubmitted
    assert r["after_resume"] == {"payments": 1, "submits": 1}
    _verified_history(tmp_path)


def test_crash_inside_the_checkpoint_transaction_leaves_no_half_checkpoint(
        tmp_path: Path) -> None:
    # the 5th checkpoint is the one after the payment node: killed after its
    # manifest and blobs were written, before its transaction committed
    r = _story(tmp_path, "inside_checkpoint_commit:5")
    assert r["crash_code"] == -signal.SIGKILL
    assert r["after_crash"] == {"payments": 1, "submits": 1}
    torn = r["history_after_crash"]
    assert len(torn) == 4 and all(v.ok for v in torn)  # rolled back: no partial rows
    assert r["resume_code"] == 0, r["err"]
    assert "resuming after node(s) ['pay']" in r["out"]  # its writes were committed
    assert r["after_resume"] == {"payments": 1, "submits": 1}
    _verified_history(tmp_path)
