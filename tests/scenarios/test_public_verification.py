"""Stories of verification by anyone (semantics section 16): a job signs with an
Ed25519 private key; an auditor holding only the public key verifies its checkpoints,
catches every tampering, proves any committed result through the signed emission log
(whatever retention pruned, across a fall-back), and proves that a later checkpoint did
not rewrite history."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from _story import (
    assert_same_output,
    committed,
    in_process,
    make_input,
    run,
    uninterrupted,
    write_spec,
)
from test_corruption import EXPECT, _damage

from sealstream.checkpoint import emission_log, signing
from sealstream.checkpoint import manifest as mf
from sealstream.cli import main

ATOMIC, PARTIAL, INCONSISTENT = "ATOMIC_CHECKPOINT", "PARTIAL_CHECKPOINT_REJECT", \
    "INCONSISTENT_STATE"
expected = uninterrupted(keep=20)


def _keys(d: Path, name: str = "keys") -> tuple[Path, Path, str]:
    kid = signing.generate(d / name)
    return d / name / signing.PRIVATE_NAME, d / name / signing.PUBLIC_NAME, kid


def _signer(private: Path) -> dict[str, str]:
    return {signing.SIGNING_KEY_FILE_ENV: str(private)}


def _auditor_env(public: Path | None = None) -> dict[str, str]:
    """The environment of someone holding only the public key (no private, no HMAC key)."""
    e = {k: v for k, v in os.environ.items()
         if k not in (mf.KEY_ENV, signing.SIGNING_KEY_ENV, signing.SIGNING_KEY_FILE_ENV,
                      signing.VERIFY_KEYS_ENV)}
    if public is not None:
        e[signing.VERIFY_KEYS_ENV] = str(public)
    return e


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``sealstream ARGS`` in this process (an inspection command needs no process of
    its own; a subprocess costs a Python start and the Polars/Arrow imports), with
    exactly ``env`` as its environment: every other variable is unset for the call."""
    return in_process(*args, env={**dict.fromkeys(os.environ), **env})


def _verify(d: Path, env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    res = _cli("checkpoints", "verify", str(d / "ckpt"), "--json", env=env)
    return res.returncode, json.loads(res.stdout)


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A job signed with an Ed25519 key, SIGKILLed after its 5th checkpoint."""
    d = tmp_path_factory.mktemp("signed")
    private, _public, _kid = _keys(d)
    spec = write_spec(d / "job", make_input(d / "job"), keep=20)
    assert run(spec, crash_at="after_retention:5", env=_signer(private)).returncode == -9
    return d


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


# --------------------------------------------------------------------------- keys
def test_keys_generate_writes_a_private_key_only_its_owner_reads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "generate", str(tmp_path / "k")]) == 0
    kid = capsys.readouterr().out.strip()
    assert len(kid) == 16 and int(kid, 16) >= 0
    assert (tmp_path / "k" / signing.PRIVATE_NAME).stat().st_mode & 0o777 == 0o600
    public = signing.parse_public_keys((tmp_path / "k" / signing.PUBLIC_NAME).read_bytes(), "p")
    assert list(public) == [kid]
    # never overwritten
    assert main(["keys", "generate", str(tmp_path / "k")]) == 2
    assert "never overwritten" in capsys.readouterr().err


def test_a_private_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    private, _public, _kid = _keys(tmp_path)
    private.chmod(0o644)
    spec = write_spec(tmp_path, make_input(tmp_path))
    res = run(spec, env=_signer(private))
    assert res.returncode == 2, res.stderr
    assert "mode 0644" in res.stderr and "Traceback" not in res.stderr
    assert committed(tmp_path, "out") == []


# --------------------------------------------------------------------------- verdicts
def test_the_public_key_alone_verifies_genuine_checkpoints(signed: Path) -> None:
    public = signed / "keys" / signing.PUBLIC_NAME
    rc, data = _verify(signed / "job", _auditor_env(public))
    assert rc == 0 and {c["verdict"] for c in data["checkpoints"]} == {ATOMIC}, data
    assert {c["signer"] for c in data["checkpoints"]} == {"ed25519"}
    # the report names the key it judged with, not "none (sha256)"
    kids = sorted(signing.parse_public_keys(public.read_bytes(), str(public)))
    assert data["key"] == f"ed25519 {kids[0]}" and len(kids) == 1
    # --public-key FILE works the same as SEALSTREAM_VERIFY_KEYS
    res = _cli("checkpoints", "verify", str(signed / "job" / "ckpt"), "--json",
               "--public-key", str(public), env=_auditor_env())
    assert res.returncode == 0, res.stdout + res.stderr
    # without any public key, an ed25519 checkpoint cannot be verified: refused
    rc, data = _verify(signed / "job", _auditor_env())
    assert rc == 1 and {c["reason"] for c in data["checkpoints"]} == {signing.NO_PUBLIC_KEY}


@pytest.mark.parametrize("how,name", sorted(EXPECT))
def test_every_tampering_fails_under_the_public_key(tmp_path: Path, signed: Path, how: str,
                                                   name: str) -> None:
    d = _copy(signed, tmp_path / "s")
    public = d / "keys" / signing.PUBLIC_NAME
    newest = sorted((d / "job" / "ckpt").glob("cp-*"))[-1]
    _damage(newest / name, how)
    rc, data = _verify(d / "job", _auditor_env(public))
    assert rc == 1
    assert data["checkpoints"][-1]["verdict"] == EXPECT[(how, name)], data["checkpoints"][-1]
    assert [c["verdict"] for c in data["checkpoints"][:-1]] == [ATOMIC] * (
        len(data["checkpoints"]) - 1)


def _reseal(path: Path, env: dict[str, str], *, strip: bool = False,
            hmac_key: bytes | None = None, change: bool = True) -> None:
    doc = json.loads(path.read_text())
    doc.pop("signature")
    if change:
        doc["positions"][0]["next_offset"] += 10
    saved = {k: os.environ.pop(k) for k in list(os.environ)
             if k in (signing.SIGNING_KEY_ENV, signing.SIGNING_KEY_FILE_ENV)}
    os.environ.update(env)
    try:
        data = (json.dumps(doc, sort_keys=True, indent=1).encode() if strip
                else mf.seal(doc, hmac_key))
    finally:
        for k in env:
            os.environ.pop(k, None)
        os.environ.update(saved)
    path.write_bytes(data)


@pytest.mark.parametrize("forgery,reason", [
    ("another key", signing.UNKNOWN_KEY),
    ("hmac re-seal", signing.REQUIRED),
    ("sha256 re-seal", signing.REQUIRED),
    ("stripped signature", signing.REQUIRED),
])
def test_forgeries_without_the_private_key_are_inconsistent(
        tmp_path: Path, signed: Path, forgery: str, reason: str) -> None:
    d = _copy(signed, tmp_path / "s")
    public = d / "keys" / signing.PUBLIC_NAME
    newest = sorted((d / "job" / "ckpt").glob("cp-*"))[-1] / "MANIFEST.json"
    if forgery == "another key":
        other, _, _ = _keys(tmp_path, "other")
        _reseal(newest, _signer(other))
    elif forgery == "hmac re-seal":
        _reseal(newest, {}, hmac_key=b"k-attacker")
    elif forgery == "sha256 re-seal":
        _reseal(newest, {})
    else:
        _reseal(newest, {}, strip=True, change=False)
    rc, data = _verify(d / "job", _auditor_env(public))
    assert rc == 1
    last = data["checkpoints"][-1]
    assert (last["verdict"], last["reason"]) == (INCONSISTENT, reason), last
    assert data["resume_from"] == data["checkpoints"][-2]["id"]
    # the signing job itself refuses it too, and falls back
    res = run(d / "job" / "spec.toml", env=_signer(d / "keys" / signing.PRIVATE_NAME))
    assert res.returncode == 0, res.stderr


def test_rotation_old_checkpoints_verify_while_their_key_stays_trusted(
        tmp_path: Path, signed: Path, expected: Path) -> None:
    d = _copy(signed, tmp_path / "s")
    new_private, new_public, new_kid = _keys(tmp_path, "new")
    # the new key signs; the old one stays trusted, so the job resumes from its checkpoints
    old_public = d / "keys" / signing.PUBLIC_NAME
    res = run(d / "job" / "spec.toml", env=_signer(new_private))
    assert res.returncode == 1 and signing.UNKNOWN_KEY in res.stderr
    res = run(d / "job" / "spec.toml",
              env={**_signer(new_private), signing.VERIFY_KEYS_ENV: str(old_public)})
    assert res.returncode == 0, res.stderr
    assert_same_output(d / "job", expected)
    both = tmp_path / "trusted.pem"
    both.write_bytes((d / "keys" / signing.PUBLIC_NAME).read_bytes() + new_public.read_bytes())
    rc, data = _verify(d / "job", _auditor_env(both))
    assert rc == 0, data
    docs = [json.loads((c / "MANIFEST.json").read_text())
            for c in sorted((d / "job" / "ckpt").glob("cp-*"))]
    assert {doc["signature"]["key_id"] for doc in docs} >= {new_kid}
    # the old key dropped from the trusted set: its checkpoints are UNKNOWN_KEY
    rc, data = _verify(d / "job", _auditor_env(new_public))
    reasons = {c["reason"] for c in data["checkpoints"]}
    assert signing.UNKNOWN_KEY in reasons and "OK" in reasons


# --------------------------------------------------------------------------- proofs
def _window(d: Path, r: dict[str, Any], env: dict[str, str], *extra: str
            ) -> subprocess.CompletedProcess[str]:
    return _cli("checkpoints", "window", str(d / "ckpt"), "--key", str(r["key"]), "--start",
                str(r["window_start"]), "--end", str(r["window_end"]), "--json", *extra,
                env=env)


def test_the_first_result_of_a_long_job_is_proven_after_pruning_with_keep_2(
        tmp_path: Path) -> None:
    private, public, _kid = _keys(tmp_path)
    job = tmp_path / "job"
    spec = write_spec(job, make_input(job, events=900), keep=2, every_events=90)
    res = run(spec, env=_signer(private))
    assert res.returncode == 0, res.stderr
    assert len(list((job / "ckpt").glob("cp-*"))) == 2
    first = committed(job, "out")[0]
    auditor = _auditor_env(public)
    # the proof is rebuilt from epoch 1's committed output, through the signed log
    res = _window(job, first, auditor, "--spec", str(spec))
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(res.stdout)
    proof = data["checkpoint"]["output_emission_receipt"]
    assert data["checkpoint"]["status"] == "emitted"
    assert proof["receipt_proof"] == 2 and proof["epoch"] == 1 and proof["log_index"] == 0
    assert data["manifest"]["directive"].startswith("PROCEED")
    (tmp_path / "w.json").write_text(res.stdout)
    # `receipts verify` takes that output as it is, with the public key alone
    res = _cli("receipts", "verify", str(tmp_path / "w.json"), "--checkpoints",
               str(job / "ckpt"), env=auditor)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines()[-1] == "1 proof checked, 0 failed"
    # one byte flipped in the proof fails
    for field in ("path", "log_path", "epoch_root"):
        bad = dict(proof)
        text = bad[field]
        bad[field] = text[:3] + ("A" if text[3] != "A" else "B") + text[4:]
        (tmp_path / "bad.json").write_text(json.dumps({**data, "checkpoint": {
            **data["checkpoint"], "output_emission_receipt": bad}}))
        res = _cli("receipts", "verify", str(tmp_path / "bad.json"), "--checkpoints",
                   str(job / "ckpt"), env=auditor)
        assert res.returncode == 1, (field, res.stdout)
        assert res.stdout.splitlines()[-1] == "1 proof checked, 1 failed"
    # without the spec it cannot search the pruned epochs: says so, exit 1, never PROCEED
    res = _window(job, first, auditor)
    assert res.returncode == 1
    data = json.loads(res.stdout)
    assert "PRUNED_EPOCHS" in " ".join(data["checkpoint"]["notes"])
    assert data["manifest"]["directive"].startswith("NOT FOUND")
    # a window that never existed: exit 1, never PROCEED
    res = _window(job, {"key": "u1", "window_start": 1, "window_end": 2}, auditor,
                  "--spec", str(spec))
    assert res.returncode == 1
    data = json.loads(res.stdout)
    assert data["checkpoint"]["status"] == "absent"
    assert data["manifest"]["reason"] == "WINDOW_NOT_FOUND"
    assert not data["manifest"]["directive"].startswith("PROCEED")
    # every result of every epoch, exported and checked offline
    out = tmp_path / "all.jsonl"
    res = _cli("receipts", "export", str(job / "ckpt"), "--epochs", "1..999", "--spec",
               str(spec), "--to", str(out), env=auditor)
    assert res.returncode == 0, res.stderr
    proven = {json.loads(line)["id"] for line in out.read_text().splitlines()}
    for r in committed(job, "out"):
        kint = "true" if isinstance(r["key"], int) else "false"
        assert f"{r['key']}|{kint}|{r['window_start']}|{r['window_end']}" in proven
    res = _cli("receipts", "verify", str(out), "--checkpoints", str(job / "ckpt"), env=auditor)
    assert res.returncode == 0
    assert res.stdout.splitlines()[-1] == f"{len(proven)} proofs checked, 0 failed"
    assert len(res.stdout.splitlines()) == 1  # no line per proof that holds


def test_every_result_has_a_proof_across_a_fall_back(tmp_path: Path, signed: Path,
                                                    expected: Path) -> None:
    """The newest checkpoint is damaged after its epoch's output was committed: the run
    falls back, suppresses that output, and the log records the epoch from it."""
    d = _copy(signed, tmp_path / "s")
    job = d / "job"
    newest = sorted((job / "ckpt").glob("cp-*"))[-1]
    _damage(newest / "state.arrow", "flip")
    private, public = d / "keys" / signing.PRIVATE_NAME, d / "keys" / signing.PUBLIC_NAME
    res = run(job / "spec.toml", env=_signer(private))
    assert res.returncode == 0, res.stderr
    assert_same_output(job, expected)
    out = tmp_path / "all.jsonl"
    auditor = _auditor_env(public)
    res = _cli("receipts", "export", str(job / "ckpt"), "--epochs", "1..999", "--spec",
               str(job / "spec.toml"), "--to", str(out), env=auditor)
    assert res.returncode == 0, res.stderr
    proven = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert len(proven) == len(set(proven)) == len(committed(job, "out"))
    res = _cli("receipts", "verify", str(out), "--checkpoints", str(job / "ckpt"), env=auditor)
    assert res.returncode == 0, res.stdout


def test_a_checkpoint_that_dropped_an_epoch_fails_the_consistency_proof(
        tmp_path: Path, signed: Path) -> None:
    d = _copy(signed, tmp_path / "s")
    ckpt = d / "job" / "ckpt"
    cps = sorted(ckpt.glob("cp-*"))
    old_id, new_id = int(cps[-2].name[3:]), int(cps[-1].name[3:])
    auditor = _auditor_env(d / "keys" / signing.PUBLIC_NAME)
    res = _cli("receipts", "consistency", str(ckpt), str(old_id), str(new_id), "--json",
               env=auditor)
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout)["ok"]
    # an auditor keeps the old manifest; the holder of the private key rewrites history:
    # the newest checkpoint drops epoch 1's receipts from its log and is re-signed
    saved = tmp_path / "old-manifest.json"
    shutil.copyfile(cps[-2] / "MANIFEST.json", saved)
    receipts = json.loads((cps[-1] / "receipts.json").read_text())
    receipts["log"] = receipts["log"][1:]
    data = json.dumps(receipts, sort_keys=True, indent=1).encode()
    (cps[-1] / "receipts.json").write_bytes(data)
    doc = json.loads((cps[-1] / "MANIFEST.json").read_text())
    doc[emission_log.LOG_FIELD] = emission_log.head(receipts["log"])
    doc["files"]["receipts"].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    doc.pop("signature")
    os.environ[signing.SIGNING_KEY_FILE_ENV] = str(d / "keys" / signing.PRIVATE_NAME)
    try:
        (cps[-1] / "MANIFEST.json").write_bytes(mf.seal(doc, None))
    finally:
        os.environ.pop(signing.SIGNING_KEY_FILE_ENV)
    for old in (str(old_id), str(saved)):
        res = _cli("receipts", "consistency", str(ckpt), old, str(new_id), env=auditor)
        assert res.returncode == 1, res.stdout + res.stderr
        assert res.stdout.startswith("NOT_AN_EXTENSION"), res.stdout
    # the guard sees it too: the rewritten log does not extend its parent's
    rc, verdicts = _verify(d / "job", auditor)
    last = verdicts["checkpoints"][-1]
    assert (last["verdict"], last["reason"]) == (INCONSISTENT, "EMISSION_LOG_REWRITTEN"), last
