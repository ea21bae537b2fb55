"""Stories about encrypted checkpoints: real runs in subprocesses with
SEALSTREAM_ENCRYPTION_KEY set. A crashed encrypted job resumes to exactly the
uninterrupted output; nothing of the input is readable on disk; a missing or
wrong key is a verdict and a clear error; a plaintext checkpoint is refused
while a key is set, and nothing is deleted."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from _story import assert_same_output, in_process, make_input, run, write_spec

from sealstream.checkpoint import crypto
from sealstream.checkpoint import manifest as mf

KEY_HEX = "5f" * 16 + "a0" * 16
OTHER_HEX = "07" * 32
ENC = {crypto.KEY_ENV: KEY_HEX}
SECRET = "customer-XK42-sensitive"
INCONSISTENT = "INCONSISTENT_STATE"
ATOMIC = "ATOMIC_CHECKPOINT"


def _story(d: Path) -> Path:
    """The shared story, with one key renamed to a string we can grep for."""
    names = make_input(d)
    for n in names:
        p = d / n
        p.write_text(p.read_text().replace('"user": "u1"', f'"user": "{SECRET}"'))
    return write_spec(d, names, keep=20)


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    e = dict(os.environ)
    for k in (mf.KEY_ENV, crypto.KEY_ENV, crypto.KEY_FILE_ENV, "SEALSTREAM_CRASH_AT"):
        e.pop(k, None)
    e.update(extra or {})
    return e


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``sealstream ARGS`` in this process (an inspection command needs no process of
    its own; a subprocess costs a Python start and the Polars/Arrow imports), with
    exactly ``_env(env)`` as its environment: every other variable is unset for the call."""
    return in_process(*args, env={**dict.fromkeys(os.environ), **_env(env)})


def verify(d: Path, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    res = cli("checkpoints", "verify", str(d / "ckpt"), "--json", env=env)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, json.loads(res.stdout)


def _run(spec: Path, *extra: str, env: dict[str, str] | None = None,
         crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    return run(spec, *extra, env=env, crash_at=crash_at)


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("plain")
    res = _run(_story(d))
    assert res.returncode == 0, res.stderr
    return d


@pytest.fixture(scope="module")
def encrypted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An encrypted job killed after its 3rd checkpoint, then resumed to the end."""
    d = tmp_path_factory.mktemp("encrypted")
    spec = _story(d)
    assert _run(spec, crash_at="after_retention:3", env=ENC).returncode == -9
    rc, data = verify(d, env=ENC)
    assert rc == 0 and data["resume_from"] is not None, data
    res = _run(spec, env=ENC)
    assert res.returncode == 0, res.stderr
    return d


def test_crashed_encrypted_job_resumes_to_the_exact_output(
    encrypted: Path, expected: Path
) -> None:
    assert_same_output(encrypted, expected)


def test_nothing_of_the_input_is_readable_in_the_checkpoint_files(
    encrypted: Path, expected: Path
) -> None:
    from sealstream.checkpoint.stores import LocalCheckpointStore
    from sealstream.state.codec import decode_table

    files = [f for f in (encrypted / "ckpt").rglob("*") if f.is_file() and f.name != "LOCK"]
    assert len(files) >= 3
    for f in files:
        data = f.read_bytes()
        assert data.startswith(crypto.MAGIC), f
        for needle in (SECRET.encode(), b"in/p0.jsonl", b"watermark", b"summary"):
            assert needle not in data, (f, needle)
    grep = subprocess.run(["grep", "-r", "-l", "-a", SECRET, str(encrypted / "ckpt")],
                          capture_output=True, text=True)
    assert grep.returncode == 1 and grep.stdout == "", grep.stdout
    # the same story in plaintext does show them; the encrypted state does hold the key
    plain = b"".join(f.read_bytes() for f in (expected / "ckpt").rglob("MANIFEST.json"))
    assert b"in/p0.jsonl" in plain and b"watermark" in plain
    store = LocalCheckpointStore(encrypted / "ckpt", encryption_key=bytes.fromhex(KEY_HEX))
    seen = False
    for cid in store.ids():
        doc = store.read_manifest(cid)
        assert doc is not None
        state, _ = decode_table(store.read(doc["files"]["state"]["path"]))
        seen = seen or SECRET in str(state.to_dicts())
    assert seen, "the story should put the secret key into some checkpoint's state"


def test_directories_0700_and_files_0600(encrypted: Path) -> None:
    root = encrypted / "ckpt"
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    cps = sorted(root.glob("cp-*"))
    assert cps
    for cp in cps:
        assert stat.S_IMODE(os.stat(cp).st_mode) == 0o700
        for f in cp.iterdir():
            assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f


def test_verify_with_the_key(encrypted: Path) -> None:
    rc, data = verify(encrypted, env=ENC)
    assert rc == 0 and {c["verdict"] for c in data["checkpoints"]} == {ATOMIC}


def test_verify_without_the_key(encrypted: Path) -> None:
    rc, data = verify(encrypted)
    assert rc == 1
    assert {(c["verdict"], c["reason"]) for c in data["checkpoints"]} == {
        (INCONSISTENT, "ENCRYPTED_WITHOUT_KEY")}
    assert crypto.KEY_ENV in data["checkpoints"][0]["message"]
    res = cli("checkpoints", "verify", str(encrypted / "ckpt"))
    assert res.returncode == 1 and "ENCRYPTED_WITHOUT_KEY" in res.stdout


def test_verify_with_the_wrong_key(encrypted: Path) -> None:
    rc, data = verify(encrypted, env={crypto.KEY_ENV: OTHER_HEX})
    assert rc == 1
    assert {(c["verdict"], c["reason"]) for c in data["checkpoints"]} == {
        (INCONSISTENT, "KEY_MISMATCH")}


def test_key_from_a_key_file(encrypted: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY_HEX + "\n")
    rc, data = verify(encrypted, env={crypto.KEY_FILE_ENV: str(key_file)})
    assert rc == 0, data


def test_malformed_key_is_a_clear_error(encrypted: Path) -> None:
    res = cli("checkpoints", "verify", str(encrypted / "ckpt"),
              env={crypto.KEY_ENV: "not-a-key"})
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "not a valid encryption key" in res.stderr
    res = _run(encrypted / "spec.toml", env={crypto.KEY_ENV: "abcd"})
    assert res.returncode == 2 and "not a valid encryption key" in res.stderr


def test_list_and_inspect_with_the_key(encrypted: Path) -> None:
    res = cli("checkpoints", "list", str(encrypted / "ckpt"), "--json", env=ENC)
    assert res.returncode == 0, res.stderr
    cps = json.loads(res.stdout)["checkpoints"]
    assert cps and all(c["complete"] and c["watermark_ms"] is not None for c in cps)
    res = cli("checkpoints", "inspect", str(encrypted / "ckpt"), "--json", env=ENC)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["verdict"] == ATOMIC


def test_inspect_shows_the_details_of_an_encrypted_checkpoint(encrypted: Path) -> None:
    res = cli("checkpoints", "inspect", str(encrypted / "ckpt"), "--json", env=ENC)
    data = json.loads(res.stdout)
    assert data["complete"] and data["state"]["read"] and data["watermark"]["global_ms"]


def test_inspect_without_the_key_names_the_reason(encrypted: Path) -> None:
    res = cli("checkpoints", "inspect", str(encrypted / "ckpt"), "--json")
    assert "Traceback" not in res.stderr
    data = json.loads(res.stdout)
    assert (data["verdict"], data["reason"]) == (INCONSISTENT, "ENCRYPTED_WITHOUT_KEY")


def test_run_without_the_key_refuses_and_deletes_nothing(encrypted: Path) -> None:
    before = sorted(p.relative_to(encrypted) for p in (encrypted / "ckpt").rglob("*"))
    res = _run(encrypted / "spec.toml")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "ENCRYPTED_WITHOUT_KEY" in res.stderr
    assert sorted(p.relative_to(encrypted) for p in (encrypted / "ckpt").rglob("*")) == before


def test_plaintext_checkpoints_are_refused_when_a_key_is_set(tmp_path: Path) -> None:
    spec = _story(tmp_path)
    assert _run(spec, crash_at="after_retention:2").returncode == -9
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    res = _run(spec, env=ENC)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "PLAINTEXT_WHEN_ENCRYPTED" in res.stderr and "nothing was deleted" in res.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    rc, data = verify(tmp_path, env=ENC)
    assert rc == 1 and {c["reason"] for c in data["checkpoints"]} == {"PLAINTEXT_WHEN_ENCRYPTED"}


@pytest.mark.parametrize("point", ["after_write_state:2", "before_manifest_publish:3",
                                   "after_manifest_publish:2"])
def test_crash_mid_checkpoint_resumes_exactly(tmp_path: Path, expected: Path, point: str) -> None:
    spec = _story(tmp_path)
    assert _run(spec, crash_at=point, env=ENC).returncode == -9
    res = _run(spec, env=ENC)
    assert res.returncode == 0, res.stderr
    assert_same_output(tmp_path, expected)


def test_flipped_byte_in_an_encrypted_checkpoint_falls_back(
    tmp_path: Path, expected: Path
) -> None:
    spec = _story(tmp_path)
    assert _run(spec, crash_at="after_retention:4", env=ENC).returncode == -9
    newest = sorted((tmp_path / "ckpt").glob("cp-*"))[-1]
    for name, how in (("state.arrow", "flip"), ("receipts.json", "truncate")):
        p = newest / name
        data = p.read_bytes()
        i = len(data) // 2
        p.write_bytes(data[:i] + bytes([data[i] ^ 1]) + data[i + 1:] if how == "flip"
                      else data[:i])
    rc, data = verify(tmp_path, env=ENC)
    last = data["checkpoints"][-1]
    assert rc == 1 and (last["verdict"], last["reason"]) == (
        "PARTIAL_CHECKPOINT_REJECT", "FILE_TRUNCATED")
    res = _run(spec, env=ENC)
    assert res.returncode == 0, res.stderr
    assert_same_output(tmp_path, expected)
