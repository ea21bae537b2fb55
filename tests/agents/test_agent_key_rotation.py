"""Rotating the encryption key (and, through the environment, the signing key):
rows written under an earlier key stay readable while that key is in the ring; new
rows use the current key; a retired key's rows are refused with the verdict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sealstream.agents import (
    AgentCheckpoint,
    AgentCheckpointError,
    AgentCheckpointStore,
    KeyRing,
    key_label,
)
from sealstream.checkpoint import crypto
from sealstream.errors import SpecError

OLD = bytes(range(32))
NEW = bytes(range(100, 132))
SIGN = b"rotation-signing-key"


def _envelope_ids(store: AgentCheckpointStore, space: str = "cp") -> set[bytes | None]:
    return {crypto.envelope_key_id(r.data) for r in store.rows.scan(space, "e", "")}


def test_encryption_key_ring_reads_old_rows_and_writes_new_ones(backend_url: str) -> None:
    store = AgentCheckpointStore(backend_url, key=SIGN, encryption_key=OLD)
    first = store.save(AgentCheckpoint("e", state={"n": 1}))
    store.close()

    ring = KeyRing("2026-12", {"2026-11": OLD, "2026-12": NEW})
    store = AgentCheckpointStore(backend_url, key=SIGN, encryption_key=ring)
    second = store.save(AgentCheckpoint("e", state={"n": 2}))
    assert [v.reason for v in store.history("e")] == ["OK", "OK"]
    assert store.load("e", first.checkpoint_id).state == {"n": 1}
    latest = store.latest("e")
    assert latest is not None and latest.state == {"n": 2}
    assert _envelope_ids(store) == {crypto.key_id(OLD), crypto.key_id(NEW)}
    store.close()

    retired = AgentCheckpointStore(backend_url, key=SIGN, encryption_key=NEW)
    assert retired.load("e", second.checkpoint_id).state == {"n": 2}
    with pytest.raises(AgentCheckpointError, match="KEY_MISMATCH"):
        retired.load("e", first.checkpoint_id)
    retired.close()

    missing = AgentCheckpointStore(backend_url, key=SIGN,
                                   encryption_key=KeyRing("x", {"x": bytes(32)}))
    verdicts = missing.history("e")
    assert {v.reason for v in verdicts if v.checkpoint_id in (
        first.checkpoint_id, second.checkpoint_id)} == {"KEY_MISMATCH"}
    missing.close()


def test_a_ring_of_wrong_sized_keys_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="not 32 bytes"):
        AgentCheckpointStore(tmp_path / "a.db", key=SIGN,
                             encryption_key=KeyRing("a", {"a": b"short"}))


def test_rotation_through_the_environment(tmp_path: Path) -> None:
    """``SEALSTREAM_ENCRYPTION_PREVIOUS_KEYS`` and ``SEALSTREAM_CHECKPOINT_PREVIOUS_KEYS``
    (comma-separated) keep earlier rows readable and verifiable, in a new process
    as an operator would run it."""
    db = tmp_path / "a.db"
    code = ("import sys; from sealstream.agents import AgentCheckpoint, "
            "AgentCheckpointStore as S; s = S(sys.argv[1]); "
            "s.save(AgentCheckpoint('e', state={'n': int(sys.argv[2])})); "
            "print([v.reason for v in s.history('e')]); s.close()")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEALSTREAM_")}

    def run(n: int, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", code, str(db), str(n)],
                              env={**env, **extra}, capture_output=True, text=True,
                              timeout=120)

    before = run(1, SEALSTREAM_CHECKPOINT_KEY="old-sign", SEALSTREAM_ENCRYPTION_KEY=OLD.hex())
    assert before.returncode == 0, before.stderr
    after = run(2, SEALSTREAM_CHECKPOINT_KEY="new-sign",
                SEALSTREAM_CHECKPOINT_PREVIOUS_KEYS="old-sign",
                SEALSTREAM_ENCRYPTION_KEY=NEW.hex(),
                SEALSTREAM_ENCRYPTION_PREVIOUS_KEYS=f" {OLD.hex()} ,")
    assert after.returncode == 0, after.stderr
    assert after.stdout.strip() == "['OK', 'OK']"
    without = run(3, SEALSTREAM_CHECKPOINT_KEY="new-sign", SEALSTREAM_ENCRYPTION_KEY=NEW.hex())
    # the old key retired: new rows are written, the first one is reported, newest first
    assert without.returncode == 0, without.stderr
    assert without.stdout.strip() == "['OK', 'OK', 'KEY_MISMATCH']"

    # the same rings through the API: a ring from the environment names each key by
    # its key_label (what rows signed under it carry as their key id)
    old, new = key_label(b"old-sign"), key_label(b"new-sign")
    store = AgentCheckpointStore(db, key=KeyRing(
        new, {old: b"old-sign", new: b"new-sign"}, unnamed=old),
        encryption_key=KeyRing("new", {"old": OLD, "new": NEW}))
    first, second, third = store.ids("e")
    assert [store.load("e", i).state for i in (first, second)] == [{"n": 1}, {"n": 2}]
    with pytest.raises(AgentCheckpointError, match="SIGNATURE_MISMATCH"):
        store.load("e", third)  # no key id: read as signed by `unnamed`, the old key
    store.close()

    bad = run(4, SEALSTREAM_ENCRYPTION_KEY=NEW.hex(),
              SEALSTREAM_ENCRYPTION_PREVIOUS_KEYS="not-a-key")
    assert bad.returncode != 0
    assert "SEALSTREAM_ENCRYPTION_PREVIOUS_KEYS (key 1) is not a valid encryption key" in (
        bad.stderr)
    orphan = run(5, SEALSTREAM_CHECKPOINT_PREVIOUS_KEYS="old-sign")
    assert orphan.returncode != 0
    assert "SEALSTREAM_CHECKPOINT_PREVIOUS_KEYS is set but SEALSTREAM_CHECKPOINT_KEY" in (
        orphan.stderr)


def test_langgraph_saver_under_a_rotated_encryption_key(tmp_path: Path) -> None:
    pytest.importorskip("langgraph")
    from langgraph.checkpoint.base import empty_checkpoint

    from sealstream.agents.langgraph import SealstreamSaver

    db = tmp_path / "lg.db"
    cfg = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    old = SealstreamSaver(db, key=SIGN, encryption_key=OLD)
    cp = empty_checkpoint()
    cp["channel_values"] = {"a": "kept", "b": 1}
    cp["channel_versions"] = {"a": 1, "b": 1}
    stored = old.put(cfg, cp, {"step": 0}, {"a": 1, "b": 1})
    old.close()
    saver = SealstreamSaver(db, key=SIGN, encryption_key=KeyRing("n", {"o": OLD, "n": NEW}))
    child = empty_checkpoint()
    child["channel_values"] = {"b": 2}
    child["channel_versions"] = {"a": 1, "b": 2}  # "a" reused from the parent
    saver.put(stored, child, {"step": 1}, {"b": 2})
    tup = saver.get_tuple(cfg)
    assert tup is not None and tup.checkpoint["channel_values"] == {"a": "kept", "b": 2}
    assert len(list(saver.list(cfg))) == 2
    saver.close()
