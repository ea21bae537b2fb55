"""Where the emission log's leaves are kept: immutable, content-addressed segments shared
between checkpoints, and a short tail in each checkpoint's ``receipts.json``.

The log (:mod:`.emission_log`) only ever grows. Its leaves, oldest first, are cut into
runs of :data:`SEGMENT_LEAVES`; each full run is a **segment**, a blob outside every
checkpoint::

    log/seg-<SHA-256 of its bytes>.json    [[epoch, count, root], ...]   (compact JSON)

written create-if-absent before the manifest that names it is published
(:meth:`~sealstream.checkpoint.stores.CheckpointStore.write_shared`). A checkpoint's
``receipts.json`` names the segments in order (:data:`SEGMENTS_KEY`: their hashes) and
holds the leaves after the last full one (``log``, fewer than :data:`SEGMENT_LEAVES`).
``receipts.json`` is bound by its SHA-256 in the signed manifest and each segment by
its name, so the signature covers every leaf; the guard then checks the whole log
against the signed head as before.

So a checkpoint writes only what is new: at most one segment (when the tail fills
up) and a tail of under ``SEGMENT_LEAVES`` leaves (about 110 bytes each), whatever
the log's length; ``receipts.json`` grows by 71 bytes per segment name, 1,024 epochs
each (the 8 MiB bound on it is reached after about 120 million result-bearing epochs).
Every later checkpoint names every earlier segment, so deleting a checkpoint never
makes a segment unneeded: retention deletes none (an orphan can only come from a
rejected checkpoint whose log was abandoned: it is kept, as the rejected checkpoint
is, as evidence).

A ``receipts.json`` without :data:`SEGMENTS_KEY` (written before segments) holds the
whole log inline in ``log`` and reads as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from sealstream.checkpoint import emission_log
from sealstream.checkpoint.manifest import load_json

#: how many leaves a segment holds (a power of two: a full segment is one subtree of
#: the log's RFC 6962 tree); :data:`LEAVES_ENV` changes it for the writer (readers take
#: segments of any length)
SEGMENT_LEAVES = 1024
LEAVES_ENV = "SEALSTREAM_LOG_SEGMENT_LEAVES"
#: the member of ``receipts.json`` naming the log's segments (SHA-256 hex), oldest first
SEGMENTS_KEY = "log_segments"
SEGMENTS_DIR = "log"
_HEX = re.compile(r"[0-9a-f]{64}")

#: a segment named by a checkpoint is not in the store (PARTIAL_CHECKPOINT_REJECT)
MISSING = "LOG_SEGMENT_MISSING"
#: a segment's bytes are not the ones its name hashes, or not a run of leaves
#: (INCONSISTENT_STATE)
MISMATCH = "LOG_SEGMENT_MISMATCH"


class SegmentError(ValueError):
    """A segment a checkpoint names cannot be used: ``code`` is :data:`MISSING` or
    :data:`MISMATCH`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def segment_name(sha256_hex: str) -> str:
    """The blob name of the segment whose bytes hash to ``sha256_hex``."""
    return f"{SEGMENTS_DIR}/seg-{sha256_hex}.json"


def encode(entries: list[Any]) -> bytes:
    """A segment's bytes: its leaves as compact JSON."""
    return json.dumps(entries, separators=(",", ":")).encode()


def split(entries: list[Any], known: list[tuple[str, int]]
          ) -> tuple[list[tuple[str, int]], list[tuple[str, bytes]], list[Any]]:
    """Cut the log ``entries`` for a checkpoint. ``known``: the segments (hash, leaf
    count) already in the store holding a prefix of ``entries`` (what the previous
    checkpoint of this log named). Returns every segment of the log as (hash, count),
    the new ones as ``(hash, bytes)`` to write, and the tail (fewer than
    :func:`segment_leaves` leaves)."""
    k = segment_leaves()
    names: list[tuple[str, int]] = []
    pos = 0
    for sha, n in known:
        if pos + n > len(entries):
            break
        names.append((sha, n))
        pos += n
    new: list[tuple[str, bytes]] = []
    while len(entries) - pos >= k:
        data = encode(entries[pos:pos + k])
        sha = hashlib.sha256(data).hexdigest()
        names.append((sha, k))
        new.append((sha, data))
        pos += k
    return names, new, entries[pos:]


def segment_leaves() -> int:
    """:data:`SEGMENT_LEAVES`, or the power of two :data:`LEAVES_ENV` gives (ValueError
    naming it when it is not one)."""
    text = os.environ.get(LEAVES_ENV)
    if not text:
        return SEGMENT_LEAVES
    try:
        k = int(text)
    except ValueError:
        k = 0
    if k < 1 or k & (k - 1):
        raise ValueError(f"{LEAVES_ENV}={text!r}: not a power of two")
    return k


# parsed segments, by hash: a segment is immutable, so once its bytes hashed to its
# name they parse the same forever (the bytes are still read and hashed every time, so
# a segment deleted or altered in the store is always seen)
_parsed: OrderedDict[str, list[Any]] = OrderedDict()
_lock = threading.Lock()
_CACHED = 512


def _decode(sha: str, data: bytes) -> list[Any]:
    if hashlib.sha256(data).hexdigest() != sha:
        raise SegmentError(MISMATCH, f"emission log segment {segment_name(sha)} does not "
                           "match its SHA-256 (altered)")
    with _lock:
        hit = _parsed.get(sha)
        if hit is not None:
            _parsed.move_to_end(sha)
            return hit
    try:
        entries = load_json(data, f"emission log segment {segment_name(sha)}")
        if not isinstance(entries, list) or not entries:
            raise ValueError("it is not a list of leaves")
        for e in entries:
            emission_log.leaf_of(e)
    except ValueError as exc:
        raise SegmentError(MISMATCH, f"emission log segment {segment_name(sha)}: {exc}"
                           ) from None
    with _lock:
        _parsed[sha] = entries
        while len(_parsed) > _CACHED:
            _parsed.popitem(last=False)
    return entries


def segments_of(receipts: dict[str, Any]) -> list[str]:
    """The segment hashes ``receipts.json`` names (ValueError when malformed)."""
    refs = receipts.get(SEGMENTS_KEY, [])
    if not isinstance(refs, list) or not all(isinstance(r, str) and _HEX.fullmatch(r)
                                             for r in refs):
        raise SegmentError(MISMATCH, f"receipts' {SEGMENTS_KEY} is not a list of SHA-256 "
                           "hashes")
    return list(refs)


def resolve(receipts: dict[str, Any], read: Callable[[str], bytes | None]
            ) -> tuple[list[Any], list[tuple[str, int]]]:
    """The whole log of a checkpoint whose ``receipts.json`` (verified against its
    manifest) is ``receipts``, and its segments as (hash, leaf count): the segments'
    leaves, read with ``read(name)`` (the plaintext, None when absent) and each checked
    against its name, then the tail. SegmentError when a segment is missing or altered;
    a malformed tail is returned as it is (the guard judges it)."""
    out: list[Any] = []
    parts: list[tuple[str, int]] = []
    for sha in segments_of(receipts):
        data = read(segment_name(sha))
        if data is None:
            raise SegmentError(MISSING, f"emission log segment {segment_name(sha)} is "
                               "missing")
        leaves = _decode(sha, data)
        parts.append((sha, len(leaves)))
        out.extend(leaves)
    tail = receipts.get(emission_log.LEAVES_KEY, [])
    return (out + tail if isinstance(tail, list) else tail), parts


def names_in(receipts: Any) -> list[str]:
    """The blob names of the segments ``receipts`` names (none when malformed)."""
    if not isinstance(receipts, dict):
        return []
    try:
        return [segment_name(s) for s in segments_of(receipts)]
    except SegmentError:
        return []
