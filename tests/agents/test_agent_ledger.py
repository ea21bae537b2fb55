"""The effect ledger against a small reference: whatever the crash point, every
requested effect happens exactly once in the external system, and results are
what the system recorded."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sealstream.agents import (
    ApprovalError,
    EffectLedger,
    Reconciliation,
    Tool,
    UnreconciledEffectError,
    idempotency_key,
)

KEY = b"ledger-signing-key"
POINTS = (None, "after_intent", "after_call", "after_outcome")


class Killed(BaseException):
    """Stands in for SIGKILL in-process: nothing after the crash point runs."""


class Provider:
    """The external system: at most one payment per idempotency key."""

    def __init__(self) -> None:
        self.payments: dict[str, dict[str, Any]] = {}
        self.submits: Counter[str] = Counter()

    def submit(self, key: str, args: Any) -> dict[str, Any]:
        self.submits[key] += 1
        return self.payments.setdefault(key, {"id": f"p{len(self.payments)}", **args})

    def lookup(self, key: str, args: Any) -> Reconciliation:
        found = self.payments.get(key)
        return Reconciliation(found is not None, found)


def _tools(p: Provider) -> dict[str, Tool]:
    return {"rec": Tool("rec", p.submit, reconcile=p.lookup),
            "reissue": Tool("reissue", p.submit, reissue_safe=True)}


def _crash_at(point: str | None) -> Any:
    def crash(where: str) -> None:
        if where == point:
            raise Killed(where)
    return crash


ops = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 2), st.sampled_from(POINTS),
                         st.sampled_from(["rec", "reissue"])), min_size=1, max_size=8)


@settings(max_examples=25, deadline=None)
@given(ops)
def test_every_effect_happens_exactly_once_whatever_the_crash(
        plan: list[tuple[int, int, str | None, str]]) -> None:
    provider = Provider()
    tools = _tools(provider)
    expected: dict[str, dict[str, Any]] = {}  # reference: key -> the call made
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "a.db"
        for step, amount, point, tool in plan:
            ledger = EffectLedger(db, "exec", key=KEY, encryption_key=None,
                                  crash=_crash_at(point))
            ledger.reconcile_pending(tools)  # on (re)start: reconcile first
            args = {"amount": amount}
            key = idempotency_key("exec", step, {"tool": tool, "args": args})
            expected[key] = args
            try:
                result = ledger.perform(tools[tool], step, args)
                assert result == provider.payments[key]
            except Killed:
                pass
            ledger.close()
        ledger = EffectLedger(db, "exec", key=KEY, encryption_key=None)
        ledger.reconcile_pending(tools)
        effects = ledger.effects()
        ledger.close()
    assert all(e.done for e in effects)
    # exactly one payment per distinct call that reached the external system
    assert set(provider.payments) <= set(expected)
    for e in effects:
        assert provider.payments[e.key] == e.result
    for key, n in provider.submits.items():
        assert n >= 1
        if any(e.key == key and e.tool == "rec" for e in effects):
            assert n == 1  # with a reconcile function a call is never repeated


def test_idempotency_key_is_deterministic_and_content_bound() -> None:
    k = idempotency_key("e", 1, {"tool": "t", "args": {"a": 1, "b": [1, 2]}})
    assert k == idempotency_key("e", "1", {"args": {"b": [1, 2], "a": 1}, "tool": "t"})
    assert len(k) == 64
    assert k != idempotency_key("e2", 1, {"tool": "t", "args": {"a": 1, "b": [1, 2]}})
    assert k != idempotency_key("e", 2, {"tool": "t", "args": {"a": 1, "b": [1, 2]}})
    assert k != idempotency_key("e", 1, {"tool": "t", "args": {"a": 2, "b": [1, 2]}})


def test_without_reconcile_or_safe_reissue_it_refuses_to_guess(tmp_path: Path) -> None:
    provider = Provider()
    blind = Tool("blind", provider.submit)
    ledger = EffectLedger(tmp_path / "a.db", "e", key=KEY, encryption_key=None,
                          crash=_crash_at("after_call"))
    with pytest.raises(Killed):
        ledger.perform(blind, 1, {"amount": 5})
    ledger = EffectLedger(tmp_path / "a.db", "e", key=KEY, encryption_key=None)
    with pytest.raises(UnreconciledEffectError, match="resolve"):
        ledger.perform(blind, 1, {"amount": 5})
    with pytest.raises(UnreconciledEffectError):
        ledger.reconcile_pending({"blind": blind})
    assert sum(provider.submits.values()) == 1  # never repeated blindly
    key = ledger.effects()[0].key
    ledger.resolve(key, provider.payments[key])  # an operator checked the provider
    assert ledger.perform(blind, 1, {"amount": 5}) == provider.payments[key]
    assert sum(provider.submits.values()) == 1


def test_a_failing_call_leaves_the_intent_open_for_reconciliation(tmp_path: Path) -> None:
    provider = Provider()

    def flaky(key: str, args: Any) -> Any:
        provider.submit(key, args)
        raise TimeoutError("the provider did not answer in time")

    ledger = EffectLedger(tmp_path / "a.db", "e", key=KEY, encryption_key=None)
    with pytest.raises(TimeoutError):
        ledger.perform(Tool("pay", flaky, reconcile=provider.lookup), 1, {"amount": 5})
    assert [e.done for e in ledger.effects()] == [False]
    result = ledger.perform(Tool("pay", provider.submit, reconcile=provider.lookup), 1,
                            {"amount": 5})
    assert result["amount"] == 5 and sum(provider.submits.values()) == 1
    assert ledger.effects()[0].via == "reconcile"


def test_approvals_are_explicit_and_final(tmp_path: Path) -> None:
    ledger = EffectLedger(tmp_path / "a.db", "e", key=KEY, encryption_key=None)
    with pytest.raises(ApprovalError):
        ledger.decide("x", True, by="a")
    first = ledger.request_approval("x", {"amount": 5})
    assert first.status == "pending"
    assert ledger.request_approval("x", {"amount": 5}).status == "pending"  # idempotent
    with pytest.raises(ApprovalError):
        ledger.request_approval("x", {"amount": 6})
    ledger.close()
    ledger = EffectLedger(tmp_path / "a.db", "e", key=KEY, encryption_key=None)  # restart
    assert [a.approval_id for a in ledger.pending_approvals()] == ["x"]
    decided = ledger.decide("x", False, by="bob", note="too much")
    assert (decided.status, decided.by, decided.note) == ("rejected", "bob", "too much")
    assert ledger.decide("x", False, by="bob").status == "rejected"  # idempotent
    with pytest.raises(ApprovalError):
        ledger.decide("x", True, by="mallory")
    assert ledger.pending_approvals() == []
    assert all(v.ok for v in ledger.verify())


def test_results_read_back_as_json_and_non_json_keeps_the_intent_open(tmp_path: Path) -> None:
    from sealstream.errors import CheckpointError

    ledger = EffectLedger(tmp_path / "a.db", "e", key=KEY, encryption_key=None)
    first = ledger.perform(Tool("t", lambda k, a: (1, 2), reissue_safe=True), 1, {})
    assert first == [1, 2] == ledger.perform(Tool("t", lambda k, a: (9,)), 1, {})
    with pytest.raises(CheckpointError, match="JSON"):
        ledger.perform(Tool("u", lambda k, a: object()), 1, {})
    assert [(e.tool, e.done) for e in ledger.effects()] == [("t", True), ("u", False)]
