"""Sealing rows: the stream checkpoints' signature scheme plus identity binding.

A sealed row is the canonical JSON of a document that names its own address
(``"row": [space, execution, namespace, name]``), signed by
:func:`sealstream.checkpoint.manifest.seal` (HMAC-SHA256 with
``SEALSTREAM_CHECKPOINT_KEY``, else an unkeyed SHA-256). A row copied to another
execution, namespace or checkpoint therefore fails its identity check, and a row
altered without the key fails its signature.

With an encryption key (``SEALSTREAM_ENCRYPTION_KEY``) every row, metadata
included, is an AES-256-GCM envelope (:mod:`sealstream.checkpoint.crypto`) bound
to the same address; with a key set a plaintext row is refused (fail closed).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sealstream.agents import _check
from sealstream.checkpoint import crypto, manifest
from sealstream.errors import SpecError

#: default of every ``key=`` / ``encryption_key=`` parameter: read the environment
FROM_ENV: object = crypto.FROM_ENV


@dataclass(frozen=True)
class KeyRing:
    """Signing keys by key id, for rotation: new rows are signed with ``current``
    and name it (``"kid"``, inside the signed document); a row verifies under the key
    its id names, so old checkpoints stay verifiable after a rotation as long as
    their key stays in the ring. ``unnamed``: the id of the key that signed rows
    written before key ids were used (they carry no ``"kid"``).

    >>> ring = KeyRing("2026-12", {"2026-11": b"old", "2026-12": b"new"}, unnamed="2026-11")
    """

    current: str
    keys: Mapping[str, bytes]
    unnamed: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.keys, Mapping) or not self.keys or not all(
                isinstance(k, str) and k and isinstance(v, bytes) and v
                for k, v in self.keys.items()):
            raise SpecError("KeyRing keys: expected a mapping of key id (text) to key bytes")
        for name, kid in (("current", self.current), ("unnamed", self.unnamed)):
            if kid is not None and kid not in self.keys:
                raise SpecError(f"KeyRing {name}: {kid!r} is not one of the key ids "
                                f"{sorted(self.keys)}")

    def for_row(self, doc: Mapping[str, Any]) -> tuple[bool, bytes | None]:
        """The key the row's ``kid`` names: (False, None) when the ring lacks it."""
        kid = doc.get("kid", self.unnamed)
        if not isinstance(kid, str) or kid not in self.keys:
            return False, None
        return True, self.keys[kid]


#: what rows are signed and verified with: one key, none (unkeyed SHA-256), a ring
SignKey = bytes | None | KeyRing

#: what rows are encrypted with: one key, none, or a ring (new rows under its current
#: key; a row opens under the key whose id its envelope names)
EncryptKey = bytes | None | KeyRing

#: previous signing keys for rotation through the environment (comma-separated)
PREVIOUS_KEYS_ENV = "SEALSTREAM_CHECKPOINT_PREVIOUS_KEYS"
#: previous encryption keys (comma-separated, each 64 hex digits or base64)
PREVIOUS_ENCRYPTION_KEYS_ENV = "SEALSTREAM_ENCRYPTION_PREVIOUS_KEYS"


def key_label(key: bytes) -> str:
    """The id a key gets in a ring built from the environment: the hex of the first
    8 bytes of its SHA-256 (what an encryption envelope names in clear)."""
    return crypto.key_id(key).hex()


def _previous(env: str) -> list[str]:
    return [k.strip() for k in os.environ.get(env, "").split(",") if k.strip()]


def _ring(current: bytes | None, previous: list[bytes], env: str, current_env: str,
          what: str) -> bytes | KeyRing | None:
    """``current``, or with ``previous`` keys (from ``env``) a ring of them all named
    by :func:`key_label`; rows written before key ids are read as the first
    previous key's."""
    if not previous:
        return current
    if current is None:
        raise SpecError(f"{env} is set but {current_env} is not: set the current {what} too")
    keys = {key_label(k): k for k in [*previous, current]}
    return KeyRing(key_label(current), keys, unnamed=key_label(previous[0]))


def _sign_from_env() -> SignKey:
    """``SEALSTREAM_CHECKPOINT_KEY``, made a ring when previous keys are set."""
    return _ring(manifest.checkpoint_key(),
                 [k.encode() for k in _previous(PREVIOUS_KEYS_ENV)],
                 PREVIOUS_KEYS_ENV, manifest.KEY_ENV, "signing key")


def _encrypt_from_env() -> EncryptKey:
    """``SEALSTREAM_ENCRYPTION_KEY`` (or ``_FILE``), made a ring when previous keys
    are set."""
    return _ring(crypto.encryption_key(),
                 [crypto.parse_key(k, f"{PREVIOUS_ENCRYPTION_KEYS_ENV} (key {i + 1})")
                  for i, k in enumerate(_previous(PREVIOUS_ENCRYPTION_KEYS_ENV))],
                 PREVIOUS_ENCRYPTION_KEYS_ENV, crypto.KEY_ENV, "encryption key")


def _encrypt_key(value: object) -> EncryptKey:
    if value is None:
        return None
    if isinstance(value, KeyRing):
        bad = [kid for kid, k in value.keys.items() if len(k) != crypto.KEY_BYTES]
        if bad:
            raise SpecError(f"encryption_key: the ring's keys {bad} are not "
                            f"{crypto.KEY_BYTES} bytes")
        return value
    if not isinstance(value, bytes):
        raise SpecError(f"encryption_key: expected {crypto.KEY_BYTES} bytes, a KeyRing or "
                        f"None, got {type(value).__name__}")
    if len(value) != crypto.KEY_BYTES:
        raise SpecError(f"encryption_key: expected {crypto.KEY_BYTES} bytes, got "
                        f"{len(value)}")
    return value


@dataclass(frozen=True)
class Keys:
    """The signing key (or None: unkeyed SHA-256; or a :class:`KeyRing`) and the
    encryption key (or None; or a :class:`KeyRing` of 32-byte keys)."""

    sign: SignKey = None
    encrypt: EncryptKey = None

    @classmethod
    def resolve(cls, key: bytes | None | object = FROM_ENV,
                encryption_key: bytes | None | object = FROM_ENV) -> Keys:
        """Explicit keys, or those from the environment for :data:`FROM_ENV`
        (``SEALSTREAM_CHECKPOINT_KEY`` and ``SEALSTREAM_ENCRYPTION_KEY``, each made a
        ring when its ``..._PREVIOUS_KEYS`` variable lists earlier keys)."""
        sign: SignKey
        if key is FROM_ENV:
            sign = _sign_from_env()
        elif isinstance(key, KeyRing):
            sign = key
        else:
            sign = _check.key("key", key)
        enc = _encrypt_from_env() if encryption_key is FROM_ENV else _encrypt_key(
            encryption_key)
        return cls(sign, enc)


Address = tuple[str, str, str, str]


def context(addr: Address) -> str:
    """The associated data an envelope of the row at ``addr`` is bound to."""
    return json.dumps(["sealstream-agent", *addr], separators=(",", ":"))


def wrap(keys: Keys, addr: Address, data: bytes) -> bytes:
    """The bytes to store: ``data`` itself, or its envelope when encrypting (under a
    ring's current key)."""
    enc = keys.encrypt
    if isinstance(enc, KeyRing):
        enc = enc.keys[enc.current]
    return crypto.encrypt(enc, data, context(addr)) if enc else data


def unwrap(keys: Keys, addr: Address, stored: bytes) -> bytes:
    """The plaintext of a stored row; raises :class:`crypto.EnvelopeError` with a reason.
    Under a ring, the row opens with the key whose id its envelope names (an id the
    ring lacks: ``KEY_MISMATCH``)."""
    enc = keys.encrypt
    if isinstance(enc, KeyRing):
        named = crypto.envelope_key_id(stored)
        chosen = next((k for k in enc.keys.values() if crypto.key_id(k) == named), None)
        enc = chosen if chosen is not None else enc.keys[enc.current]
    if enc is not None:
        return crypto.decrypt(enc, stored, context(addr))
    if crypto.is_envelope(stored):
        return crypto.decrypt(None, stored, context(addr))  # raises ENCRYPTED_WITHOUT_KEY
    return stored


def seal_plain(keys: Keys, addr: Address, body: dict[str, Any]) -> bytes:
    """The signed (not yet encrypted) bytes of a document at ``addr``: its canonical
    JSON (:func:`sealstream.checkpoint.manifest.canonical`) with the signature of
    exactly those bytes added as a last member, so the document is encoded once.
    A reader parses the row and checks the signature of the rest, whatever the
    order of members or the whitespace (rows written with ``indent=1`` read the same)."""
    doc = dict(body)
    doc.pop("signature", None)
    doc["row"] = list(addr)
    key: bytes | None
    if isinstance(keys.sign, KeyRing):
        doc["kid"] = keys.sign.current
        key = keys.sign.keys[keys.sign.current]
    else:
        key = keys.sign
    data = manifest.canonical(doc)
    signature = json.dumps(manifest.sign_canonical(data, key), separators=(",", ":"))
    return data[:-1] + b',"signature":' + signature.encode() + b"}"


def seal_doc(keys: Keys, addr: Address, body: dict[str, Any]) -> bytes:
    """The stored bytes of a signed document at ``addr``."""
    return wrap(keys, addr, seal_plain(keys, addr, body))
