"""Checkpoint manifests: canonical JSON bound by one signature.

A manifest names every component of a checkpoint with its SHA-256 and size,
and records the watermark epoch, the source positions, the emission receipts'
summary, the sink commit tokens and the pipeline fingerprint. The signature
covers the canonical encoding of everything else in the manifest, so it binds
all components together:

* with ``SEALSTREAM_CHECKPOINT_KEY`` set: ``hmac-sha256`` keyed by it
  (detects corruption and tampering);
* without: ``sha256``, an unkeyed digest (detects corruption only);
* with an Ed25519 signing key (``SEALSTREAM_SIGNING_KEY[_FILE]``): ``ed25519``,
  naming its key id, checked with public keys only (:mod:`.signing`).

File hashes and sizes are those of the plaintext. With encryption at rest
(:mod:`sealstream.checkpoint.crypto`) the store encrypts the manifest's bytes as
sealed here and every file after hashing, and decrypts before anything is verified.

What a reader trusts before the signature is checked is kept small:

* every JSON document read from a store (manifests, receipts) goes through
  :func:`load_json`, which refuses a document over :data:`MAX_JSON_BYTES` or nested
  deeper than :data:`MAX_JSON_DEPTH` (ValueError) instead of exhausting memory or
  the interpreter's stack;
* a file the manifest names must have one of the names a writer produces
  (:func:`path_problem`): ``cp-<12 digits>/<file>`` in the checkpoint's own
  directory, or, for an incremental checkpoint's ``base`` snapshot and ``delta:N``
  files, in the directory of an older checkpoint. Never an absolute path, ``..``,
  or any other name.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import re
from typing import Any

from sealstream.checkpoint import signing

FORMAT_VERSION = 1
MANIFEST_NAME = "MANIFEST.json"
STATE_NAME = "state.arrow"
#: an incremental checkpoint's state: the keys changed since its parent
DELTA_NAME = "state.delta.arrow"
RECEIPTS_NAME = "receipts.json"
SUPPRESS_NAME = "suppress.arrow"
#: the manifest field that signs the epoch's Merkle receipt root (checkpoint.receipts)
ROOTS_FIELD = "receipt_roots"
#: the sorted result ids of the checkpoint's epoch: the leaves of its Merkle receipt
RECEIPT_IDS_NAME = "receipt-ids.arrow"
KEY_ENV = "SEALSTREAM_CHECKPOINT_KEY"
ALG_HMAC = "hmac-sha256"
ALG_PLAIN = "sha256"

#: the largest JSON document (manifest, receipts) read from a store; a manifest of
#: thousands of partitions is well under 1 MiB
MAX_JSON_BYTES = 8 << 20
#: the deepest nesting of a JSON document read from a store (a manifest needs 5)
MAX_JSON_DEPTH = 64

_PATH = re.compile(r"cp-([0-9]{12})/([A-Za-z0-9._-]+)")
#: the file names each role may have (what the writer produces)
_ROLE_NAMES = {
    "state": (STATE_NAME, DELTA_NAME),
    "receipts": (RECEIPTS_NAME,),
    "suppress": (SUPPRESS_NAME,),
    "receipt_ids": (RECEIPT_IDS_NAME,),
    "base": (STATE_NAME,),
}
_DELTA_ROLE = "delta:"
#: a part of the state (a distributed run: one per worker), ``part:<i>`` in
#: ``state.part-<i>.arrow``; the ``state`` file then holds no rows, only the schema
#: and the watermark
_PART_ROLE = "part:"


def part_name(index: int) -> str:
    """The file name of the state's part ``index``."""
    return f"state.part-{index:04d}.arrow"


class NonFiniteNumberError(ValueError):
    """A JSON document holds ``NaN``, ``Infinity`` or a number beyond the float range."""


def _refuse_constant(name: str) -> Any:
    raise NonFiniteNumberError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NonFiniteNumberError(f"number {text[:40]} is beyond the float range")
    return value


def load_json(data: bytes | str, what: str = "document") -> Any:
    """Parse a JSON document read from a store, within bounds: ValueError (naming
    ``what``) when it is larger than :data:`MAX_JSON_BYTES`, nested deeper than
    :data:`MAX_JSON_DEPTH`, or not JSON. ``NaN``, ``Infinity`` and ``-Infinity``
    (which Python's parser accepts, but JSON does not have) and a number that
    overflows a float (``1e999``) are not JSON either: no writer produces them, and
    a forged one must not reach ``int()`` as an infinity."""
    if len(data) > MAX_JSON_BYTES:
        raise ValueError(f"{what} is larger than {MAX_JSON_BYTES} bytes")
    try:
        doc = json.loads(data, parse_constant=_refuse_constant, parse_float=_finite_float)
    except NonFiniteNumberError as exc:
        raise ValueError(f"{what} is not JSON: {exc}") from None
    except RecursionError:
        raise ValueError(f"{what} is nested deeper than {MAX_JSON_DEPTH} levels") from None
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:  # iteratively: a recursive walk is what must not be done here
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"{what} is nested deeper than {MAX_JSON_DEPTH} levels")
            items = value.values() if isinstance(value, dict) else value
            stack.extend((v, depth + 1) for v in items if isinstance(v, dict | list))
    return doc


def path_problem(cid: int, role: str, path: str) -> str | None:
    """Why ``path``, named by checkpoint ``cid``'s manifest for ``role``, is not a
    name the writer produces (None when it is). Checked before anything is read."""
    m = _PATH.fullmatch(path)
    if m is None:
        return "is not a plain checkpoint file name (cp-<id>/<file>)"
    owner, name = int(m.group(1)), m.group(2)
    if role.startswith(_DELTA_ROLE):
        if not role[len(_DELTA_ROLE):].isdigit() or int(role[len(_DELTA_ROLE):]) != owner:
            return "is not the delta file of the checkpoint its role names"
        names: tuple[str, ...] = (DELTA_NAME,)
    elif role.startswith(_PART_ROLE):
        index = role[len(_PART_ROLE):]
        if not index.isdigit() or len(index) > 4:
            return f"has an unknown role {role!r}"
        names = (part_name(int(index)),)
    elif role in _ROLE_NAMES:
        names = _ROLE_NAMES[role]
    else:
        return f"has an unknown role {role!r}"
    if name not in names:
        return f"is not a {role} file name ({' or '.join(names)})"
    if role in ("base",) or role.startswith(_DELTA_ROLE):
        if owner >= cid:
            return "names a checkpoint that is not older than this one"
    elif owner != cid:
        return "is not in this checkpoint's own directory"
    return None


def checkpoint_key() -> bytes | None:
    """The signing key from the environment, or None."""
    val = os.environ.get(KEY_ENV)
    return val.encode() if val else None


def canonical(body: dict[str, Any]) -> bytes:
    """The bytes that are signed: sorted keys, no whitespace, UTF-8."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sign(body: dict[str, Any], key: bytes | None) -> dict[str, str]:
    return sign_canonical(canonical(body), key)


def sign_canonical(data: bytes, key: bytes | None) -> dict[str, str]:
    """The signature of a body already in :func:`canonical` form: Ed25519 when a signing
    key is configured (:mod:`sealstream.checkpoint.signing`, with an ``hmac`` member too
    when ``key`` is given), else HMAC-SHA256 under ``key``, else an unkeyed SHA-256."""
    private = signing.signing_key()
    if private is not None:
        return signing.sign(data, private, key)
    if key is None:
        return {"alg": ALG_PLAIN, "value": hashlib.sha256(data).hexdigest()}
    return {"alg": ALG_HMAC, "value": hmac.new(key, data, hashlib.sha256).hexdigest()}


def seal(body: dict[str, Any], key: bytes | None) -> bytes:
    """The manifest file's bytes: the body plus its signature."""
    doc = dict(body)
    doc["signature"] = sign(body, key)
    return json.dumps(doc, sort_keys=True, indent=1).encode() + b"\n"


def signature_ok(doc: dict[str, Any], key: bytes | None) -> tuple[bool, str]:
    """Check a parsed manifest's signature; returns (ok, reason-code).

    With trusted public keys (:func:`sealstream.checkpoint.signing.trusted_keys`) only
    an Ed25519 signature by one of them verifies: an HMAC-only or unsigned document is
    ``PUBLIC_KEY_SIGNATURE_REQUIRED``, another key's ``UNKNOWN_KEY``."""
    sig = doc.get("signature")
    if not isinstance(sig, dict) or "alg" not in sig or "value" not in sig:
        return False, "NO_SIGNATURE"
    body = {k: v for k, v in doc.items() if k != "signature"}
    alg = sig["alg"]
    trusted = signing.trusted_keys()
    if alg == signing.ALG_ED25519:
        return signing.check(sig, canonical(body), trusted, key)
    if trusted and alg in (ALG_PLAIN, ALG_HMAC):
        return False, signing.REQUIRED
    if alg == ALG_PLAIN:
        if key is not None:
            return False, "UNSIGNED_WITH_KEY"
    elif alg == ALG_HMAC:
        if key is None:
            return False, "SIGNED_WITHOUT_KEY"
    else:
        return False, "UNKNOWN_SIGNATURE_ALG"
    data = canonical(body)
    expected = (hashlib.sha256(data).hexdigest() if key is None
                else hmac.new(key, data, hashlib.sha256).hexdigest())
    if not hmac.compare_digest(str(sig["value"]), expected):
        return False, "SIGNATURE_MISMATCH"
    return True, "OK"
