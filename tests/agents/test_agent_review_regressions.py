"""Regression tests for bugs found in review of the agent layer.

* a row edited by hand into a SQLite TEXT/INTEGER value crashed every read with
  TypeError (or allocated n zero bytes) instead of getting a verdict;
* two runners on one execution id could both reconcile/re-issue an open intent
  (no lock); now one lock per execution and namespace;
* an outcome recorded concurrently was returned as the loser's result, and a
  conflicting concurrent approval decision was silently accepted;
* deleting an outcome row (or the signed intent count) went undetected, and the
  effect was re-issued as if the intent were open;
* ``SealstreamSaver.list`` listed the remains of a history whose signed head
  checkpoint was deleted (``get_tuple`` refused it).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sealstream.agents import (
    AgentCheckpoint,
    AgentCheckpointError,
    AgentCheckpointStore,
    ApprovalError,
    EffectLedger,
    Reconciliation,
    Tool,
)
from sealstream.errors import LockHeldError

KEY = b"review-signing-key"
PARTIAL = "PARTIAL_CHECKPOINT_REJECT"


# ------------------------------------------------------------ SQLite value types
@pytest.mark.parametrize("value", ["garbage", 10**12, 3.5], ids=["text", "int", "real"])
def test_sqlite_row_of_another_type_gets_a_verdict_not_an_exception(
        tmp_path: Path, value: Any) -> None:
    store = AgentCheckpointStore(tmp_path / "a.db", key=KEY, encryption_key=None)
    store.save(AgentCheckpoint("e", node="n"))
    ledger = EffectLedger(store, "e")
    ledger.perform(Tool("t", lambda k, a: {"ok": 1}, reissue_safe=True), 1, {})
    store.close()
    conn = sqlite3.connect(tmp_path / "a.db")
    conn.execute("UPDATE agent_rows SET data = ? WHERE space IN ('cp', 'fx')", (value,))
    conn.commit()
    conn.close()
    verdicts = store.history("e")
    assert [(v.verdict, v.reason) for v in verdicts][0] == (PARTIAL, "MANIFEST_UNREADABLE")
    bad = {(v.verdict, v.reason) for v in ledger.verify() if not v.ok}
    assert (PARTIAL, "ROW_UNREADABLE") in bad and {v for v, _ in bad} == {PARTIAL}
    store.close()


# ------------------------------------------------------------ one runner per execution
def test_two_runners_on_one_execution_never_both_act(backend_url: str) -> None:
    a = EffectLedger(backend_url, "exec", key=KEY, encryption_key=None)
    b = EffectLedger(backend_url, "exec", key=KEY, encryption_key=None, lock_timeout=0.0)
    other = EffectLedger(backend_url, "other-exec", key=KEY, encryption_key=None,
                         lock_timeout=0.0)
    calls: list[str] = []
    seen: dict[str, Any] = {}

    def call(key: str, args: Any) -> dict[str, Any]:
        calls.append(key)
        # while runner A is inside the call, runner B must not act on this execution
        for name, fn in (("perform", lambda: b.perform(tool, 1, {"n": 1})),
                         ("reconcile", lambda: b.reconcile_pending({"pay": tool}))):
            try:
                fn()
            except LockHeldError as exc:
                seen[name] = exc
        seen["other"] = other.perform(Tool("x", lambda k, a: "ok", reissue_safe=True), 1, {})
        return {"paid": args["n"]}

    tool = Tool("pay", call, reissue_safe=True)
    assert a.perform(tool, 1, {"n": 1}) == {"paid": 1}
    assert set(seen) == {"perform", "reconcile", "other"} and seen["other"] == "ok"
    assert isinstance(seen["perform"], LockHeldError)
    assert b.perform(tool, 1, {"n": 1}) == {"paid": 1}  # released: B reads the outcome
    assert len(calls) == 1
    with a.exclusive(), a.exclusive():  # reentrant for one ledger, held across a run
        assert a.perform(tool, 2, {"n": 2}) == {"paid": 2}
        with pytest.raises(LockHeldError):
            b.perform(tool, 3, {"n": 3})
    for ledger in (a, b, other):
        ledger.close()


def test_lock_is_released_by_a_crash_inside_the_call(tmp_path: Path) -> None:
    class Killed(BaseException):
        pass

    def crash(where: str) -> None:
        if where == "after_call":
            raise Killed

    a = EffectLedger(tmp_path / "a.db", "e", key=KEY, encryption_key=None, crash=crash)
    provider: dict[str, Any] = {}
    tool = Tool("pay", lambda k, args: provider.setdefault(k, {"id": len(provider)}),
                reconcile=lambda k, args: Reconciliation(k in provider, provider.get(k)))
    with pytest.raises(Killed):
        a.perform(tool, 1, {})
    b = EffectLedger(tmp_path / "a.db", "e", key=KEY, encryption_key=None, lock_timeout=0.0)
    assert [e.via for e in b.reconcile_pending({"pay": tool})] == ["reconcile"]
    assert len(provider) == 1
    a.close()
    b.close()


# ------------------------------------------------------------ first record wins
def test_an_outcome_recorded_meanwhile_is_the_one_returned(tmp_path: Path) -> None:
    a = EffectLedger(tmp_path / "a.db", "e", key=KEY, encryption_key=None)
    operator = EffectLedger(tmp_path / "a.db", "e", key=KEY, encryption_key=None)

    def call(key: str, args: Any) -> dict[str, Any]:
        operator.resolve(key, {"by": "operator"})  # recorded while the call runs
        return {"by": "call"}

    result = a.perform(Tool("t", call, reissue_safe=True), 1, {})
    assert result == {"by": "operator"} == a.effects()[0].result
    a.close()
    operator.close()


def test_a_conflicting_concurrent_decision_is_refused(tmp_path: Path) -> None:
    ledger = EffectLedger(tmp_path / "a.db", "e", key=KEY, encryption_key=None)
    ledger.request_approval("x", {"amount": 5})
    real_get = ledger._get
    raced = threading.Event()

    def get(tx: Any, name: str, space: str = "fx", lock: bool = False) -> Any:
        if name == "x|decision" and not raced.is_set():
            raced.set()  # another decision lands between our read and our insert (as
            # on PostgreSQL, where two transactions may both read "undecided")
            ledger._put(tx, "x|decision", {"approval_id": "x", "approved": True,
                                           "by": "alice", "note": "", "created_ms": 1},
                        space="ap")
            return None
        return real_get(tx, name, space, lock)

    ledger._get = get  # type: ignore[method-assign]
    with pytest.raises(ApprovalError, match="already decided"):
        ledger.decide("x", False, by="bob")
    ledger.close()


# ------------------------------------------------------------ deleted outcome / count
def test_a_deleted_outcome_is_detected_and_never_re_issued(backend_url: str) -> None:
    store = AgentCheckpointStore(backend_url, key=KEY, encryption_key=None)
    ledger = EffectLedger(store, "exec-1")
    calls: list[str] = []

    def call(key: str, args: Any) -> dict[str, Any]:
        calls.append(key)
        return {"ok": args["n"]}

    tool = Tool("t", call, reissue_safe=True)
    ledger.perform(tool, 1, {"n": 1})
    key = ledger.effects()[0].key
    with store.rows.transaction() as tx:
        tx.delete("fx", "exec-1", "", [f"{key}|outcome"])
    assert [(v.verdict, v.reason) for v in ledger.verify() if not v.ok] == [
        (PARTIAL, "OUTCOME_MISSING")]
    with pytest.raises(AgentCheckpointError, match="OUTCOME_MISSING"):
        ledger.perform(tool, 1, {"n": 1})
    with pytest.raises(AgentCheckpointError):
        ledger.reconcile_pending({"t": tool})
    assert len(calls) == 1
    with store.rows.transaction() as tx:
        tx.delete("fxm", "exec-1", "", ["count"])
    assert (PARTIAL, "ROW_MISSING") in {(v.verdict, v.reason) for v in ledger.verify()}
    store.close()


# ------------------------------------------------------------ saver list()
def test_a_history_whose_head_is_gone_is_refused_as_latest_and_reported_by_list(
        tmp_path: Path) -> None:
    pytest.importorskip("langgraph.checkpoint.conformance")
    from langgraph.checkpoint.conformance.test_utils import (
        generate_checkpoint,
        generate_config,
        generate_metadata,
    )

    from sealstream.agents.langgraph import SealstreamSaver

    saver = SealstreamSaver(tmp_path / "a.db", key=KEY, encryption_key=None)
    parent = None
    for i in range(2):
        cfg = generate_config("t")
        if parent:
            cfg["configurable"]["checkpoint_id"] = parent
        stored = saver.put(cfg, generate_checkpoint(), generate_metadata(step=i), {})
        parent = stored["configurable"]["checkpoint_id"]
    assert len(list(saver.list(generate_config("t")))) == 2
    with saver.store.rows.transaction() as tx:
        tx.delete("cp", "t", "", [str(parent)])
    with pytest.raises(AgentCheckpointError, match="NO_MANIFEST"):
        saver.get_tuple(generate_config("t"))
    # issue 19, defect 3: listing goes on with what verifies; the problem is reported
    assert len(list(saver.list(generate_config("t")))) == 1
    assert len(list(saver.list(None))) == 1
    assert [v.reason for v in saver.problems("t")] == ["NO_MANIFEST"]
    saver.close()


# ------------------------------------------------------------ "|" in ids
def test_checkpoint_ids_with_a_separator_do_not_share_writes(tmp_path: Path) -> None:
    pytest.importorskip("langgraph.checkpoint.conformance")
    from langgraph.checkpoint.conformance.test_utils import (
        generate_checkpoint,
        generate_config,
        generate_metadata,
    )

    from sealstream.agents.langgraph import SealstreamSaver

    saver = SealstreamSaver(tmp_path / "a.db", key=KEY, encryption_key=None)
    parent = None
    for cid, task in (("a", "t|1"), ("a|b", "t")):
        cfg = generate_config("th")
        if parent:
            cfg["configurable"]["checkpoint_id"] = parent
        stored = saver.put(cfg, generate_checkpoint(checkpoint_id=cid),
                           generate_metadata(), {})
        saver.put_writes(stored, [("c", cid)], task)
        parent = cid
    assert all(v.ok for v in saver.store.history("th")), saver.store.history("th")
    for cid in ("a", "a|b"):
        tup = saver.get_tuple({"configurable": {"thread_id": "th", "checkpoint_ns": "",
                                                "checkpoint_id": cid}})
        assert tup is not None and [w[2] for w in tup.pending_writes or []] == [cid]
    saver.store.prune("th", keep_last=1)  # drops "a" and its writes only
    assert all(v.ok for v in saver.store.history("th"))
    saver.close()


# ------------------------------------------------------------ no laundering on put
def test_put_never_re_signs_a_tampered_blob_it_reuses(tmp_path: Path) -> None:
    pytest.importorskip("langgraph.checkpoint.conformance")
    from langgraph.checkpoint.conformance.test_utils import (
        generate_checkpoint,
        generate_config,
        generate_metadata,
    )

    from sealstream.agents.langgraph import SealstreamSaver

    saver = SealstreamSaver(tmp_path / "a.db", key=KEY, encryption_key=None)
    first = saver.put(generate_config("t"), generate_checkpoint(
        channel_values={"a": "a0", "b": "fixed"}, channel_versions={"a": 1, "b": 1}),
        generate_metadata(step=0), {"a": 1, "b": 1})
    [blob] = [r for r in saver.store.rows.scan("blob", "t", "") if r.name.startswith('["b"')]
    with saver.store.rows.transaction() as tx:  # edited behind the saver's back
        tx.upsert("blob", "t", "", blob.name, blob.data.replace(b"fixed", b"fixes"))
    child = generate_checkpoint(channel_values={"a": "a1"}, channel_versions={"a": 2, "b": 1})
    with pytest.raises(AgentCheckpointError, match="HASH_MISMATCH"):
        saver.put(first, child, generate_metadata(step=1), {"a": 2})  # reuses "b"
    assert [r.name for r in saver.store.rows.scan("cp", "t", "")] == [
        first["configurable"]["checkpoint_id"]]  # nothing was committed
    saver.close()


# ------------------------------------------------------------ SQLite rollback
def test_sqlite_reports_the_original_error_when_sqlite_already_rolled_back(
        tmp_path: Path) -> None:
    from sealstream.agents import SqliteRowStore

    store = SqliteRowStore(tmp_path / "a.db")
    with pytest.raises(ValueError, match="the real problem"), store.transaction() as tx:
        tx.insert("fx", "e", "", "n", b"x")
        store._db().execute("ROLLBACK")  # as SQLite does itself on SQLITE_FULL / IOERR
        raise ValueError("the real problem")
    with store.transaction() as tx:  # the connection is still usable
        assert tx.insert("fx", "e", "", "n", b"x")
    store.close()


def test_sqlite_failed_commit_does_not_wedge_the_connection(tmp_path: Path) -> None:
    from sealstream.agents import SqliteRowStore
    from sealstream.errors import CheckpointError

    store = SqliteRowStore(tmp_path / "a.db")
    with store.transaction() as tx:
        tx.insert("fx", "e", "", "n", b"x")
    conn = store._db()
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
    conn.execute("CREATE TABLE child (p INTEGER REFERENCES parent(id) "
                 "DEFERRABLE INITIALLY DEFERRED)")
    with pytest.raises(CheckpointError, match="commit failed"), store.transaction():
        conn.execute("INSERT INTO child VALUES (1)")  # fails only at COMMIT
    with store.transaction() as tx:
        assert tx.get("fx", "e", "", "n") == b"x"
    store.close()


# ------------------------------------------------------------ judge purity (signed garbage)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["head", "floor", "dropped", "signature", "row", "x"]),
                       _json_values, max_size=5),
       st.booleans(), st.sampled_from([None, KEY]),
       st.dictionaries(st.text(max_size=3), st.none() | st.text(max_size=3), max_size=3))
def test_history_and_row_judges_never_raise_even_on_signed_garbage(
        doc: dict[str, Any], sign: bool, key: bytes | None,
        parents: dict[str, str | None]) -> None:
    # a validly signed marker of the wrong shape can only come from the key holder,
    # but the judge must still answer with a verdict, not an exception
    from sealstream.agents.judge import AgentVerdict, RowRead, judge_history, judge_row
    from sealstream.checkpoint.manifest import seal

    body = {k: v for k, v in doc.items() if k != "signature"}
    data = seal(body, key) if sign else json.dumps(doc).encode()
    row = RowRead(("meta", "e", "", "history"), data)
    judge_row(row, key)
    out = judge_history("e", "", [AgentVerdict("e", "", "x", "ATOMIC_CHECKPOINT", "OK", "")],
                        parents, row, key)
    assert all(isinstance(v, AgentVerdict) for v in out)


# ------------------------------------------------------------ the example
def test_example_story_refuses_a_directory_with_leftovers(tmp_path: Path) -> None:
    import subprocess
    import sys

    pytest.importorskip("langgraph.graph")
    (tmp_path / "agents.db").write_bytes(b"left over from an earlier run")
    example = Path(__file__).resolve().parents[2] / "examples" / "agent_payment.py"
    proc = subprocess.run([sys.executable, str(example), "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "not empty" in proc.stderr


# ------------------------------------------------------------ second review
def test_a_deleted_decision_is_detected_and_never_reopened(backend_url: str) -> None:
    """A rejected approval whose decision row is deleted must not turn back into a
    pending one that can then be approved: decisions are final."""
    store = AgentCheckpointStore(backend_url, key=KEY, encryption_key=None)
    ledger = EffectLedger(store, "exec-1")
    ledger.request_approval("pay", {"amount": 5})
    assert ledger.decide("pay", False, by="ops").status == "rejected"
    assert ledger.decide("pay", False, by="ops").status == "rejected"  # idempotent
    with store.rows.transaction() as tx:
        tx.delete("ap", "exec-1", "", ["pay|decision"])
    with pytest.raises(AgentCheckpointError, match="DECISION_MISSING"):
        ledger.approval("pay")
    with pytest.raises(AgentCheckpointError, match="DECISION_MISSING"):
        ledger.decide("pay", True, by="attacker")
    with pytest.raises(AgentCheckpointError, match="DECISION_MISSING"):
        ledger.pending_approvals()
    assert [(v.verdict, v.reason) for v in ledger.verify() if not v.ok] == [
        (PARTIAL, "DECISION_MISSING")]
    store.close()


def test_an_execution_id_holds_one_kind_of_checkpoint(tmp_path: Path) -> None:
    """Agent checkpoints and a LangGraph thread's under one id: a clear refusal
    (OTHER_KIND) on either side, never a KeyError from the other kind's layout."""
    pytest.importorskip("langgraph")
    from langgraph.checkpoint.base import empty_checkpoint

    from sealstream.agents.langgraph import SealstreamSaver

    saver = SealstreamSaver(tmp_path / "a.db", key=KEY, encryption_key=None)
    store = saver.store
    cfg = {"configurable": {"thread_id": "t-graph", "checkpoint_ns": ""}}
    saver.put(cfg, empty_checkpoint(), {}, {})  # type: ignore[arg-type]
    with pytest.raises(AgentCheckpointError, match="OTHER_KIND.*LangGraph"):
        store.save(AgentCheckpoint("t-graph", node="n"))
    with pytest.raises(AgentCheckpointError, match="OTHER_KIND"):
        store.latest("t-graph")
    store.save(AgentCheckpoint("t-agent", node="n"))
    agent_cfg = {"configurable": {"thread_id": "t-agent", "checkpoint_ns": ""}}
    with pytest.raises(AgentCheckpointError, match="OTHER_KIND.*AgentCheckpointStore"):
        saver.get_tuple(agent_cfg)  # type: ignore[arg-type]
    with pytest.raises(AgentCheckpointError, match="OTHER_KIND"):
        saver.put(agent_cfg, empty_checkpoint(), {}, {})  # type: ignore[arg-type]
    assert store.latest("t-agent") is not None and saver.get_tuple(cfg) is not None
    store.close()


def _bad_calls(tmp_path: Path) -> list[tuple[str, Any]]:
    store = AgentCheckpointStore(tmp_path / "v.db", key=KEY, encryption_key=None)
    ledger = EffectLedger(store, "e")
    ledger.request_approval("a", {"x": 1})
    tool = Tool("t", lambda k, a: 1, reissue_safe=True)
    return [
        ("save(None)", lambda: store.save(None)),  # type: ignore[arg-type]
        ("execution id not a string",
         lambda: store.save(AgentCheckpoint(123))),  # type: ignore[arg-type]
        ("state None", lambda: store.save(AgentCheckpoint("e", state=None))),  # type: ignore
        ("state a list", lambda: store.save(AgentCheckpoint("e", state=[1]))),  # type: ignore
        ("conversation a string",
         lambda: store.save(AgentCheckpoint("e", conversation="hi"))),  # type: ignore
        ("artifacts of dicts",
         lambda: store.save(AgentCheckpoint("e", artifacts=[{"uri": "x"}]))),  # type: ignore
        ("lone surrogate", lambda: store.save(AgentCheckpoint("e", state={"s": "\ud800"}))),
        ("deep nesting", lambda: store.save(AgentCheckpoint("e", state=_deep(100_000)))),
        ("prune keep_last a string",
         lambda: store.prune("e", keep_last="2")),  # type: ignore[arg-type]
        ("prune keep_last negative", lambda: store.prune("e", keep_last=-1)),
        ("perform args None", lambda: ledger.perform(tool, 1, None)),  # type: ignore[arg-type]
        ("perform a plain function",
         lambda: ledger.perform(lambda k, a: 1, 1, {})),  # type: ignore[arg-type]
        ("perform step a float", lambda: ledger.perform(tool, 1.5, {})),  # type: ignore
        ("a tool whose call is not a function",  # before: an intent left open, then TypeError
         lambda: ledger.perform(Tool("t", 5), 1, {})),  # type: ignore[arg-type]
        ("a tool whose reconcile is not a function",
         lambda: ledger.perform(Tool("t", lambda k, a: 1, reconcile=5), 1, {})),  # type: ignore
        ("reconcile_pending a list",
         lambda: ledger.reconcile_pending([tool])),  # type: ignore[arg-type]
        ("approval payload None",
         lambda: ledger.request_approval("b", None)),  # type: ignore[arg-type]
        ("approval payload not JSON", lambda: ledger.request_approval("b", {"x": object()})),
        ("approval id None", lambda: ledger.request_approval(None, {})),  # type: ignore
        ("decide with a string", lambda: ledger.decide("a", "no", by="ops")),  # type: ignore
        ("decide without who", lambda: ledger.decide("a", True, by="")),
        ("ledger on None", lambda: EffectLedger(None, "e")),  # type: ignore[arg-type]
        ("key of another type",
         lambda: AgentCheckpointStore(tmp_path / "k.db", key=5)),  # type: ignore[arg-type]
        ("short encryption key",
         lambda: AgentCheckpointStore(tmp_path / "k.db", encryption_key=b"short")),
    ]


def _deep(n: int) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for _ in range(n):
        d = {"d": d}
    return d


def test_bad_arguments_get_one_clear_project_error(tmp_path: Path) -> None:
    from sealstream.errors import SealstreamError

    for name, call in _bad_calls(tmp_path):
        with pytest.raises(SealstreamError) as exc:
            call()
        msg = str(exc.value)
        assert msg and "\n" not in msg, (name, msg)
    # nothing was recorded by the refused calls
    ledger = EffectLedger(tmp_path / "v.db", "e", key=KEY, encryption_key=None)
    approval = ledger.approval("a")
    assert approval is not None and approval.status == "pending"
    assert ledger.effects() == [] and ledger.approval("b") is None
    assert AgentCheckpointStore(tmp_path / "v.db", key=KEY, encryption_key=None).ids("e") == []


def test_a_reconcile_that_returns_something_else_is_refused(tmp_path: Path) -> None:
    from sealstream.errors import SpecError

    ledger = EffectLedger(tmp_path / "r.db", "e", key=KEY, encryption_key=None)
    with ledger.rows.transaction():
        pass
    calls: list[str] = []

    def boom(key: str, args: Any) -> Any:
        calls.append(key)
        raise RuntimeError("provider down")

    with pytest.raises(RuntimeError):
        ledger.perform(Tool("t", boom, reconcile=lambda k, a: True), 1, {})  # type: ignore
    tool = Tool("t", boom, reconcile=lambda k, a: True)  # type: ignore[arg-type,return-value]
    with pytest.raises(SpecError, match="Reconciliation"):
        ledger.reconcile_pending({"t": tool})
    assert len(calls) == 1 and not ledger.effects()[0].done  # still open, not re-called


def test_a_planted_link_at_an_execution_lock_is_refused_and_never_followed(
        tmp_path: Path) -> None:
    """A symbolic link where an execution's lock file goes (or at the lock folder) is
    refused with one line; its target is neither created, truncated nor written."""
    from sealstream.agents import SqliteRowStore
    from sealstream.agents.store import lock_digest
    from sealstream.errors import CheckpointError

    secret = tmp_path / "secret"
    secret.write_bytes(b"keep me")
    store = SqliteRowStore(tmp_path / "a.db")
    folder = tmp_path / "a.db.locks"
    folder.mkdir(mode=0o700)
    (folder / f"{lock_digest('e', '').hex()[:40]}.lock").symlink_to(secret)
    with pytest.raises(CheckpointError, match="is a symbolic link"), \
            store.execution_lock("e", ""):
        pass
    assert secret.read_bytes() == b"keep me"
    with store.execution_lock("other", ""):  # other executions are not affected
        pass
    store.close()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    store = SqliteRowStore(tmp_path / "b.db")
    (tmp_path / "b.db.locks").symlink_to(elsewhere)
    with pytest.raises(CheckpointError, match="is a symbolic link"), \
            store.execution_lock("e", ""):
        pass
    assert list(elsewhere.iterdir()) == []
    store.close()
