"""Ed25519 keys: loading, key files, and the verdicts on manifests and step plans."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from sealstream.checkpoint import manifest as mf
from sealstream.checkpoint import signing
from sealstream.checkpoint.plans import StepPlan, judge_plan
from sealstream.errors import SpecError


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (signing.SIGNING_KEY_ENV, signing.SIGNING_KEY_FILE_ENV, signing.VERIFY_KEYS_ENV,
                mf.KEY_ENV):
        monkeypatch.delenv(var, raising=False)


def _pair(d: Path, name: str) -> tuple[Path, Path, str]:
    kid = signing.generate(d / name)
    return d / name / signing.PRIVATE_NAME, d / name / signing.PUBLIC_NAME, kid


def test_key_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    private, public, kid = _pair(tmp_path, "a")
    key = signing.parse_public_keys(public.read_bytes(), "p")[kid]
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    lines = tmp_path / "keys.txt"
    lines.write_text(f"# trusted\n{kid} {base64.b64encode(raw).decode()}\n")
    assert list(signing.parse_public_keys(lines.read_bytes(), "l")) == [kid]
    lines.write_text(f"{'0' * 16} {base64.b64encode(raw).decode()}\n")
    with pytest.raises(SpecError, match="names key id"):
        signing.parse_public_keys(lines.read_bytes(), "l")
    with pytest.raises(SpecError, match="holds no public key"):
        signing.parse_public_keys(b"# nothing\n", "e")
    monkeypatch.setenv(signing.SIGNING_KEY_FILE_ENV, str(private))
    sk = signing.signing_key()
    assert sk is not None and sk.key_id == kid
    private.chmod(0o640)
    with pytest.raises(SpecError, match="mode 0640"):
        signing.signing_key()
    private.chmod(0o600)
    monkeypatch.setenv(signing.SIGNING_KEY_ENV, "x")
    with pytest.raises(SpecError, match="only one"):
        signing.signing_key()
    monkeypatch.delenv(signing.SIGNING_KEY_FILE_ENV)
    with pytest.raises(SpecError, match="Ed25519 private key"):
        signing.signing_key()
    monkeypatch.setenv(signing.SIGNING_KEY_ENV, private.read_text())
    again = signing.signing_key()
    assert again is not None and again.key_id == kid


def test_manifest_and_plan_verdicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    private, public, kid = _pair(tmp_path, "a")
    _other_private, other_public, _ = _pair(tmp_path, "b")
    body = {"id": 1, "x": [1, 2]}
    plan = StepPlan(step=1, prev="", partitions=("p0",), ranges={"p0": (0, 5)})
    monkeypatch.setenv(signing.SIGNING_KEY_FILE_ENV, str(private))
    doc = {**body, "signature": mf.sign(body, b"hmac")}
    assert doc["signature"]["alg"] == "ed25519" and doc["signature"]["key_id"] == kid
    data = plan.encode(None)
    monkeypatch.delenv(signing.SIGNING_KEY_FILE_ENV)
    hmac_doc = {**body, "signature": mf.sign(body, b"hmac")}
    hmac_plan = plan.encode(b"hmac")
    # no public key: the ed25519 signature verifies by its hmac member, else not at all
    assert mf.signature_ok(doc, b"hmac") == (True, "OK")
    assert mf.signature_ok(doc, b"other") == (False, "SIGNATURE_MISMATCH")
    assert mf.signature_ok(doc, None) == (False, signing.NO_PUBLIC_KEY)
    assert judge_plan(hmac_plan, 1, "", b"hmac").ok
    monkeypatch.setenv(signing.VERIFY_KEYS_ENV, str(public))
    assert mf.signature_ok(doc, None) == (True, "OK")
    assert mf.signature_ok({**doc, "x": [1, 3]}, None) == (False, "SIGNATURE_MISMATCH")
    assert mf.signature_ok(hmac_doc, b"hmac") == (False, signing.REQUIRED)
    assert judge_plan(data, 1, "", None).ok
    assert judge_plan(hmac_plan, 1, "", b"hmac").reason == signing.REQUIRED
    with signing.trusting([str(other_public)]):  # --public-key adds to the set
        assert mf.signature_ok(doc, None) == (True, "OK")
    monkeypatch.setenv(signing.VERIFY_KEYS_ENV, str(other_public))
    assert mf.signature_ok(doc, None) == (False, signing.UNKNOWN_KEY)
    assert judge_plan(data, 1, "", None).reason == signing.UNKNOWN_KEY
