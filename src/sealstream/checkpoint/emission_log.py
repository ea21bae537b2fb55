"""The emission log: an append-only Merkle log of every epoch's receipt root.

Each checkpoint whose epoch committed results appends one leaf for it, ``{"count": C,
"epoch": E, "root": R}`` (its canonical JSON: the epoch's number, how many results it
committed and the Merkle root over their ids, :mod:`sealstream.checkpoint.receipts`), and its signed
manifest commits to the log's size and root (:data:`LOG_FIELD`). The leaves travel
forward: every checkpoint's ``receipts.json`` holds the whole list (``"log"``), so
pruning old checkpoints loses no epoch root.

The tree is the one of RFC 6962 (Certificate Transparency), section 2.1, with
SHA-256: leaf hash ``H(0x00 || leaf)``, node hash ``H(0x01 || left || right)``, the
left subtree of ``n`` leaves holding the largest power of two below ``n``; the root
of no leaves is ``H("")``. So:

* an **inclusion proof** of leaf ``m`` in a log of size ``n`` is ``ceil(log2 n)``
  hashes at most (:func:`inclusion_path`, :func:`verify_inclusion`);
* a **consistency proof** between sizes ``m <= n`` shows that the first ``m`` leaves
  of the later log are the earlier log (:func:`consistency_path`,
  :func:`verify_consistency`): nothing emitted was removed or rewritten.

The verification functions follow RFC 9162 sections 2.1.3.2 and 2.1.4.2. All of this is
a few hashes per epoch, never per result.
"""

from __future__ import annotations

import hashlib
import json
import operator
import threading
from typing import Any

#: the manifest field that signs the log: ``{"size": N, "root": HEX}``
LOG_FIELD = "emission_log"
#: the member of ``receipts.json`` holding the log's leaves, oldest first
LEAVES_KEY = "log"

EMPTY = hashlib.sha256(b"").digest()


def leaf_bytes(epoch: int, count: int, root: str) -> bytes:
    """The log leaf of one epoch's receipt."""
    return json.dumps({"count": int(count), "epoch": int(epoch), "root": str(root)},
                      sort_keys=True, separators=(",", ":")).encode()


def leaf_of(entry: Any) -> bytes:
    """The leaf of an entry of ``receipts.json``'s log, ``[epoch, count, root]``
    (ValueError when it is not one)."""
    if not isinstance(entry, list) or len(entry) != 3 or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in entry[:2]) \
            or not isinstance(entry[2], str):
        raise ValueError(f"emission log entry {str(entry)[:80]!r} is not [epoch, count, root]")
    return leaf_bytes(entry[0], entry[1], entry[2])


def hash_leaf(leaf: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + leaf).digest()


def hash_node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def root_of(hashes: list[bytes]) -> bytes:
    """The Merkle tree hash over leaf hashes (RFC 6962 MTH), iteratively: pairs from the
    left, an odd last node carried up, which gives the same tree as the recursive split."""
    if not hashes:
        return EMPTY
    level, sha = list(hashes), hashlib.sha256
    while len(level) > 1:
        up = [sha(b"\x01" + level[i] + level[i + 1]).digest()
              for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            up.append(level[-1])
        level = up
    return level[0]


def _mth(hashes: list[bytes]) -> bytes:
    return root_of(hashes)


def inclusion_path(hashes: list[bytes], m: int) -> list[bytes]:
    """RFC 6962 PATH(m, D[n]): the audit path of leaf ``m`` among ``hashes``."""
    n = len(hashes)
    if not 0 <= m < n:
        raise ValueError(f"leaf {m} is not in a log of {n}")
    if n == 1:
        return []
    k = _split(n)
    if m < k:
        return inclusion_path(hashes[:k], m) + [_mth(hashes[k:])]
    return inclusion_path(hashes[k:], m - k) + [_mth(hashes[:k])]


def verify_inclusion(leaf_hash: bytes, m: int, n: int, path: list[bytes], root: bytes) -> bool:
    """Whether ``path`` proves that ``leaf_hash`` is leaf ``m`` of the log of size ``n``
    whose root is ``root`` (RFC 9162, 2.1.3.2)."""
    if not 0 <= m < n:
        return False
    fn, sn, r = m, n - 1, leaf_hash
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = hash_node(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = hash_node(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


def _subproof(m: int, hashes: list[bytes], complete: bool) -> list[bytes]:
    n = len(hashes)
    if m == n:
        return [] if complete else [_mth(hashes)]
    k = _split(n)
    if m <= k:
        return _subproof(m, hashes[:k], complete) + [_mth(hashes[k:])]
    return _subproof(m - k, hashes[k:], False) + [_mth(hashes[:k])]


def consistency_path(hashes: list[bytes], m: int) -> list[bytes]:
    """RFC 6962 PROOF(m, D[n]): that the log's first ``m`` leaves are a log of size m."""
    if not 0 <= m <= len(hashes):
        raise ValueError(f"size {m} is not within a log of {len(hashes)}")
    if m in (0, len(hashes)):
        return []
    return _subproof(m, hashes, True)


def verify_consistency(m: int, n: int, old_root: bytes, new_root: bytes,
                       path: list[bytes]) -> bool:
    """Whether ``path`` proves that the log of size ``n`` and root ``new_root`` extends
    the log of size ``m`` and root ``old_root`` (RFC 9162, 2.1.4.2)."""
    if m > n or m < 0:
        return False
    if m == n:
        return not path and old_root == new_root
    if m == 0:
        return not path and old_root == EMPTY
    if not path:
        return False
    proof = list(path)
    if m & (m - 1) == 0:  # m is a power of two: the old root is the first node
        proof.insert(0, old_root)
    fn, sn = m - 1, n - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = proof[0]
    for c in proof[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = hash_node(c, fr)
            sr = hash_node(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = hash_node(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == old_root and sr == new_root


# --------------------------------------------------------------------------- in checkpoints
_str_json = json.JSONEncoder().encode  # what json.dumps gives a str (ASCII-escaped)


def leaf_hashes(entries: Any) -> list[bytes]:
    """The leaf hashes of ``receipts.json``'s log (ValueError when malformed).

    The log is read whole by every check (tens of thousands of leaves in a long job), so
    an entry of exact types ``[int, int, str]`` gets its leaf from one %-format: the
    bytes :func:`leaf_bytes` gives (the keys in sorted order, no spaces, the root as
    JSON), without a ``json.dumps`` call per leaf; anything else goes through
    :func:`leaf_of`, which takes int subclasses and names what is malformed."""
    if not isinstance(entries, list):
        raise ValueError("the emission log is not a list")
    sha, enc = hashlib.sha256, _str_json
    out: list[bytes] = []
    append = out.append
    for e in entries:
        if type(e) is list and len(e) == 3:
            epoch, count, root = e
            if type(epoch) is int and type(count) is int and type(root) is str:
                append(sha(b'\x00{"count":%d,"epoch":%d,"root":%s}'
                           % (count, epoch, enc(root).encode())).digest())
                continue
        append(hash_leaf(leaf_of(e)))
    return out


# ------------------------------------------------------------- the log as it grows
class Frontier:
    """The roots of the perfect subtrees an RFC 6962 tree of ``size`` leaves is made of,
    left to right (their sizes: the binary digits of ``size``, largest first). A leaf is
    added in O(log n) hashes and the root read in O(log n), so a log that only grows is
    never hashed whole again: the tree of ``n = 2^a + r`` leaves (``0 < r < 2^a``) is
    ``node(perfect tree of the first 2^a, tree of the last r)``, hence the root is the
    perfect roots folded from the right."""

    __slots__ = ("size", "peaks")

    def __init__(self, size: int = 0, peaks: tuple[tuple[int, bytes], ...] = ()) -> None:
        self.size = size
        self.peaks = peaks  # (leaf count, root) of each perfect subtree, left to right

    def extended(self, hashes: list[bytes]) -> Frontier:
        """This frontier with the leaf hashes ``hashes`` added at the right."""
        peaks, sha = list(self.peaks), hashlib.sha256
        for h in hashes:
            n = 1
            while peaks and peaks[-1][0] == n:
                left = peaks.pop()[1]
                h = sha(b"\x01" + left + h).digest()
                n *= 2
            peaks.append((n, h))
        return Frontier(self.size + len(hashes), tuple(peaks))

    def root(self) -> bytes:
        if not self.peaks:
            return EMPTY
        acc = self.peaks[-1][1]
        for _, h in reversed(self.peaks[:-1]):
            acc = hash_node(h, acc)
        return acc


# Logs whose frontier is known: every check of a checkpoint reads its whole log (the
# writer's head, the guard's read-back of the same checkpoint, the next checkpoint's
# "extends its parent"), and the log of the next checkpoint is that one with a few
# leaves more. A new log reuses a known one as far as its entries are the very same
# objects (``is``, not ``==``: 1.0 or True equal 1 but are not leaves): the parsed
# segments of the store are shared by every read (log_segments), and the writer's list
# only grows. An entry read again from bytes is a new object and is hashed again, so
# what a store holds is always what is checked; at most the tail and the newest
# segment are hashed per check.
_known: list[tuple[list[Any], Frontier]] = []
_known_lock = threading.Lock()
_KNOWN = 4


def _frontier(entries: Any, size: int | None = None) -> Frontier:
    """The frontier of the first ``size`` (all) entries of the log ``entries``
    (ValueError when one of them is malformed)."""
    if not isinstance(entries, list):
        raise ValueError("the emission log is not a list")
    n = len(entries) if size is None else size
    same: list[Any] = []
    f = Frontier()
    with _known_lock:
        known = sorted(_known, key=lambda k: len(k[0]), reverse=True)
    for cand, cf in known:  # the longest known prefix; its last entry first (cheap)
        m = len(cand)
        if 0 < m <= n and cand[-1] is entries[m - 1] and all(map(operator.is_, entries,
                                                                  cand)):
            same, f = cand, cf
            break
    if f.size == n:
        return f
    fresh = entries[f.size:n]
    f = f.extended(leaf_hashes(fresh))
    with _known_lock:
        _known.append((same + fresh, f))
        del _known[:-_KNOWN]
    return f


def head(entries: Any) -> dict[str, Any]:
    """The manifest's :data:`LOG_FIELD` for the log ``entries``."""
    f = _frontier(entries)
    return {"size": f.size, "root": f.root().hex()}


def problem(entries: Any, signed: Any, epoch_entry: Any) -> str | None:
    """Why the log in ``receipts.json`` does not match the manifest (None when it does):
    its size and root must be the signed ones, and its last leaf the epoch's receipt
    root ``epoch_entry`` (the manifest's ``receipt_roots``)."""
    try:
        if head(entries) != signed:
            return "the emission log does not match the signed log root and size"
    except ValueError as exc:
        return str(exc)
    if isinstance(epoch_entry, dict):
        res = epoch_entry.get("results") if isinstance(epoch_entry.get("results"), dict) \
            else {}
        assert isinstance(res, dict)
        last = [epoch_entry.get("epoch"), res.get("count"), res.get("root")]
        if res.get("count") == 0:  # nothing committed: no leaf for this epoch
            if entries and isinstance(entries[-1], list) and entries[-1][:1] == last[:1]:
                return "the emission log has a leaf for an epoch that committed nothing"
        elif not entries or entries[-1] != last:
            return "the emission log's last leaf is not this epoch's receipt root"
    return None


def extends(entries: Any, parent_log: Any) -> str | None:
    """Why the log ``entries`` does not extend the parent's signed log (None when it
    does): the parent's size and root must be those of a prefix of it."""
    if not isinstance(parent_log, dict):
        return None  # a parent written before the log: nothing to extend
    if not isinstance(entries, list):
        return None  # judged by problem()
    try:
        size = int(parent_log["size"])
        n = len(entries)
        root = _frontier(entries, size).root().hex() if 0 <= size <= n else None
    except (KeyError, TypeError, ValueError):
        return None  # a malformed parent is judged on its own
    if root is None or root != parent_log.get("root"):
        return (f"its emission log ({n} epochs) does not extend its parent's "
                f"({size} epochs): an emitted epoch was removed or rewritten")
    return None
