"""Agent checkpoints signed with an Ed25519 key (SEALSTREAM_SIGNING_KEY_FILE) verify with
the public key alone; another key's are UNKNOWN_KEY; an HMAC-signed row is refused once
public keys are trusted (no downgrade)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sealstream.agents import AgentCheckpoint, AgentCheckpointStore
from sealstream.checkpoint import signing


def _reasons(db: Path, key: bytes | None = None) -> set[str]:
    store = AgentCheckpointStore(db, key=key)
    try:
        return {v.reason for v in store.history("e")}
    finally:
        store.close()


def test_agent_checkpoints_verify_with_the_public_key_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (signing.SIGNING_KEY_ENV, signing.SIGNING_KEY_FILE_ENV, signing.VERIFY_KEYS_ENV,
                "SEALSTREAM_CHECKPOINT_KEY"):
        monkeypatch.delenv(var, raising=False)
    signing.generate(tmp_path / "k")
    signing.generate(tmp_path / "other")
    db = tmp_path / "a.db"
    monkeypatch.setenv(signing.SIGNING_KEY_FILE_ENV, str(tmp_path / "k" / signing.PRIVATE_NAME))
    store = AgentCheckpointStore(db, key=None)
    store.save(AgentCheckpoint("e", state={"n": 1}))
    store.close()
    assert b'"alg":"ed25519"' in db.read_bytes()
    # the auditor: the public key only
    monkeypatch.delenv(signing.SIGNING_KEY_FILE_ENV)
    monkeypatch.setenv(signing.VERIFY_KEYS_ENV, str(tmp_path / "k" / signing.PUBLIC_NAME))
    assert _reasons(db) == {"OK"}
    monkeypatch.setenv(signing.VERIFY_KEYS_ENV, str(tmp_path / "other" / signing.PUBLIC_NAME))
    assert _reasons(db) == {signing.UNKNOWN_KEY}
    monkeypatch.delenv(signing.VERIFY_KEYS_ENV)
    assert _reasons(db) == {signing.NO_PUBLIC_KEY}
    # an HMAC-signed row, read where public keys are trusted: refused
    hdb = tmp_path / "h.db"
    store = AgentCheckpointStore(hdb, key=b"hmac-key")
    store.save(AgentCheckpoint("e", state={"n": 1}))
    store.close()
    assert _reasons(hdb, b"hmac-key") == {"OK"}
    monkeypatch.setenv(signing.VERIFY_KEYS_ENV, str(tmp_path / "k" / signing.PUBLIC_NAME))
    assert _reasons(hdb, b"hmac-key") == {signing.REQUIRED}
