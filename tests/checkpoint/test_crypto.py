"""Encryption at rest: the AES-256-GCM envelope, key configuration, and the store
writing, reading and judging encrypted checkpoints (verdicts, never exceptions)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from sealstream.checkpoint import crypto, guard
from sealstream.checkpoint.crypto import (
    DECRYPTION_FAILED,
    ENCRYPTED_WITHOUT_KEY,
    HEADER_BYTES,
    KEY_MISMATCH,
    MAGIC,
    OVERHEAD,
    PLAINTEXT_WHEN_ENCRYPTED,
    TRUNCATED,
    EnvelopeError,
    decrypt,
    encrypt,
    key_id,
)
from sealstream.checkpoint.manifest import MANIFEST_NAME, RECEIPTS_NAME, STATE_NAME, seal
from sealstream.checkpoint.stores import LocalCheckpointStore, checkpoint_dirname
from sealstream.errors import CheckpointError, SpecError
from sealstream.state.codec import WATERMARK_META, encode_table

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))
CTX = "cp-000000000007/state.arrow"
PLAIN = b"user-secret-42," * 20


def _reason(key: bytes | None, data: bytes, ctx: str = CTX) -> str:
    with pytest.raises(EnvelopeError) as info:
        decrypt(key, data, ctx)
    assert isinstance(info.value, CheckpointError)
    return info.value.reason


# --------------------------------------------------------------------------- envelope
def test_round_trip_and_layout() -> None:
    env = encrypt(KEY, PLAIN, CTX)
    assert decrypt(KEY, env, CTX) == PLAIN
    assert env.startswith(MAGIC) and env[8] == 1
    assert env[9:17] == key_id(KEY) == hashlib.sha256(KEY).digest()[:8]
    assert int.from_bytes(env[29:37], "big") == len(PLAIN)
    assert env[37:41] == hashlib.sha256(env[:37]).digest()[:4]
    assert len(env) == len(PLAIN) + OVERHEAD
    assert b"user-secret" not in env


def test_empty_plaintext_round_trips() -> None:
    assert decrypt(KEY, encrypt(KEY, b"", CTX), CTX) == b""


def test_nonce_is_random_per_file() -> None:
    a, b = encrypt(KEY, PLAIN, CTX), encrypt(KEY, PLAIN, CTX)
    assert a[17:29] != b[17:29] and a[HEADER_BYTES:] != b[HEADER_BYTES:]


def test_wrong_key_is_a_key_mismatch() -> None:
    assert _reason(OTHER, encrypt(KEY, PLAIN, CTX)) == KEY_MISMATCH


def test_missing_key_is_reported_as_such() -> None:
    assert _reason(None, encrypt(KEY, PLAIN, CTX)) == ENCRYPTED_WITHOUT_KEY


def test_plaintext_when_a_key_is_configured_is_refused() -> None:
    assert _reason(KEY, PLAIN) == PLAINTEXT_WHEN_ENCRYPTED
    assert _reason(KEY, b"") == PLAINTEXT_WHEN_ENCRYPTED


@pytest.mark.parametrize("region,offsets,reasons", [
    ("magic", range(0, 8), {PLAINTEXT_WHEN_ENCRYPTED}),
    ("version", range(8, 9), {DECRYPTION_FAILED}),
    ("key id", range(9, 17), {DECRYPTION_FAILED}),
    ("nonce", range(17, 29), {DECRYPTION_FAILED}),
    ("length", range(29, 37), {DECRYPTION_FAILED}),
    ("check", range(37, 41), {DECRYPTION_FAILED}),
    ("ciphertext", range(41, 41 + 60), {DECRYPTION_FAILED}),
    ("tag", range(41 + 60, 41 + 60 + 16), {DECRYPTION_FAILED}),
])
def test_every_flipped_byte_is_detected(region: str, offsets: range, reasons: set[str]) -> None:
    env = encrypt(KEY, PLAIN[:60], CTX)
    assert len(env) == HEADER_BYTES + 60 + 16 == 41 + 60 + 16
    for i in offsets:
        for bit in (0x01, 0x80):
            bad = env[:i] + bytes([env[i] ^ bit]) + env[i + 1:]
            assert _reason(KEY, bad) in reasons, (region, i, bit)


def test_files_cannot_be_swapped_between_checkpoints_or_roles() -> None:
    env = encrypt(KEY, PLAIN, CTX)
    assert _reason(KEY, env, "cp-000000000008/state.arrow") == DECRYPTION_FAILED
    assert _reason(KEY, env, "cp-000000000007/receipts.json") == DECRYPTION_FAILED


def test_every_truncation_is_truncated() -> None:
    env = encrypt(KEY, PLAIN[:40], CTX)
    for n in range(len(MAGIC), len(env)):
        assert _reason(KEY, env[:n]) == TRUNCATED, n


def test_appended_bytes_fail() -> None:
    assert _reason(KEY, encrypt(KEY, PLAIN, CTX) + b"\x00") == DECRYPTION_FAILED


# --------------------------------------------------------------------------- keys
def test_key_from_hex_and_base64() -> None:
    assert crypto.encryption_key({crypto.KEY_ENV: KEY.hex()}) == KEY
    assert crypto.encryption_key({crypto.KEY_ENV: KEY.hex().upper() + "\n"}) == KEY
    assert crypto.encryption_key({crypto.KEY_ENV: base64.b64encode(KEY).decode()}) == KEY
    assert crypto.encryption_key({}) is None


@pytest.mark.parametrize("bad", ["secret", "00" * 31, "00" * 33, "zz" * 32,
                                 base64.b64encode(b"x" * 16).decode()])
def test_malformed_keys_are_rejected_clearly(bad: str) -> None:
    with pytest.raises(SpecError, match="not a valid encryption key: expected 32 bytes"):
        crypto.encryption_key({crypto.KEY_ENV: bad})


def test_key_file(tmp_path: Path) -> None:
    text, raw = tmp_path / "k.hex", tmp_path / "k.bin"
    text.write_text(KEY.hex() + "\n")
    raw.write_bytes(KEY)
    assert crypto.encryption_key({crypto.KEY_FILE_ENV: str(text)}) == KEY
    assert crypto.encryption_key({crypto.KEY_FILE_ENV: str(raw)}) == KEY
    with pytest.raises(SpecError, match="cannot read the key file"):
        crypto.encryption_key({crypto.KEY_FILE_ENV: str(tmp_path / "missing")})
    with pytest.raises(SpecError, match="only one of"):
        crypto.encryption_key({crypto.KEY_FILE_ENV: str(text), crypto.KEY_ENV: KEY.hex()})


def test_store_reads_the_key_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(crypto.KEY_ENV, KEY.hex())
    assert LocalCheckpointStore(tmp_path).encryption_key == KEY
    monkeypatch.setenv(crypto.KEY_ENV, "nope")
    with pytest.raises(SpecError):
        LocalCheckpointStore(tmp_path)
    monkeypatch.delenv(crypto.KEY_ENV)
    assert not LocalCheckpointStore(tmp_path).encrypted


# --------------------------------------------------------------------------- store
def _write(store: LocalCheckpointStore, cid: int) -> None:
    """A checkpoint as ``Job._checkpoint`` writes it (hashes of the plaintext)."""
    wm = {"max_delay_ms": 1000, "max_time": [5_000], "exhausted": [False],
          "global_ms": 4_000, "partition_ms": [4_000]}
    state = encode_table(pl.DataFrame({"key": ["user-secret-42"], "n": [3]}),
                         {WATERMARK_META.decode(): wm})
    summary = {"results": 1, "late": 0, "errors": 0, "digest": "d" * 64}
    receipts = json.dumps({"summary": summary, "epochs": []}).encode()
    files = {STATE_NAME: state, RECEIPTS_NAME: receipts}
    d = checkpoint_dirname(cid)
    entries = {
        role: {"path": f"{d}/{name}", "sha256": hashlib.sha256(files[name]).hexdigest(),
               "bytes": len(files[name])}
        for role, name in (("state", STATE_NAME), ("receipts", RECEIPTS_NAME))
    }
    body: dict[str, Any] = {
        "format": 1, "id": cid, "parent": None, "pipeline": "p", "fingerprint": "f",
        "watermark": wm, "positions": [{"partition": "a", "next_offset": 1}],
        "files": entries, "receipts": summary, "sinks": {}, "created_ms": 0,
    }
    store.ensure_root()
    store.write_checkpoint(cid, files, seal(body, None))


def _judge(store: LocalCheckpointStore, cid: int) -> guard.Verdict:
    return guard.judge(store.evidence(cid), None, guard.Policy())


@pytest.fixture
def enc(tmp_path: Path) -> LocalCheckpointStore:
    store = LocalCheckpointStore(tmp_path / "ckpt", encryption_key=KEY)
    _write(store, 1)
    _write(store, 2)
    return store


def _at(store: LocalCheckpointStore, key: bytes | None) -> LocalCheckpointStore:
    return LocalCheckpointStore(store.root, encryption_key=key)


def test_encrypted_checkpoint_is_atomic_and_readable(enc: LocalCheckpointStore) -> None:
    v = _judge(enc, 2)
    assert v.verdict == guard.ATOMIC, v.message
    doc = enc.read_manifest(2)
    assert doc is not None and doc["id"] == 2
    assert json.loads(enc.read(doc["files"]["receipts"]["path"]))["summary"]["results"] == 1
    for f in enc.path_of(2).iterdir():
        raw = f.read_bytes()
        assert raw.startswith(MAGIC) and b"user-secret" not in raw, f.name


def test_directories_are_0700_and_files_0600(enc: LocalCheckpointStore) -> None:
    assert stat.S_IMODE(os.stat(enc.root).st_mode) == 0o700
    for cid in (1, 2):
        assert stat.S_IMODE(os.stat(enc.path_of(cid)).st_mode) == 0o700
        for f in enc.path_of(cid).iterdir():
            assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f


@pytest.mark.parametrize("key,reason", [(None, ENCRYPTED_WITHOUT_KEY), (OTHER, KEY_MISMATCH)])
def test_missing_or_wrong_key_is_an_inconsistent_verdict(
    enc: LocalCheckpointStore, key: bytes | None, reason: str
) -> None:
    store = _at(enc, key)
    v = _judge(store, 2)
    assert (v.verdict, v.reason) == (guard.INCONSISTENT, reason)
    assert store.read_manifest(2) is None
    with pytest.raises(CheckpointError):
        store.read(f"{checkpoint_dirname(2)}/{STATE_NAME}")


def test_plaintext_checkpoint_is_refused_when_a_key_is_set(tmp_path: Path) -> None:
    plain = LocalCheckpointStore(tmp_path / "ckpt", encryption_key=None)
    _write(plain, 1)
    assert _judge(plain, 1).ok
    v = _judge(_at(plain, KEY), 1)
    assert (v.verdict, v.reason) == (guard.INCONSISTENT, PLAINTEXT_WHEN_ENCRYPTED)


def test_plaintext_file_inside_an_encrypted_checkpoint_is_refused(
    enc: LocalCheckpointStore
) -> None:
    doc = enc.read_manifest(2)
    assert doc is not None
    rel = doc["files"]["receipts"]["path"]
    data = enc.read(rel)
    (enc.root / rel).unlink()
    (enc.root / rel).write_bytes(data + b" " * OVERHEAD)  # the size would not give it away
    v = _judge(enc, 2)
    assert (v.verdict, v.reason) == (guard.INCONSISTENT, PLAINTEXT_WHEN_ENCRYPTED)


@pytest.mark.parametrize("name", [STATE_NAME, RECEIPTS_NAME, MANIFEST_NAME])
def test_truncated_encrypted_file_is_partial(enc: LocalCheckpointStore, name: str) -> None:
    path = enc.path_of(2) / name
    data = path.read_bytes()
    for n in (len(data) - 1, len(data) // 2, HEADER_BYTES, 10):
        path.write_bytes(data[:n])
        v = _judge(enc, 2)
        want = "MANIFEST_UNREADABLE" if name == MANIFEST_NAME else "FILE_TRUNCATED"
        assert (v.verdict, v.reason) == (guard.PARTIAL, want), (n, v.message)


@pytest.mark.parametrize("name", [STATE_NAME, RECEIPTS_NAME, MANIFEST_NAME])
def test_flipped_byte_anywhere_is_a_verdict(enc: LocalCheckpointStore, name: str) -> None:
    path = enc.path_of(2) / name
    data = path.read_bytes()
    for i in list(range(0, HEADER_BYTES + 4)) + [len(data) // 2, len(data) - 1]:
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x04]) + data[i + 1:])
        v = _judge(enc, 2)
        assert v.verdict == guard.INCONSISTENT, (i, v.reason)
        assert v.reason in guard.ENCRYPTION_REASONS, (i, v.reason)
    path.write_bytes(data)
    assert _judge(enc, 2).ok


@pytest.mark.parametrize("name", [STATE_NAME, RECEIPTS_NAME, MANIFEST_NAME])
def test_file_from_another_checkpoint_does_not_decrypt(
    enc: LocalCheckpointStore, name: str
) -> None:
    (enc.path_of(2) / name).write_bytes((enc.path_of(1) / name).read_bytes())
    v = _judge(enc, 2)
    assert (v.verdict, v.reason) == (guard.INCONSISTENT, DECRYPTION_FAILED), v.message
