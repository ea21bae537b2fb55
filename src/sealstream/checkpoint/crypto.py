"""Encryption at rest for checkpoint files: AES-256-GCM envelopes.

With ``SEALSTREAM_ENCRYPTION_KEY`` (32 bytes as 64 hex digits or base64) or
``SEALSTREAM_ENCRYPTION_KEY_FILE`` (a file holding the key in one of those
forms, or as 32 raw bytes) set, the checkpoint store writes every checkpoint
file — state, receipts, suppression table and the manifest — as an envelope::

    offset  size  field
    0       8     magic  b"SSENC\\x00\\r\\n"
    8       1     version (1 = AES-256-GCM)
    9       8     key id: the first 8 bytes of SHA-256 of the key (in clear)
    17      12    nonce, random per file
    29      8     plaintext length n, big-endian
    37      4     header check: the first 4 bytes of SHA-256 of bytes 0..36
    41      n+16  ciphertext and GCM tag

The header check tells a damaged header (``DECRYPTION_FAILED``) from a file cut
short (``FILE_TRUNCATED``) and a genuine other key (``KEY_MISMATCH``); it is not a
security measure. The associated data is the whole 41-byte header followed by the file's path
relative to the checkpoint directory (``cp-000000000012/state.arrow``): the
checkpoint id and the file's role. Any change to the header, nonce, ciphertext
or tag, or a file moved to another checkpoint or role, fails authentication.

Decryption errors carry a reason code the guard reports: ``ENCRYPTED_WITHOUT_KEY``,
``KEY_MISMATCH``, ``DECRYPTION_FAILED``, ``FILE_TRUNCATED`` (shorter than its
header says) and ``PLAINTEXT_WHEN_ENCRYPTED`` (a key is configured but the file
is not an envelope: refused, fail closed).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import struct
from collections.abc import Mapping
from pathlib import Path

from sealstream.errors import CheckpointError, SpecError

KEY_ENV = "SEALSTREAM_ENCRYPTION_KEY"
KEY_FILE_ENV = "SEALSTREAM_ENCRYPTION_KEY_FILE"

MAGIC = b"SSENC\x00\r\n"
VERSION = 1
KEY_BYTES = 32
KEY_ID_BYTES = 8
NONCE_BYTES = 12
TAG_BYTES = 16
_FIELDS = struct.Struct(">8sB8s12sQ")
CHECK_BYTES = 4
HEADER_BYTES = _FIELDS.size + CHECK_BYTES  # 41
OVERHEAD = HEADER_BYTES + TAG_BYTES

ENCRYPTED_WITHOUT_KEY = "ENCRYPTED_WITHOUT_KEY"
KEY_MISMATCH = "KEY_MISMATCH"
DECRYPTION_FAILED = "DECRYPTION_FAILED"
TRUNCATED = "FILE_TRUNCATED"
PLAINTEXT_WHEN_ENCRYPTED = "PLAINTEXT_WHEN_ENCRYPTED"

#: default of ``LocalCheckpointStore(encryption_key=...)``: read the environment
FROM_ENV: object = object()

_HEX = re.compile(r"[0-9a-fA-F]{64}")


class EnvelopeError(CheckpointError):
    """A checkpoint file cannot be decrypted; ``reason`` is the guard's reason code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def key_id(key: bytes) -> bytes:
    """The key's public identifier: the first 8 bytes of its SHA-256."""
    return hashlib.sha256(key).digest()[:KEY_ID_BYTES]


def parse_key(text: str | bytes, source: str) -> bytes:
    """A 32-byte key from 64 hex digits or base64 (or 32 raw bytes from a file)."""
    raw = text if isinstance(text, bytes) else text.encode()
    stripped = raw.strip()
    if _HEX.fullmatch(stripped.decode("ascii", errors="replace")):
        return bytes.fromhex(stripped.decode())
    try:
        decoded = base64.b64decode(stripped, validate=True)
    except (binascii.Error, ValueError):
        decoded = b""
    if len(decoded) == KEY_BYTES:
        return decoded
    if isinstance(text, bytes) and len(text) == KEY_BYTES:
        return text  # a key file holding the 32 raw bytes
    raise SpecError(
        f"{source} is not a valid encryption key: expected 32 bytes written as 64 hex "
        "digits or as base64 (e.g. the output of `openssl rand -hex 32`)"
    )


def encryption_key(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The encryption key configured in the environment, or None.

    Raises SpecError when a key is set but malformed, when both variables are set,
    or when the key file cannot be read.
    """
    env = os.environ if environ is None else environ
    val = env.get(KEY_ENV)
    path = env.get(KEY_FILE_ENV)
    if val and path:
        raise SpecError(f"set only one of {KEY_ENV} and {KEY_FILE_ENV}, not both")
    if val:
        return parse_key(val, KEY_ENV)
    if path:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise SpecError(
                f"{KEY_FILE_ENV}={path}: cannot read the key file "
                f"({exc.strerror or exc})"
            ) from None
        return parse_key(data, f"{KEY_FILE_ENV}={path}")
    return None


def envelope_key_id(data: bytes) -> bytes | None:
    """The key id an envelope names in its header (unauthenticated: only which key to
    try), or None when ``data`` is not an envelope or is cut within its header."""
    if not is_envelope(data) or len(data) < _FIELDS.size:
        return None
    return bytes(_FIELDS.unpack_from(data)[2])


def is_envelope(data: bytes) -> bool:
    """Whether ``data`` starts like an encrypted checkpoint file."""
    return data[: len(MAGIC)] == MAGIC


def _check(fields: bytes) -> bytes:
    return hashlib.sha256(fields).digest()[:CHECK_BYTES]


def encrypt(key: bytes, plaintext: bytes, context: str) -> bytes:
    """Seal ``plaintext`` for the file at ``context`` (its path under the root)."""
    if len(key) != KEY_BYTES:
        raise ValueError("AES-256-GCM needs a 32-byte key")
    nonce = os.urandom(NONCE_BYTES)
    fields = _FIELDS.pack(MAGIC, VERSION, key_id(key), nonce, len(plaintext))
    header = fields + _check(fields)
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # only when encrypting

    body = AESGCM(key).encrypt(nonce, plaintext, header + context.encode())
    return header + body


def decrypt(key: bytes | None, data: bytes, context: str) -> bytes:
    """Open an envelope written by :func:`encrypt` for ``context``.

    Raises :class:`EnvelopeError` with a reason code; never returns unauthenticated bytes.
    """
    if not is_envelope(data):
        raise EnvelopeError(
            PLAINTEXT_WHEN_ENCRYPTED,
            f"{context} is not encrypted but an encryption key is configured "
            "(plaintext checkpoints are refused)",
        )
    if len(data) < HEADER_BYTES:
        raise EnvelopeError(TRUNCATED, f"{context} is truncated (within its header)")
    _magic, version, kid, nonce, length = _FIELDS.unpack_from(data)
    if key is None:
        raise EnvelopeError(
            ENCRYPTED_WITHOUT_KEY,
            f"{context} is encrypted (key id {kid.hex()}) but neither {KEY_ENV} nor "
            f"{KEY_FILE_ENV} is set",
        )
    if data[_FIELDS.size:HEADER_BYTES] != _check(data[:_FIELDS.size]):
        raise EnvelopeError(DECRYPTION_FAILED, f"{context}: encryption header is damaged")
    if version != VERSION:
        raise EnvelopeError(
            DECRYPTION_FAILED, f"{context}: unknown encryption envelope version {version}"
        )
    if kid != key_id(key):
        raise EnvelopeError(
            KEY_MISMATCH,
            f"{context} was encrypted with another key (key id {kid.hex()}, the configured "
            f"key's id is {key_id(key).hex()})",
        )
    body = data[HEADER_BYTES:]
    if len(body) < length + TAG_BYTES:
        raise EnvelopeError(
            TRUNCATED,
            f"{context} is truncated ({len(body)} of {length + TAG_BYTES} encrypted bytes)",
        )
    if len(body) != length + TAG_BYTES:
        raise EnvelopeError(
            DECRYPTION_FAILED, f"{context} has {len(body) - length - TAG_BYTES} extra bytes"
        )
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        return AESGCM(key).decrypt(nonce, body, data[:HEADER_BYTES] + context.encode())
    except InvalidTag:
        raise EnvelopeError(
            DECRYPTION_FAILED,
            f"{context} does not decrypt (altered, or moved from another checkpoint or file)",
        ) from None
