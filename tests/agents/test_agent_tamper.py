"""Tamper with, truncate or delete any stored row: the guard names it.

A thread of three LangGraph checkpoints (channel blobs, pending writes on the
last two) is written through SealstreamSaver; then one row is altered behind the
saver's back (through the raw row store, so the same story runs on SQLite and
PostgreSQL) and the verdict must be the documented one. Reads fail closed: the
saver raises AgentCheckpointError instead of returning a damaged checkpoint.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance.test_utils import (  # noqa: E402
    generate_checkpoint,
    generate_config,
    generate_metadata,
)

from sealstream.agents import (  # noqa: E402
    AgentCheckpoint,
    AgentCheckpointError,
    AgentCheckpointStore,
    EffectLedger,
    Reconciliation,
    Tool,
)
from sealstream.agents._seal import Keys, seal_doc, unwrap  # noqa: E402
from sealstream.agents.langgraph import SealstreamSaver  # noqa: E402
from sealstream.errors import CheckpointError  # noqa: E402

KEY = b"tamper-signing-key"
ENC = bytes(range(32))
ATOMIC, PARTIAL, INCONSISTENT = "ATOMIC_CHECKPOINT", "PARTIAL_CHECKPOINT_REJECT", \
    "INCONSISTENT_STATE"
T = "thread-T"


def _thread(saver: SealstreamSaver, tid: str = T) -> list[str]:
    ids, parent = [], None
    for i in range(3):
        cfg = generate_config(tid)
        if parent:
            cfg["configurable"]["checkpoint_id"] = parent
        cp = generate_checkpoint(channel_values={"a": f"a{i}", "b": "fixed"},
                                 channel_versions={"a": i + 1, "b": 1})
        stored = saver.put(cfg, cp, generate_metadata(step=i), {"a": i + 1} if i else
                           {"a": 1, "b": 1})
        if i:
            saver.put_writes(stored, [("a", f"w{i}"), ("b", {"n": i})], f"task-{i}")
        parent = stored["configurable"]["checkpoint_id"]
        ids.append(parent)
    return ids


def _rows(saver: SealstreamSaver, space: str, tid: str = T) -> list[Any]:
    return saver.store.rows.scan(space, tid, "")


def _set(saver: SealstreamSaver, space: str, name: str, data: bytes | None,
         tid: str = T) -> None:
    with saver.store.rows.transaction() as tx:
        if data is None:
            tx.delete(space, tid, "", [name])
        else:
            tx.upsert(space, tid, "", name, data)


def _alter_json(data: bytes) -> bytes:
    doc = json.loads(data)
    doc["tampered"] = True
    return json.dumps(doc).encode()


def _strip_signature(data: bytes) -> bytes:
    doc = json.loads(data)
    del doc["signature"]
    return json.dumps(doc).encode()


def _pick(space: str, which: str) -> Callable[[SealstreamSaver, list[str]], str]:
    def pick(saver: SealstreamSaver, ids: list[str]) -> str:
        names = [r.name for r in _rows(saver, space)]
        if space in ("cp", "wi"):
            return ids[-1] if which == "latest" else ids[1]
        if space == "w":
            return [n for n in names if n.startswith(ids[-1])][0]
        if space == "blob":
            return [n for n in names if n.startswith('["b"')][0]  # shared by all three
        return names[0]
    return pick


# (space, which row, change, expected verdict, reason)
CASES = [
    ("cp", "latest", _alter_json, INCONSISTENT, "SIGNATURE_MISMATCH"),
    ("cp", "latest", lambda d: d[: len(d) // 2], PARTIAL, "MANIFEST_UNREADABLE"),
    ("cp", "latest", _strip_signature, PARTIAL, "NO_SIGNATURE"),
    ("blob", "b", lambda d: d[:-1] + bytes([d[-1] ^ 1]), INCONSISTENT, "HASH_MISMATCH"),
    ("blob", "b", lambda d: d[:-2], PARTIAL, "FILE_TRUNCATED"),
    ("blob", "b", None, PARTIAL, "FILE_MISSING"),
    ("w", "latest", _alter_json, INCONSISTENT, "SIGNATURE_MISMATCH"),
    ("w", "latest", lambda d: d[:20], PARTIAL, "ROW_UNREADABLE"),
    ("w", "latest", None, PARTIAL, "WRITE_MISSING"),
    ("wi", "latest", None, PARTIAL, "NO_WRITES_INDEX"),
    ("wi", "latest", _alter_json, INCONSISTENT, "SIGNATURE_MISMATCH"),
]


@pytest.mark.parametrize(("space", "which", "change", "verdict", "reason"), CASES,
                         ids=[f"{c[0]}-{c[4]}" for c in CASES])
def test_tampered_row_gets_its_verdict(tmp_path: Path, space: str, which: str,
                                       change: Callable[[bytes], bytes] | None,
                                       verdict: str, reason: str) -> None:
    # the judge does not depend on the backend: this matrix runs on SQLite; the
    # stories below run on both backends
    saver = SealstreamSaver(tmp_path / "agents.db", key=KEY, encryption_key=None)
    ids = _thread(saver)
    assert all(v.ok for v in saver.store.history(T))
    name = _pick(space, which)(saver, ids)
    old = saver.store.rows.get(space, T, "", name)
    assert old is not None
    _set(saver, space, name, None if change is None else change(old))
    got = saver.store.verify(T, ids[-1])
    assert (got.verdict, got.reason) == (verdict, reason), got
    with pytest.raises(AgentCheckpointError) as err:
        saver.get_tuple(generate_config(T))
    assert err.value.verdict.reason == reason
    assert saver.store.history(T)[0].reason == reason
    saver.close()


def test_deleted_checkpoints_are_reported_missing(backend_url: str) -> None:
    saver = SealstreamSaver(backend_url, key=KEY, encryption_key=None)
    ids = _thread(saver)
    _set(saver, "cp", ids[1], None)  # a middle one: its child names it as parent
    gone = [v for v in saver.store.history(T) if not v.ok]
    assert [(v.checkpoint_id, v.verdict, v.reason) for v in gone] == [
        (ids[1], PARTIAL, "NO_MANIFEST")]
    _set(saver, "cp", ids[2], None)  # the newest: the signed head names it
    with pytest.raises(AgentCheckpointError) as err:
        saver.get_tuple(generate_config(T))
    assert (err.value.verdict.verdict, err.value.verdict.reason) == (PARTIAL, "NO_MANIFEST")
    _set(saver, "meta", "history", None)  # and the head marker itself
    assert any(v.checkpoint_id == "(head)" and v.reason == "NO_MANIFEST"
               for v in saver.store.history(T))
    saver.close()


def test_retention_is_not_mistaken_for_deletion(backend_url: str) -> None:
    saver = SealstreamSaver(backend_url, key=KEY, encryption_key=None)
    ids = _thread(saver)
    saver.prune([T], strategy="keep_latest")
    assert [(v.checkpoint_id, v.verdict) for v in saver.store.history(T)] == [(ids[-1], ATOMIC)]
    tup = saver.get_tuple(generate_config(T))
    assert tup is not None and tup.checkpoint["channel_values"] == {"a": "a2", "b": "fixed"}
    assert len(tup.pending_writes or []) == 2
    saver.close()


def test_deliberate_deletions_and_copies_stay_verified(backend_url: str) -> None:
    saver = SealstreamSaver(backend_url, key=KEY, encryption_key=None)
    ids = _thread(saver)
    saver.copy_thread(T, "copy")
    history = saver.store.history("copy")
    assert [v.checkpoint_id for v in history] == ids[::-1] and all(v.ok for v in history)
    copied = saver.get_tuple(generate_config("copy"))
    assert copied is not None and len(copied.pending_writes or []) == 2
    row = saver.store.rows.get("w", "copy", "", sorted(
        r.name for r in _rows(saver, "w", "copy"))[0])
    assert row is not None and b'"copy"' in row  # re-sealed for its new address
    middle = saver.get_tuple(generate_config(T, checkpoint_id=ids[1]))
    assert middle is not None
    # delete_for_runs removes a middle checkpoint: recorded as dropped, not as tampering
    run = "run-to-forget"
    cfg = generate_config(T)
    cfg["configurable"]["checkpoint_id"] = ids[-1]
    extra = saver.put(cfg, generate_checkpoint(), generate_metadata(step=9, run_id=run), {})
    saver.delete_for_runs([run])
    assert all(v.ok for v in saver.store.history(T))
    assert saver.get_tuple(extra) is None
    latest = saver.get_tuple(generate_config(T))
    assert latest is not None and latest.config["configurable"]["checkpoint_id"] == ids[-1]
    saver.close()


def test_row_moved_from_another_thread_is_refused(backend_url: str) -> None:
    saver = SealstreamSaver(backend_url, key=KEY, encryption_key=None)
    ids = _thread(saver)
    other = _thread(saver, "thread-U")
    mine = [r for r in _rows(saver, "w") if r.name.startswith(ids[-1])][0]
    theirs = [r for r in _rows(saver, "w", "thread-U") if r.name.startswith(other[-1])][0]
    _set(saver, "w", mine.name, theirs.data)  # validly signed, but for another address
    got = saver.store.verify(T, ids[-1])
    assert (got.verdict, got.reason) == (INCONSISTENT, "ROW_MISMATCH")
    _set(saver, "w", mine.name, mine.data)
    _set(saver, "w", f"{ids[-1]}|extra|+000009", theirs.data)
    got = saver.store.verify(T, ids[-1])
    assert (got.verdict, got.reason) == (INCONSISTENT, "UNLISTED_WRITE")
    saver.close()


def test_keys_and_encryption_fail_closed(backend_url: str) -> None:
    saver = SealstreamSaver(backend_url, key=KEY, encryption_key=ENC)
    ids = _thread(saver)
    latest = ids[-1]
    assert saver.store.verify(T, latest).ok
    stored = saver.store.rows.get("cp", T, "", latest)
    assert stored is not None and b"channel" not in stored  # metadata is encrypted too

    def verdict(key: bytes | None, enc: bytes | None) -> tuple[str, str]:
        other = SealstreamSaver(backend_url, key=key, encryption_key=enc)
        v = other.store.verify(T, latest)
        other.close()
        return v.verdict, v.reason

    assert verdict(KEY, None) == (INCONSISTENT, "ENCRYPTED_WITHOUT_KEY")
    assert verdict(KEY, bytes(32)) == (INCONSISTENT, "KEY_MISMATCH")
    assert verdict(b"other-key", ENC) == (INCONSISTENT, "SIGNATURE_MISMATCH")
    assert verdict(None, ENC) == (INCONSISTENT, "SIGNED_WITHOUT_KEY")
    _set(saver, "cp", latest, stored[:-1] + bytes([stored[-1] ^ 1]))
    assert verdict(KEY, ENC) == (INCONSISTENT, "DECRYPTION_FAILED")
    _set(saver, "cp", latest, stored[:60])
    assert verdict(KEY, ENC) == (PARTIAL, "MANIFEST_UNREADABLE")
    addr = ("cp", T, "", latest)  # a signed plaintext row where encryption is required
    _set(saver, "cp", latest, seal_doc(Keys(KEY, None), addr, json.loads(
        unwrap(Keys(KEY, ENC), addr, stored))))
    assert verdict(KEY, ENC) == (INCONSISTENT, "PLAINTEXT_WHEN_ENCRYPTED")
    with pytest.raises(AgentCheckpointError):
        saver.get_tuple(generate_config(T))
    saver.close()


def test_ledger_rows_tampered_truncated_deleted(backend_url: str) -> None:
    store = AgentCheckpointStore(backend_url, key=KEY, encryption_key=None)
    ledger = EffectLedger(store, "exec-1")
    tool = Tool("t", lambda k, a: {"ok": a["n"]}, reconcile=lambda k, a: Reconciliation(False))
    ledger.perform(tool, 1, {"n": 1})
    ledger.perform(tool, 2, {"n": 2})
    rows = {r.name: r.data for r in store.rows.scan("fx", "exec-1", "")}
    first_intent, first_outcome = sorted(n for n in rows if n.endswith("|intent"))[0], None
    first_outcome = first_intent.replace("|intent", "|outcome")

    def reasons() -> list[tuple[str, str]]:
        return [(v.verdict, v.reason) for v in ledger.verify() if not v.ok]

    def put(name: str, data: bytes | None) -> None:
        with store.rows.transaction() as tx:
            if data is None:
                tx.delete("fx", "exec-1", "", [name])
            else:
                tx.upsert("fx", "exec-1", "", name, data)

    assert reasons() == []
    put(first_outcome, _alter_json(rows[first_outcome]))
    assert reasons() == [(INCONSISTENT, "SIGNATURE_MISMATCH")]
    with pytest.raises(AgentCheckpointError):
        ledger.perform(tool, 1, {"n": 1})  # never acts on a ledger it cannot trust
    put(first_outcome, rows[first_outcome][:10])
    assert reasons() == [(PARTIAL, "ROW_UNREADABLE")]
    put(first_outcome, rows[first_outcome])
    put(first_intent, None)
    assert set(reasons()) == {(PARTIAL, "INTENT_MISSING")}
    put(first_outcome, None)  # both rows gone: the signed count still knows
    assert sorted(reasons()) == [(PARTIAL, "INTENT_MISSING"), (PARTIAL, "OUTCOME_MISSING")]
    store.close()


def test_agent_checkpoint_history_falls_back_past_a_tampered_one(backend_url: str) -> None:
    store = AgentCheckpointStore(backend_url, key=KEY, encryption_key=None)
    store.save(AgentCheckpoint("e", node="plan", state={"n": 1}))
    second = store.save(AgentCheckpoint("e", node="pay", state={"n": 2}))
    data = store.rows.get("cp", "e", "", second.checkpoint_id)
    assert data is not None
    with store.rows.transaction() as tx:
        tx.upsert("cp", "e", "", second.checkpoint_id, _alter_json(data))
    # issue 19, defect 4: never a silent fall-back; only under an explicit policy
    with pytest.raises(AgentCheckpointError, match="refusing to fall back silently"):
        store.latest("e")
    latest = store.latest("e", fallback="verified")
    assert latest is not None and latest.node == "plan"
    assert [(v.checkpoint_id, v.reason) for v in latest.fell_back_past] == [
        (second.checkpoint_id, "SIGNATURE_MISMATCH")]
    assert [(v.verdict, v.reason) for v in store.history("e")] == [
        (INCONSISTENT, "SIGNATURE_MISMATCH"), (ATOMIC, "OK")]
    with pytest.raises(AgentCheckpointError):
        store.load("e", second.checkpoint_id)
    store.close()


def test_truncated_database_file_fails_closed(tmp_path: Path) -> None:
    db = tmp_path / "agents.db"
    saver = SealstreamSaver(db, key=KEY, encryption_key=None)
    _thread(saver)
    saver.close()
    sqlite3.connect(db).execute("PRAGMA wal_checkpoint(TRUNCATE)").connection.close()
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])
    saver = SealstreamSaver(db, key=KEY, encryption_key=None)
    with pytest.raises(CheckpointError):
        saver.get_tuple(generate_config(T))
    saver.close()
