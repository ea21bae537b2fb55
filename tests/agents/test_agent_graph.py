"""A LangGraph agent on SealstreamSaver, in-process: a pending approval survives a
restart and only an explicit decision resumes it; LangGraph's asynchronous
saving (writes racing their checkpoint) keeps the commit order; the async API
runs the same graph."""

from __future__ import annotations

import asyncio
import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph.graph")

from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import Command, interrupt  # noqa: E402

from sealstream.agents import EffectLedger, Tool  # noqa: E402
from sealstream.agents.langgraph import SealstreamSaver  # noqa: E402

KEY = b"graph-signing-key"


class S(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    paid: dict[str, Any]


def _graph(saver: SealstreamSaver, ledger: EffectLedger, calls: list[str]) -> Any:
    def pay_call(key: str, args: Any) -> dict[str, Any]:
        calls.append(key)
        return {"id": key[:8], "amount": args["amount"]}

    tool = Tool("pay", pay_call, reissue_safe=True)

    def approve(state: S) -> S:
        ledger.request_approval("a1", {"amount": 10})
        approval = ledger.approval("a1")
        assert approval is not None
        if approval.status == "pending":
            interrupt({"approval": "a1"})
            approval = ledger.approval("a1")
            assert approval is not None and approval.status != "pending"
        return {"log": [f"approval {approval.status}"]}

    def pay(state: S) -> S:
        return {"paid": ledger.perform(tool, "pay", {"amount": 10}), "log": ["paid"]}

    def fan_a(state: S) -> S:
        return {"log": ["a"]}

    def fan_b(state: S) -> S:
        return {"log": ["b"]}

    g = StateGraph(S)
    g.add_node("approve", approve)
    g.add_node("pay", pay)
    g.add_node("fan_a", fan_a)
    g.add_node("fan_b", fan_b)
    g.add_edge(START, "fan_a")
    g.add_edge(START, "fan_b")
    g.add_edge("fan_a", "approve")
    g.add_edge("fan_b", "approve")
    g.add_edge("approve", "pay")
    g.add_edge("pay", END)
    return g.compile(checkpointer=saver)


def test_pending_approval_survives_restart_and_needs_an_explicit_decision(
        tmp_path: Path) -> None:
    db, cfg, calls = tmp_path / "agents.db", {"configurable": {"thread_id": "t1"}}, []
    saver = SealstreamSaver(db, key=KEY, encryption_key=None)
    ledger = EffectLedger(saver.store, "t1")
    _graph(saver, ledger, calls).invoke({"log": []}, cfg)
    saver.close()  # the process "restarts"

    saver = SealstreamSaver(db, key=KEY, encryption_key=None)
    ledger = EffectLedger(saver.store, "t1")
    graph = _graph(saver, ledger, calls)
    state = graph.get_state(cfg)
    assert state.next == ("approve",) and state.tasks[0].interrupts
    assert [a.approval_id for a in ledger.pending_approvals()] == ["a1"]
    with pytest.raises(AssertionError):  # resuming without a recorded decision is refused
        graph.invoke(Command(resume="approved"), cfg)
    assert calls == []
    ledger.decide("a1", True, by="alice")
    assert ledger.pending_approvals() == []
    result = graph.invoke(Command(resume="approved"), cfg)
    assert result["paid"]["amount"] == 10 and len(calls) == 1
    assert sorted(result["log"]) == ["a", "approval approved", "b", "paid"]
    assert all(v.ok for v in saver.store.history("t1"))
    saver.close()


def test_async_durability_keeps_writes_behind_their_checkpoint(tmp_path: Path) -> None:
    saver = SealstreamSaver(tmp_path / "agents.db", key=KEY, encryption_key=None)
    ledger = EffectLedger(saver.store, "t2")
    ledger.request_approval("a1", {"amount": 10})
    ledger.decide("a1", True, by="bob")
    calls: list[str] = []
    cfg = {"configurable": {"thread_id": "t2"}}
    result = _graph(saver, ledger, calls).invoke({"log": []}, cfg, durability="async")
    assert result["paid"]["amount"] == 10 and len(calls) == 1
    history = saver.store.history("t2")
    assert len(history) >= 4 and all(v.ok for v in history), history
    assert all(tup.pending_writes is not None for tup in saver.list(cfg))
    saver.close()


def test_async_api_runs_the_same_graph(tmp_path: Path) -> None:
    saver = SealstreamSaver(tmp_path / "agents.db", key=KEY, encryption_key=None)
    ledger = EffectLedger(saver.store, "t3")
    ledger.request_approval("a1", {"amount": 10})
    ledger.decide("a1", True, by="carol")
    calls: list[str] = []
    cfg = {"configurable": {"thread_id": "t3"}}
    result = asyncio.run(_graph(saver, ledger, calls).ainvoke({"log": []}, cfg))
    assert result["paid"]["amount"] == 10 and len(calls) == 1
    again = asyncio.run(_graph(saver, ledger, calls).ainvoke(None, cfg))
    assert again["paid"] == result["paid"] and len(calls) == 1
    saver.close()


def test_writes_never_exist_without_their_checkpoint(tmp_path: Path) -> None:
    import threading

    from langgraph.checkpoint.conformance.test_utils import (
        generate_checkpoint,
        generate_config,
        generate_metadata,
    )

    from sealstream.errors import CheckpointError

    saver = SealstreamSaver(tmp_path / "agents.db", key=KEY, encryption_key=None,
                            writes_wait_s=5.0)
    cp = generate_checkpoint()
    target = generate_config("t4", checkpoint_id=cp["id"])
    # the write arrives first (LangGraph saves in the background): it waits
    early = threading.Thread(target=saver.put_writes, args=(target, [("ch", 1)], "task"))
    early.start()
    assert saver.store.rows.scan("w", "t4") == []
    saver.put(generate_config("t4"), cp, generate_metadata(), {})
    early.join(timeout=10)
    tup = saver.get_tuple(target)
    assert tup is not None and tup.pending_writes == [("task", "ch", 1)]
    # a write for a checkpoint that never commits is refused and leaves nothing
    saver.writes_wait_s = 0.1
    with pytest.raises(CheckpointError, match="never stored without their checkpoint"):
        saver.put_writes(generate_config("t4", checkpoint_id="never"), [("ch", 2)], "task")
    assert [r.name.split("|")[0] for r in saver.store.rows.scan("w", "t4")] == [cp["id"]]
    saver.close()
