"""Public-key signatures (Ed25519): who may sign, who is trusted, and the check.

A signing key (the private half) lets its holder write checkpoints that verify;
the public half only lets its holder *check* them, so verification can be handed
to anyone (an auditor, a downstream team) without handing them the power to forge.

* The private key comes from ``SEALSTREAM_SIGNING_KEY_FILE`` (a PEM file, refused
  unless its mode is 0600 or stricter) or ``SEALSTREAM_SIGNING_KEY`` (PEM text, or
  the 32 raw private bytes as 64 hex digits or base64). Never both.
* The trusted public keys: ``SEALSTREAM_VERIFY_KEYS`` (a file), the files given with
  ``--public-key`` (:func:`trusting`), and the public half of the configured signing
  key (a run can read back what it wrote). A key file holds PEM public keys
  (``sealstream keys generate`` writes one) and/or lines ``KEY_ID BASE64`` (the raw
  32-byte public key); ``#`` starts a comment. A written key id must be the key's.
* A key id is the first 8 bytes of SHA-256 of the raw public key, as 16 hex digits.

A signature is ``{"alg": "ed25519", "key_id": KID, "value": HEX}`` over the same
canonical bytes an HMAC signs (:func:`sealstream.checkpoint.manifest.canonical`);
with ``SEALSTREAM_CHECKPOINT_KEY`` also set it carries ``"hmac": HEX`` too, so a
reader holding only the HMAC key still verifies it.

No downgrade: when any public key is trusted, a document signed with an HMAC only,
or unsigned, does not verify (``PUBLIC_KEY_SIGNATURE_REQUIRED``), nor does one signed
by a key outside the trusted set (``UNKNOWN_KEY``).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import hashlib
import hmac
import os
import re
import stat
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sealstream.errors import SpecError

if TYPE_CHECKING:  # cryptography is imported where a public key is used: a run
    # without SEALSTREAM_SIGNING_KEY / SEALSTREAM_VERIFY_KEYS never loads it
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

SIGNING_KEY_ENV = "SEALSTREAM_SIGNING_KEY"
SIGNING_KEY_FILE_ENV = "SEALSTREAM_SIGNING_KEY_FILE"
VERIFY_KEYS_ENV = "SEALSTREAM_VERIFY_KEYS"
ALG_ED25519 = "ed25519"
PRIVATE_NAME = "signing-key.pem"
PUBLIC_NAME = "public-key.pem"

UNKNOWN_KEY = "UNKNOWN_KEY"
REQUIRED = "PUBLIC_KEY_SIGNATURE_REQUIRED"
NO_PUBLIC_KEY = "NO_PUBLIC_KEY"

#: the guard's one-line texts for the reason codes above (after "checkpoint N ")
MESSAGES = {
    UNKNOWN_KEY: "is signed by a key outside the trusted public keys (UNKNOWN_KEY)",
    REQUIRED: "is not signed with a public key (HMAC-only or unsigned) but public keys "
              "are configured: refused, no downgrade",
    NO_PUBLIC_KEY: "is signed with a public key (ed25519) but no public key is trusted "
                   f"(set {VERIFY_KEYS_ENV} or pass --public-key)",
}

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_PEM = re.compile(rb"-----BEGIN ([A-Z ]+)-----.*?-----END \1-----", re.S)
_extra: ContextVar[tuple[str, ...]] = ContextVar("sealstream_public_keys", default=())


def key_id(public: Ed25519PublicKey) -> str:
    """The public key's id: the first 8 bytes of SHA-256 of its 32 raw bytes, in hex."""
    from cryptography.hazmat.primitives import serialization

    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).digest()[:8].hex()


@dataclass(frozen=True)
class SigningKey:
    """A private Ed25519 key and its public key's id."""

    private: Ed25519PrivateKey
    key_id: str

    @classmethod
    def of(cls, private: Ed25519PrivateKey) -> SigningKey:
        return cls(private, key_id(private.public_key()))


def _private_from(data: bytes, source: str) -> Ed25519PrivateKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    text = data.strip()
    if text.startswith(b"-----BEGIN"):
        try:
            key = serialization.load_pem_private_key(text, password=None)
        except (ValueError, TypeError) as exc:
            raise SpecError(f"{source}: not a PEM private key ({exc})") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise SpecError(f"{source}: the PEM key is not an Ed25519 key")
        return key
    raw = b""
    if _HEX64.fullmatch(text.decode("ascii", errors="replace")):
        raw = bytes.fromhex(text.decode())
    else:
        with contextlib.suppress(binascii.Error, ValueError):
            raw = base64.b64decode(text, validate=True)
    if len(raw) != 32:
        raise SpecError(f"{source}: expected an Ed25519 private key as PEM, or its 32 raw "
                        "bytes as 64 hex digits or base64 (`sealstream keys generate DIR`)")
    return Ed25519PrivateKey.from_private_bytes(raw)


@functools.lru_cache(maxsize=8)
def _load_private(value: str | None, path: str | None, _stamp: tuple[int, ...]
                  ) -> SigningKey | None:
    if value:
        return SigningKey.of(_private_from(value.encode(), SIGNING_KEY_ENV))
    if path:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise SpecError(f"{SIGNING_KEY_FILE_ENV}={path}: cannot read the key file "
                            f"({exc.strerror or exc})") from None
        return SigningKey.of(_private_from(data, f"{SIGNING_KEY_FILE_ENV}={path}"))
    return None


def signing_key(environ: Mapping[str, str] | None = None) -> SigningKey | None:
    """The Ed25519 signing key configured in the environment, or None. Raises
    SpecError when both variables are set, the key is malformed, or the key file is
    readable by anyone but its owner (its mode must be 0600 or stricter)."""
    env = os.environ if environ is None else environ
    value, path = env.get(SIGNING_KEY_ENV) or None, env.get(SIGNING_KEY_FILE_ENV) or None
    if value and path:
        raise SpecError(f"set only one of {SIGNING_KEY_ENV} and {SIGNING_KEY_FILE_ENV}")
    stamp: tuple[int, ...] = ()
    if path:
        try:
            st = os.stat(path)
        except OSError as exc:
            raise SpecError(f"{SIGNING_KEY_FILE_ENV}={path}: cannot read the key file "
                            f"({exc.strerror or exc})") from None
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise SpecError(f"{SIGNING_KEY_FILE_ENV}={path}: the private key file has mode "
                            f"{stat.S_IMODE(st.st_mode):04o}; refused unless 0600 (chmod 600 "
                            f"{path})")
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    return _load_private(value, path, stamp)


def parse_public_keys(data: bytes, source: str) -> dict[str, Ed25519PublicKey]:
    """The public keys in a key file (PEM blocks and/or ``KEY_ID BASE64`` lines), by id."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    out: dict[str, Ed25519PublicKey] = {}
    for m in _PEM.finditer(data):
        try:
            key = serialization.load_pem_public_key(m.group(0))
        except (ValueError, TypeError) as exc:
            raise SpecError(f"{source}: a PEM block is not a public key ({exc})") from None
        if not isinstance(key, Ed25519PublicKey):
            raise SpecError(f"{source}: a public key is not an Ed25519 key")
        out[key_id(key)] = key
    rest = _PEM.sub(b"", data).decode("utf-8", errors="replace")
    for n, line in enumerate(rest.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        try:
            raw = base64.b64decode(parts[-1], validate=True) if len(parts) == 2 else b""
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != 32:
            raise SpecError(f"{source}: line {n} is not 'KEY_ID BASE64-PUBLIC-KEY' or PEM")
        key = Ed25519PublicKey.from_public_bytes(raw)
        if key_id(key) != parts[0].lower():
            raise SpecError(f"{source}: line {n} names key id {parts[0]}, but the key's id "
                            f"is {key_id(key)}")
        out[key_id(key)] = key
    if not out:
        raise SpecError(f"{source}: holds no public key")
    return out


@functools.lru_cache(maxsize=32)
def _read_keys(path: str, _stamp: tuple[int, int, int]) -> dict[str, Ed25519PublicKey]:
    return parse_public_keys(Path(path).read_bytes(), path)


def _keys_file(path: str, what: str) -> dict[str, Ed25519PublicKey]:
    try:
        st = os.stat(path)
        return _read_keys(path, (st.st_mtime_ns, st.st_size, st.st_ino))
    except OSError as exc:
        raise SpecError(f"{what}={path}: cannot read the public key file "
                        f"({exc.strerror or exc})") from None


def trusted_keys(environ: Mapping[str, str] | None = None) -> dict[str, Ed25519PublicKey]:
    """Every trusted public key by id: ``SEALSTREAM_VERIFY_KEYS``, the ``--public-key``
    files in effect (:func:`trusting`) and the configured signing key's public half."""
    env = os.environ if environ is None else environ
    out: dict[str, Ed25519PublicKey] = {}
    path = env.get(VERIFY_KEYS_ENV)
    if path:
        out.update(_keys_file(path, VERIFY_KEYS_ENV))
    for extra in _extra.get():
        out.update(_keys_file(extra, "--public-key"))
    own = signing_key(env)
    if own is not None:
        out[own.key_id] = own.private.public_key()
    return out


@contextlib.contextmanager
def trusting(paths: tuple[str, ...] | list[str]) -> Iterator[None]:
    """Trust the public keys in ``paths`` too, within the block (``--public-key``)."""
    token = trust_files(tuple(paths))
    try:
        yield
    finally:
        untrust(token)


def sign(data: bytes, key: SigningKey, hmac_key: bytes | None) -> dict[str, str]:
    """The signature of ``data`` (canonical bytes) under ``key`` (and ``hmac_key``)."""
    sig = {"alg": ALG_ED25519, "key_id": key.key_id, "value": key.private.sign(data).hex()}
    if hmac_key is not None:
        sig["hmac"] = hmac.new(hmac_key, data, hashlib.sha256).hexdigest()
    return sig


def check(sig: Mapping[str, Any], data: bytes, trusted: Mapping[str, Ed25519PublicKey],
          hmac_key: bytes | None) -> tuple[bool, str]:
    """Verify an ed25519 signature of ``data``: (ok, reason code). With no trusted public
    key, it verifies by its ``hmac`` member under ``hmac_key`` only."""
    if not trusted:
        if hmac_key is not None and isinstance(sig.get("hmac"), str):
            expected = hmac.new(hmac_key, data, hashlib.sha256).hexdigest()
            ok = hmac.compare_digest(str(sig["hmac"]), expected)
            return (True, "OK") if ok else (False, "SIGNATURE_MISMATCH")
        return False, NO_PUBLIC_KEY
    public = trusted.get(str(sig.get("key_id")))
    if public is None:
        return False, UNKNOWN_KEY
    from cryptography.exceptions import InvalidSignature

    try:
        public.verify(bytes.fromhex(str(sig.get("value"))), data)
    except (InvalidSignature, ValueError):
        return False, "SIGNATURE_MISMATCH"
    if hmac_key is not None and "hmac" in sig:
        expected = hmac.new(hmac_key, data, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(str(sig["hmac"]), expected):
            return False, "SIGNATURE_MISMATCH"
    return True, "OK"


def generate(directory: Path) -> str:
    """Write a new key pair into ``directory`` (the private key mode 0600, created, never
    replaced) and return the public key's id."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    directory.mkdir(parents=True, exist_ok=True)
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = private.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    priv_path, pub_path = directory / PRIVATE_NAME, directory / PUBLIC_NAME
    for p in (priv_path, pub_path):
        if p.exists():
            raise SpecError(f"{p} exists; keys are never overwritten")
    fd = os.open(priv_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    fd = os.open(pub_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(public)
    return key_id(private.public_key())


def trust_files(paths: tuple[str, ...]) -> Any:
    """Trust the public keys in ``paths`` too from now on; returns the token that
    :func:`untrust` takes (the CLI's ``--public-key``, undone when its command ends)."""
    for p in paths:
        _keys_file(p, "--public-key")  # a bad file is named before anything is read
    return _extra.set(_extra.get() + tuple(paths))


def untrust(token: Any) -> None:
    _extra.reset(token)
