"""The effect ledger: side effects recorded before and after, never blindly repeated.

Before a tool with side effects runs, its **intent** is committed with an
idempotency key derived from the execution id, the step and the canonical JSON
of the call (:func:`idempotency_key`); after it returns, its **outcome**. Both are
signed rows bound to their execution and namespace (same keys, same encryption
as the checkpoints). :meth:`EffectLedger.perform` therefore meets one of three
situations:

* an outcome exists: the recorded result is returned, the tool is not called;
* nothing exists: intent, call (with the key), outcome — in that order;
* an intent has no outcome (the process died between them): it is
  **reconciled first** — through the tool's ``reconcile`` function (ask the
  provider whether key K went through; if it did, its result becomes the outcome,
  if it did not, the call is issued once, with the same key), or, where the tool
  declares it safe (``reissue_safe``: the provider deduplicates by key), by
  re-issuing the call with the same key. Otherwise
  :class:`UnreconciledEffectError` is raised: never a blind repeat.
  :meth:`EffectLedger.resolve` records an outcome found by hand.

One runner per execution: :meth:`EffectLedger.perform` and
:meth:`EffectLedger.reconcile_pending` hold the execution's lock
(:meth:`~sealstream.agents.store.RowStore.execution_lock`: an ``flock`` for SQLite,
an advisory lock for PostgreSQL) while they look at, call and record an effect, so
two runners on one execution id can never both reconcile or re-issue an open
intent; the second gets :class:`~sealstream.errors.LockHeldError` (after waiting
``lock_timeout`` seconds). Hold :meth:`EffectLedger.exclusive` around a whole run
to keep other runners out of it altogether (reentrant within one ledger).

A call that raises leaves its intent open (it may or may not have happened); the
next attempt reconciles it.

Approvals: :meth:`EffectLedger.request_approval` records a pending approval (a
signed row that survives restarts); only an explicit
:meth:`EffectLedger.decide` resolves it, once.

Crash points (``SEALSTREAM_CRASH_AT``, see :mod:`sealstream._runtime.crash`):
``after_intent``, ``after_call``, ``after_outcome``.

>>> import tempfile, pathlib
>>> ledger = EffectLedger(pathlib.Path(tempfile.mkdtemp()) / "a.db", "order-17", key=b"k",
...                       encryption_key=None)
>>> echo = Tool("echo", lambda key, args: {"echoed": args["x"]}, reissue_safe=True)
>>> ledger.perform(echo, step="1", args={"x": 5})
{'echoed': 5}
>>> ledger.perform(echo, step="1", args={"x": 5})  # recorded: not called again
{'echoed': 5}
>>> ledger.close()
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sealstream._runtime.crash import CrashPoints
from sealstream.agents import _check
from sealstream.agents import judge as _judge
from sealstream.agents._seal import FROM_ENV, Address, Keys, seal_doc, unwrap
from sealstream.agents.checkpoint import (
    AgentCheckpointError,
    AgentCheckpointStore,
    canonical_json,
    now_ms,
)
from sealstream.agents.judge import AgentVerdict, RowRead
from sealstream.agents.store import RowStore, RowTx
from sealstream.checkpoint.crypto import EnvelopeError
from sealstream.errors import SinkError, SpecError


class UnreconciledEffectError(SinkError):
    """An effect's intent has no outcome and cannot be reconciled automatically.

    The tool has no ``reconcile`` function and is not ``reissue_safe``. Find out in
    the external system whether the call with the named idempotency key happened,
    then record it with :meth:`EffectLedger.resolve`.
    """


class ApprovalError(SinkError):
    """An approval was requested twice with different content, decided twice, or
    decided without having been requested."""


def idempotency_key(execution_id: str, step: str | int, call: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of ``[execution_id, step, call]``.

    >>> idempotency_key("e", 1, {"b": 2, "a": 1}) == idempotency_key("e", "1", {"a": 1, "b": 2})
    True
    """
    text = canonical_json([execution_id, str(step), dict(call)])
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Reconciliation:
    """What the external system says about an idempotency key."""

    happened: bool
    result: Any = None


@dataclass(frozen=True)
class Tool:
    """A tool with side effects.

    ``call(key, args)`` performs it, passing ``key`` on to the external system;
    ``reconcile(key, args)`` asks the external system whether ``key`` went through;
    ``reissue_safe`` declares that calling again with the same key is harmless.
    Results are JSON values (a result that is not leaves its intent open and
    raises :class:`~sealstream.errors.CheckpointError`); ``perform`` returns them as
    they read back from the ledger, so a first run and a replay see the same value.
    """

    name: str
    call: Callable[[str, Mapping[str, Any]], Any]
    reconcile: Callable[[str, Mapping[str, Any]], Reconciliation] | None = None
    reissue_safe: bool = False


@dataclass(frozen=True)
class Effect:
    """One ledger entry: the intent and, once known, the outcome."""

    key: str
    tool: str
    step: str
    args: Mapping[str, Any]
    seq: int
    done: bool
    result: Any = None
    via: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "tool": self.tool, "step": self.step, "args": dict(self.args),
                "seq": self.seq, "done": self.done, "result": self.result, "via": self.via}


@dataclass(frozen=True)
class Approval:
    """A requested approval and its decision (``status`` pending/approved/rejected)."""

    approval_id: str
    payload: Mapping[str, Any]
    status: str
    by: str = ""
    note: str = ""


class EffectLedger:
    """The effect ledger and approvals of one execution (and namespace).

    Shares the row store and keys of :class:`AgentCheckpointStore`; ``rows`` may
    be the same store, a path or a URL.
    """

    def __init__(self, rows: RowStore | AgentCheckpointStore | str | Path, execution_id: str,
                 namespace: str = "", *, key: bytes | None | object = FROM_ENV,
                 encryption_key: bytes | None | object = FROM_ENV,
                 crash: Callable[[str], None] | None = None,
                 lock_timeout: float = 10.0) -> None:
        if not isinstance(rows, RowStore | AgentCheckpointStore | str | Path):
            raise SpecError(f"rows: expected a store, a path or a URL, got "
                            f"{type(rows).__name__}")
        _check.text("execution_id", execution_id)
        _check.text("namespace", namespace, empty_ok=True)
        if isinstance(rows, AgentCheckpointStore):
            self._store = rows
        else:
            self._store = AgentCheckpointStore(rows, key=key, encryption_key=encryption_key)
        self.rows = self._store.rows
        self.keys: Keys = self._store.keys
        self.execution_id = execution_id
        self.namespace = namespace
        self._crash = crash if crash is not None else CrashPoints()
        self.lock_timeout = lock_timeout
        self._held = 0
        self._held_lock = threading.Lock()
        self._lock_cm: contextlib.AbstractContextManager[None] | None = None
        self._step, self._calls = "0", 0

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold this execution's lock (see the module); reentrant for this ledger."""
        with self._held_lock:
            if self._held == 0:
                cm = self.rows.execution_lock(self.execution_id, self.namespace,
                                              timeout=self.lock_timeout)
                cm.__enter__()
                self._lock_cm = cm
            self._held += 1
        try:
            yield
        finally:
            with self._held_lock:
                self._held -= 1
                if self._held == 0 and self._lock_cm is not None:
                    cm, self._lock_cm = self._lock_cm, None
                    cm.__exit__(None, None, None)

    def close(self) -> None:
        self.rows.close()

    # ------------------------------------------------------------ effects
    def begin_step(self, step: str | int) -> None:
        """Start step ``step`` for positional keys: the calls of :meth:`perform` with
        ``step=None`` that follow are numbered 0, 1, 2, ... within it."""
        _check.step("step", step)
        self._step, self._calls = str(step), 0

    def perform(self, tool: Tool, step: str | int | None, args: Mapping[str, Any]) -> Any:
        """Run ``tool`` at most once for this (execution, step, call); see the module.

        Two calls meant to happen twice (the same tool and arguments) must differ in
        ``step``: within one step the same call is the same effect. ``step=None``
        derives the key from the *position* instead: (execution id, the step given
        to :meth:`begin_step` (default ``"0"``), the call's index within it), so the
        same tool called twice in a loop gets two keys, and a step re-run from its
        start after a crash (deterministically) gets the same keys again."""
        _tool(tool)
        if step is None:
            step = f"{self._step}#call{self._calls}"
            self._calls += 1
        _check.step("step", step)
        canonical_json(_check.mapping("args", args))
        with self.exclusive():
            return self._perform(tool, step, args)

    def _perform(self, tool: Tool, step: str | int, args: Mapping[str, Any]) -> Any:
        call = {"tool": tool.name, "args": dict(args)}
        key = idempotency_key(self.execution_id, step, call)
        effect = self.effect(key)
        if effect is not None:
            if effect.done:
                return effect.result
            return self._reconcile(tool, effect)
        with self.rows.transaction() as tx:
            counts = self._counts(tx)
            seq = int(counts.get("count", 0)) + 1
            fresh = self._put(tx, f"{key}|intent", {"key": key, "tool": tool.name,
                                                    "step": str(step), "args": dict(args),
                                                    "seq": seq, "created_ms": now_ms()})
            if fresh:
                self._set_counts(tx, {**counts, "count": seq})
        if not fresh:  # another runner recorded it in between: never call twice
            return self._perform(tool, step, args)
        self._crash("after_intent")
        result = tool.call(key, dict(args))
        self._crash("after_call")
        result = self._record(key, result, "call")
        self._crash("after_outcome")
        return result

    def reconcile_pending(self, tools: Mapping[str, Tool]) -> list[Effect]:
        """Reconcile every intent without an outcome (do this first on resume);
        returns the effects as now recorded."""
        _check.mapping("tools", tools)
        for name, tool in tools.items():
            _tool(tool, f"tools[{name!r}]")
        with self.exclusive():
            return self._reconcile_pending(tools)

    def _reconcile_pending(self, tools: Mapping[str, Tool]) -> list[Effect]:
        done = []
        for effect in self.effects():
            if not effect.done:
                tool = tools.get(effect.tool)
                if tool is None:
                    raise UnreconciledEffectError(
                        f"effect {effect.key[:12]} of tool {effect.tool!r} has no outcome and "
                        "no tool of that name was given to reconcile it")
                self._reconcile(tool, effect)
                done.append(self.effect(effect.key))
        return [e for e in done if e is not None]

    def resolve(self, key: str, result: Any) -> None:
        """Record by hand the outcome of an open intent (after checking the world)."""
        effect = self.effect(key)
        if effect is None:
            raise UnreconciledEffectError(f"no intent with idempotency key {key}")
        if not effect.done:
            self._record(key, result, "manual")

    def _reconcile(self, tool: Tool, effect: Effect) -> Any:
        args = dict(effect.args)
        if tool.reconcile is not None:
            found = tool.reconcile(effect.key, args)
            if not isinstance(found, Reconciliation):
                raise SpecError(f"tool {tool.name!r}: reconcile returned "
                                f"{type(found).__name__}, expected a Reconciliation"
                                "(happened, result); the intent stays open")
            if found.happened:
                return self._record(effect.key, found.result, "reconcile")
            result = tool.call(effect.key, args)  # it never went through: the first call
            return self._record(effect.key, result, "call-after-reconcile")
        if tool.reissue_safe:
            return self._record(effect.key, tool.call(effect.key, args), "reissue")
        raise UnreconciledEffectError(
            f"effect {effect.key} of tool {tool.name!r} (step {effect.step}) was started but "
            "its outcome is unknown, and the tool can neither reconcile nor safely re-issue "
            "it; check the external system and call EffectLedger.resolve(key, result)")

    def _record(self, key: str, result: Any, via: str) -> Any:
        """Commit the outcome; returns the result as it will read back (JSON)."""
        stored = json.loads(canonical_json(result))  # not JSON: the intent stays open
        with self.rows.transaction() as tx:
            if not self._put(tx, f"{key}|outcome", {"key": key, "status": "done",
                                                    "result": stored, "via": via,
                                                    "created_ms": now_ms()}):
                first = self._get(tx, f"{key}|outcome")  # recorded first: that one stands
                assert first is not None
                stored = first["result"]
            counts = self._counts(tx)
            done = set(counts.get("done") or [])
            if key not in done:  # the signed list of keys with an outcome
                self._set_counts(tx, {**counts, "done": sorted(done | {key})})
        return stored

    def effect(self, key: str) -> Effect | None:
        """The verified entry for ``key``; raises AgentCheckpointError on a bad row."""
        with self.rows.transaction() as tx:
            intent = self._get(tx, f"{key}|intent")
            outcome = self._get(tx, f"{key}|outcome")
            done = self._counts(tx).get("done") or [] if outcome is None else []
        if outcome is not None and intent is None:
            raise AgentCheckpointError(self._missing_intent(key))
        if outcome is None and key in done:  # deleted: never mistaken for an open intent
            raise AgentCheckpointError(self._missing_outcome(key))
        if intent is None:
            return None
        return _effect(intent, outcome)

    def effects(self) -> list[Effect]:
        """Every entry in intent order; raises AgentCheckpointError unless
        :meth:`verify` finds the ledger intact."""
        for verdict in self.verify():
            if not verdict.ok:
                raise AgentCheckpointError(verdict)
        docs = self._docs()
        out = [_effect(d, docs.get(f"{d['key']}|outcome")) for n, d in docs.items()
               if n.endswith("|intent")]
        return sorted(out, key=lambda e: e.seq)

    def completed(self) -> list[dict[str, Any]]:
        """Completed actions with their results, for :attr:`AgentCheckpoint.completed_actions`."""
        return [e.to_json() for e in self.effects() if e.done]

    def verify(self) -> list[AgentVerdict]:
        """One verdict per ledger row (and per gap): signature, binding, presence."""
        out: list[AgentVerdict] = []
        with self.rows.transaction() as tx:
            reads = [self._read_row(r.name, r.data)
                     for r in tx.scan("fx", self.execution_id, self.namespace)]
            count_row = self._read_row("count", tx.get(*self._addr("fxm", "count")), space="fxm")
            decisions = {r.name for r in tx.scan("ap", self.execution_id, self.namespace)
                         if r.name.endswith("|decision")}
            try:
                decided = self._decided(tx)
            except AgentCheckpointError as exc:
                out.append(exc.verdict)
                decided = []
        for approval_id in decided:
            if f"{approval_id}|decision" not in decisions:
                out.append(self._missing_decision(approval_id))
        seqs: set[int] = set()
        intents: set[str] = set()
        outcomes: set[str] = set()
        for row in reads:
            bad, doc = _judge.judge_row(row, self.keys.sign)
            name = row.addr[3]
            key, _, kind = name.partition("|")
            if bad is not None or doc is None:
                out.append(bad or self._missing_intent(name))
                if kind == "outcome":  # present (if damaged): not also reported missing
                    outcomes.add(key)
                continue
            (intents if kind == "intent" else outcomes).add(key)
            if kind == "intent" and isinstance(doc.get("seq"), int):
                seqs.add(doc["seq"])
            out.append(AgentVerdict(self.execution_id, self.namespace, name, _judge.ATOMIC,
                                    "OK", f"ledger row {name[:12]}…|{kind} is verified"))
        for key in sorted(outcomes - intents):
            out.append(self._missing_intent(key))
        count = 0
        if count_row.data or count_row.problem:
            bad, doc = _judge.judge_row(count_row, self.keys.sign)
            if bad is not None:
                out.append(bad)
            elif doc is not None:
                count = int(doc.get("count", 0))
                for key in sorted(set(doc.get("done") or []) - outcomes):
                    out.append(self._missing_outcome(key))
        elif intents:
            out.append(AgentVerdict(
                self.execution_id, self.namespace, "count", _judge.PARTIAL, "ROW_MISSING",
                f"ledger of {self.execution_id!r}: its signed intent count is gone"))
        for seq in range(1, count + 1):
            if seq not in seqs:
                out.append(AgentVerdict(
                    self.execution_id, self.namespace, f"intent#{seq}", _judge.PARTIAL,
                    "INTENT_MISSING", f"ledger of {self.execution_id!r}: intent number {seq} "
                    "is gone (its row was deleted)"))
        return out

    # ------------------------------------------------------------ approvals
    def request_approval(self, approval_id: str, payload: Mapping[str, Any]) -> Approval:
        """Record a pending approval (idempotent); returns its current state."""
        _check.text("approval_id", approval_id)
        canonical_json(_check.mapping("payload", payload))
        body = {"approval_id": approval_id, "payload": dict(payload), "created_ms": now_ms()}
        with self.rows.transaction() as tx:
            old = self._get(tx, f"{approval_id}|request", space="ap")
            if old is None:
                self._put(tx, f"{approval_id}|request", body, space="ap")
            elif canonical_json(old["payload"]) != canonical_json(dict(payload)):
                raise ApprovalError(f"approval {approval_id!r} was already requested with "
                                    "other content")
        approval = self.approval(approval_id)
        assert approval is not None
        return approval

    def decide(self, approval_id: str, approved: bool, *, by: str, note: str = "") -> Approval:
        """Record the explicit decision on a pending approval (final: once)."""
        _check.text("approval_id", approval_id)
        _check.flag("approved", approved)
        _check.text("by", by)
        _check.text("note", note, empty_ok=True)
        with self.rows.transaction() as tx:
            if self._get(tx, f"{approval_id}|request", space="ap") is None:
                raise ApprovalError(f"approval {approval_id!r} was never requested")
            decided = self._decided(tx, lock=True)
            old = self._get(tx, f"{approval_id}|decision", space="ap")
            if old is None and approval_id in decided:
                raise AgentCheckpointError(self._missing_decision(approval_id))
            if old is not None:
                if bool(old["approved"]) != approved:
                    raise ApprovalError(f"approval {approval_id!r} was already decided")
            elif not self._put(tx, f"{approval_id}|decision",
                               {"approval_id": approval_id, "approved": approved, "by": by,
                                "note": note, "created_ms": now_ms()}, space="ap"):
                first = self._get(tx, f"{approval_id}|decision", space="ap")
                if first is None or bool(first["approved"]) != approved:
                    raise ApprovalError(f"approval {approval_id!r} was already decided")
            if approval_id not in decided:  # the signed list of decided approvals
                addr = self._addr("apm", "decided")
                tx.upsert(*addr, seal_doc(self.keys, addr,
                                          {"decided": sorted({*decided, approval_id})}))
        approval = self.approval(approval_id)
        assert approval is not None
        return approval

    def approval(self, approval_id: str) -> Approval | None:
        """The approval's request and decision; raises AgentCheckpointError when a
        recorded decision is gone (a deleted row must not reopen a decided one)."""
        _check.text("approval_id", approval_id)
        with self.rows.transaction() as tx:
            req = self._get(tx, f"{approval_id}|request", space="ap")
            dec = self._get(tx, f"{approval_id}|decision", space="ap")
            if dec is None and approval_id in self._decided(tx):
                raise AgentCheckpointError(self._missing_decision(approval_id))
        if req is None:
            if dec is not None:
                raise AgentCheckpointError(AgentVerdict(
                    self.execution_id, self.namespace, approval_id, _judge.PARTIAL,
                    "ROW_MISSING", f"approval {approval_id!r} has a decision but no request"))
            return None
        if dec is None:
            return Approval(approval_id, req["payload"], "pending")
        return Approval(approval_id, req["payload"],
                        "approved" if dec["approved"] else "rejected", dec["by"], dec["note"])

    def pending_approvals(self) -> list[Approval]:
        """Approvals requested and not yet decided."""
        with self.rows.transaction() as tx:
            names = [r.name for r in tx.scan("ap", self.execution_id, self.namespace)]
        ids = sorted({n.rpartition("|")[0] for n in names})
        return [a for i in ids if (a := self.approval(i)) is not None and a.status == "pending"]

    # ------------------------------------------------------------ rows
    def _addr(self, space: str, name: str) -> Address:
        return (space, self.execution_id, self.namespace, name)

    def _put(self, tx: RowTx, name: str, body: dict[str, Any], space: str = "fx") -> bool:
        addr = self._addr(space, name)
        return tx.insert(*addr, seal_doc(self.keys, addr, body))

    def _read_row(self, name: str, stored: bytes | None, space: str = "fx") -> RowRead:
        addr = self._addr(space, name)
        if not stored:
            return RowRead(addr, None)
        try:
            return RowRead(addr, unwrap(self.keys, addr, stored))
        except EnvelopeError as exc:
            return RowRead(addr, None, (exc.reason, str(exc)))

    def _get(self, tx: RowTx, name: str, space: str = "fx",
             lock: bool = False) -> dict[str, Any] | None:
        row = self._read_row(name, tx.get(*self._addr(space, name), lock=lock), space)
        if row.data is None and row.problem is None:
            return None
        bad, doc = _judge.judge_row(row, self.keys.sign)
        if bad is not None or doc is None:
            assert bad is not None
            raise AgentCheckpointError(bad)
        return doc

    def _docs(self) -> dict[str, dict[str, Any]]:
        with self.rows.transaction() as tx:
            names = [r.name for r in tx.scan("fx", self.execution_id, self.namespace)]
            return {n: d for n in names if (d := self._get(tx, n)) is not None}

    def _counts(self, tx: RowTx) -> dict[str, Any]:
        """The signed ledger marker: ``count`` of intents, ``done`` keys with an outcome."""
        doc = self._get(tx, "count", space="fxm", lock=True)
        if doc is None:
            return {"count": 0, "done": []}
        return {"count": int(doc["count"]), "done": list(doc.get("done") or [])}

    def _set_counts(self, tx: RowTx, counts: Mapping[str, Any]) -> None:
        addr = self._addr("fxm", "count")
        tx.upsert(*addr, seal_doc(self.keys, addr, {"count": int(counts.get("count", 0)),
                                                   "done": list(counts.get("done") or [])}))

    def _decided(self, tx: RowTx, lock: bool = False) -> list[str]:
        """The signed list of approvals with a decision (a marker, as ``done`` is for
        outcomes: a decision row deleted later is caught, not taken as pending)."""
        doc = self._get(tx, "decided", space="apm", lock=lock)
        return [str(i) for i in doc.get("decided") or []] if doc is not None else []

    def _missing_decision(self, approval_id: str) -> AgentVerdict:
        return AgentVerdict(self.execution_id, self.namespace, approval_id, _judge.PARTIAL,
                            "DECISION_MISSING", f"approval {approval_id!r} of "
                            f"{self.execution_id!r} was decided, but its decision row is gone")

    def _missing_outcome(self, key: str) -> AgentVerdict:
        return AgentVerdict(self.execution_id, self.namespace, key, _judge.PARTIAL,
                            "OUTCOME_MISSING", f"ledger of {self.execution_id!r}: effect "
                            f"{key[:12]} has a recorded outcome whose row is gone")

    def _missing_intent(self, key: str) -> AgentVerdict:
        return AgentVerdict(self.execution_id, self.namespace, key, _judge.PARTIAL,
                            "INTENT_MISSING", f"ledger of {self.execution_id!r}: effect "
                            f"{key[:12]} has an outcome but its intent row is gone")


def _tool(tool: Any, name: str = "tool") -> Tool:
    if not isinstance(tool, Tool):
        raise SpecError(f"{name}: expected a Tool(name, call, ...), got {type(tool).__name__}")
    _check.text(f"{name}.name", tool.name)
    if not callable(tool.call):
        raise SpecError(f"{name}.call: expected a function (key, args) -> result, got "
                        f"{type(tool.call).__name__}")
    if tool.reconcile is not None and not callable(tool.reconcile):
        raise SpecError(f"{name}.reconcile: expected a function (key, args) -> "
                        f"Reconciliation or None, got {type(tool.reconcile).__name__}")
    _check.flag(f"{name}.reissue_safe", tool.reissue_safe)
    return tool


def _effect(intent: Mapping[str, Any], outcome: Mapping[str, Any] | None) -> Effect:
    return Effect(key=intent["key"], tool=intent["tool"], step=intent["step"],
                  args=intent["args"], seq=int(intent["seq"]), done=outcome is not None,
                  result=outcome["result"] if outcome else None,
                  via=outcome["via"] if outcome else "")
