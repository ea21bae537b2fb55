"""Checkpoint manifests: canonical JSON bound by one signature.

A manifest names every component of a checkpoint with its SHA-256 and size,
and records the watermark epoch, the source positions, the emission receipts'
summary, the sink commit tokens and the pipeline fingerprint. The signature
covers the canonical encoding of everything else in the manifest, so it binds
all components together:

* with ``SEALSTREAM_CHECKPOINT_KEY`` set: ``hmac-sha256`` keyed by it
  (detects corruption and tampering);
* without: ``sha256``, an unkeyed digest (detects corruption only).

File hashes and sizes are those of the plaintext. With encryption at rest
(:mod:`sealstream.checkpoint.crypto`) the store encrypts the manifest's bytes as
sealed here and every file after hashing, and decrypts before anything is verified.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import Any

FORMAT_VERSION = 1
MANIFEST_NAME = "MANIFEST.json"
STATE_NAME = "state.arrow"
#: an incremental checkpoint's state: the keys changed since its parent
DELTA_NAME = "state.delta.arrow"
RECEIPTS_NAME = "receipts.json"
SUPPRESS_NAME = "suppress.arrow"
KEY_ENV = "SEALSTREAM_CHECKPOINT_KEY"
ALG_HMAC = "hmac-sha256"
ALG_PLAIN = "sha256"


def checkpoint_key() -> bytes | None:
    """The signing key from the environment, or None."""
    val = os.environ.get(KEY_ENV)
    return val.encode() if val else None


def canonical(body: dict[str, Any]) -> bytes:
    """The bytes that are signed: sorted keys, no whitespace, UTF-8."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sign(body: dict[str, Any], key: bytes | None) -> dict[str, str]:
    data = canonical(body)
    if key is None:
        return {"alg": ALG_PLAIN, "value": hashlib.sha256(data).hexdigest()}
    return {"alg": ALG_HMAC, "value": hmac.new(key, data, hashlib.sha256).hexdigest()}


def seal(body: dict[str, Any], key: bytes | None) -> bytes:
    """The manifest file's bytes: the body plus its signature."""
    doc = dict(body)
    doc["signature"] = sign(body, key)
    return json.dumps(doc, sort_keys=True, indent=1).encode() + b"\n"


def signature_ok(doc: dict[str, Any], key: bytes | None) -> tuple[bool, str]:
    """Check a parsed manifest's signature; returns (ok, reason-code)."""
    sig = doc.get("signature")
    if not isinstance(sig, dict) or "alg" not in sig or "value" not in sig:
        return False, "NO_SIGNATURE"
    body = {k: v for k, v in doc.items() if k != "signature"}
    alg = sig["alg"]
    if alg == ALG_PLAIN:
        if key is not None:
            return False, "UNSIGNED_WITH_KEY"
    elif alg == ALG_HMAC:
        if key is None:
            return False, "SIGNED_WITHOUT_KEY"
    else:
        return False, "UNKNOWN_SIGNATURE_ALG"
    expected = sign(body, key)["value"]
    if not hmac.compare_digest(str(sig["value"]), expected):
        return False, "SIGNATURE_MISMATCH"
    return True, "OK"
