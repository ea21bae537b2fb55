"""Merkle trees over an epoch's result ids: emission receipts with inclusion proofs.

An epoch's receipt for its results is the root of a binary Merkle tree whose leaves
are the epoch's result ids (``key|kint|window_start|window_end``, the identity the
receipts' digest hashes), sorted bytewise. Hashes are SHA-256, as lowercase hex:

* leaf ``i``: ``sha256("0" + id_i)``
* node: ``sha256("1" + left_hex + right_hex)`` (hex text of the two children)
* a level of odd length promotes its last node unchanged to the next level (no
  duplication, so no two leaf sets share a root by repeating a leaf)
* the root of an epoch with no results: ``sha256("")``

The prefixes "0" and "1" keep a leaf from being passed off as an inner node.

Building is columnar: each level is one Polars expression over the whole column
(:mod:`polars_hash`'s SHA-256), never a Python loop per result. Checking a proof is
a handful of :mod:`hashlib` calls (:func:`verify_path`).

A proof of leaf ``index`` among ``count`` leaves is the list of sibling hashes from
the leaf up; which side each sibling is on, and which levels have no sibling
(promoted nodes), follow from ``index`` and ``count`` alone, so the proof carries
only the hashes: 20 of them (640 bytes) for an epoch of a million results.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import polars_hash as plh

from sealstream.checkpoint.manifest import ROOTS_FIELD as ROOTS_FIELD
from sealstream.checkpoint.manifest import signature_ok
from sealstream.state.codec import decode_table, encode_table

EMPTY_ROOT = hashlib.sha256(b"").hexdigest()


def leaf_level(ids: pl.Series) -> pl.Series:
    """The leaf hashes (hex) of ``ids`` (already sorted), in order."""
    frame = pl.DataFrame({"id": ids.cast(pl.String)})
    return frame.select(
        plh.concat_str(pl.lit("0"), pl.col("id")).chash.sha2_256().alias("h")
    )["h"]


def next_level(level: pl.Series) -> pl.Series:
    """The parents of ``level``: pairs hashed, an odd last node promoted."""
    n = level.len()
    pairs = n // 2
    frame = pl.DataFrame({
        "l": level.gather_every(2).head(pairs),
        "r": level.gather_every(2, offset=1).head(pairs),
    })
    up = frame.select(
        plh.concat_str(pl.lit("1"), pl.col("l"), pl.col("r")).chash.sha2_256().alias("h")
    )["h"]
    if n % 2:
        up = pl.concat([up, level.tail(1).alias("h")])
    return up


def levels(ids: pl.Series) -> list[pl.Series]:
    """Every level of the tree over sorted ``ids``, leaves first, root last."""
    if ids.len() == 0:
        return [pl.Series("h", [EMPTY_ROOT])]
    out = [leaf_level(ids)]
    while out[-1].len() > 1:
        out.append(next_level(out[-1]))
    return out


def root(ids: pl.Series) -> str:
    """The Merkle root (hex) over sorted ``ids``."""
    return str(levels(ids)[-1][0])


def leaf_hashes(ids: pl.Expr) -> pl.Expr:
    """The leaf hash (hex) of each id: a leaf does not depend on the order of the
    ids, so it can be computed as results are staged, before an epoch is sorted."""
    return plh.concat_str(pl.lit("0"), ids).chash.sha2_256()


def root_of_leaves(leaves: pl.Series) -> str:
    """The Merkle root (hex) over leaf hashes already in the sorted ids' order (as
    :func:`leaf_level` gives them): ``root(ids) == root_of_leaves(leaf_level(ids))``."""
    if leaves.len() == 0:
        return EMPTY_ROOT
    level = leaves
    while level.len() > 1:
        level = next_level(level)
    return str(level[0])


def path(tree: list[list[str]], index: int) -> list[str]:
    """The sibling hashes (hex) proving leaf ``index``, from the leaf up; ``tree`` is
    :func:`levels` as lists (``[s.to_list() for s in levels(ids)]``)."""
    out: list[str] = []
    i = index
    for level in tree[:-1]:
        sib = i ^ 1
        if sib < len(level):
            out.append(level[sib])
        i //= 2
    return out


def joined_digest(sorted_ids: pl.Series) -> str:
    """``sha256("\\n".join(sorted_ids))`` (the receipts' digest), hashed straight from
    the joined column's Arrow buffer: no Python string of every id, no second copy."""
    joined = sorted_ids.cast(pl.String).str.join("\n").to_arrow(
        compat_level=pl.CompatLevel.oldest())
    bufs = joined.buffers()
    assert bufs[1] is not None
    offsets = np.frombuffer(bufs[1], dtype=np.int64)
    lo, hi = int(offsets[joined.offset]), int(offsets[joined.offset + 1])
    if hi == lo or bufs[2] is None:
        return hashlib.sha256(b"").hexdigest()
    return hashlib.sha256(memoryview(bufs[2])[lo:hi]).hexdigest()


def leaf_hash(result_id: str) -> str:
    return hashlib.sha256(("0" + result_id).encode()).hexdigest()


def verify_path(result_id: str, index: int, count: int, siblings: list[str],
                expected_root: str) -> bool:
    """Whether ``siblings`` prove that ``result_id`` is leaf ``index`` of the ``count``
    leaves whose root is ``expected_root``."""
    if count < 1 or not 0 <= index < count:
        return False
    h = leaf_hash(result_id)
    i, n, k = index, count, 0
    while n > 1:
        sib = i ^ 1
        if sib < n:
            if k >= len(siblings):
                return False
            s = siblings[k]
            k += 1
            pair = h + s if i % 2 == 0 else s + h
            h = hashlib.sha256(("1" + pair).encode()).hexdigest()
        i //= 2
        n = (n + 1) // 2
    return k == len(siblings) and h == expected_root


# --------------------------------------------------------------------------- in checkpoints
#: the manifest field that signs the epoch's Merkle root (:data:`ROOTS_FIELD`):
#: ``{"epoch": E, "results": {"count": N, "root": HEX}}``. Checkpoints written before
#: Merkle receipts lack it.
PROOF_FORMAT = 1


def roots_entry(receipt: dict[str, Any]) -> dict[str, Any]:
    """The manifest's :data:`ROOTS_FIELD` for an epoch's receipt."""
    res = receipt.get("results", {})
    return {"epoch": receipt["epoch"],
            "results": {"count": int(res.get("count", 0)), "root": res.get("root", EMPTY_ROOT)}}


def encode_ids(sorted_ids: pl.Series) -> bytes:
    """The leaves' file (``receipt-ids.arrow``): the epoch's sorted result ids."""
    return encode_table(pl.DataFrame({"id": sorted_ids.cast(pl.String)}))


def decode_ids(data: bytes) -> pl.Series:
    frame, _ = decode_table(data)
    if frame.columns != ["id"] or frame.schema["id"] != pl.String:
        raise ValueError("receipt ids file does not hold one string column 'id'")
    return frame["id"]


# --------------------------------------------------------------------------- proofs
def _b64(hexes: list[str]) -> str:
    return base64.urlsafe_b64encode(b"".join(bytes.fromhex(h) for h in hexes)).decode().rstrip(
        "=")


def _unb64(text: str) -> list[str]:
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if len(raw) % 32:
        raise ValueError("path is not a whole number of SHA-256 hashes")
    return [raw[i:i + 32].hex() for i in range(0, len(raw), 32)]


def make_proof(pipeline: str, cid: int, epoch: int, result_id: str, index: int, count: int,
               siblings: list[str]) -> dict[str, Any]:
    """The JSON of one inclusion proof (compact: at most ~1 KB for a million leaves).

    ``{"receipt_proof": 1, "pipeline": P, "checkpoint": N, "epoch": E, "id": ID,
    "index": I, "count": C, "path": B64}``: ``path`` is the sibling hashes from the
    leaf up, raw 32 bytes each, concatenated, base64url without padding."""
    return {"receipt_proof": PROOF_FORMAT, "pipeline": pipeline, "checkpoint": cid,
            "epoch": epoch, "id": result_id, "index": index, "count": count,
            "path": _b64(siblings)}


def proof_bytes(proof: dict[str, Any]) -> bytes:
    return json.dumps(proof, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class ProofCheck:
    ok: bool
    reason: str
    message: str


def manifest_problem(proof: dict[str, Any], manifest: Any, key: bytes | None,
                     cid: int) -> ProofCheck | None:
    """Why ``manifest`` cannot vouch for ``proof`` (of checkpoint ``cid``), whatever
    the proof's format: not a JSON object, a signature that does not verify under
    ``key``, another checkpoint or pipeline. None when it can."""
    if not isinstance(manifest, dict):
        return ProofCheck(False, "MANIFEST_UNREADABLE", "manifest is not a JSON object")
    ok, code = signature_ok(manifest, key)
    if not ok:
        return ProofCheck(False, code, f"the manifest's signature does not verify ({code})")
    if manifest.get("id") != cid or manifest.get("pipeline") != proof.get("pipeline"):
        return ProofCheck(False, "OTHER_CHECKPOINT",
                          f"the proof is for checkpoint {cid} of pipeline "
                          f"{proof.get('pipeline')!r}, the manifest is checkpoint "
                          f"{manifest.get('id')} of {manifest.get('pipeline')!r}")
    return None


def verify_proof(proof: Any, manifest: Any, key: bytes | None) -> ProofCheck:
    """Check an inclusion proof against a checkpoint manifest (parsed), offline: the
    manifest's signature under ``key``, that it is the checkpoint and epoch the proof
    names, and the path up to the signed root. Reads no state."""
    def no(reason: str, message: str) -> ProofCheck:
        return ProofCheck(False, reason, message)

    if isinstance(proof, dict) and proof.get("receipt_proof") == 2:
        from sealstream.checkpoint import proofs  # through the emission log

        return proofs.verify(proof, manifest, key)
    if not isinstance(proof, dict) or proof.get("receipt_proof") != PROOF_FORMAT:
        return no("PROOF_MALFORMED", "not a sealstream receipt proof (format 1 or 2)")
    try:
        cid, epoch = int(proof["checkpoint"]), int(proof["epoch"])
        rid, index, count = str(proof["id"]), int(proof["index"]), int(proof["count"])
        siblings = _unb64(str(proof["path"]))
    except (KeyError, TypeError, ValueError) as exc:
        return no("PROOF_MALFORMED", f"proof has a malformed field ({exc})")
    problem = manifest_problem(proof, manifest, key, cid)
    if problem is not None:
        return problem
    roots = manifest.get(ROOTS_FIELD)
    if not isinstance(roots, dict):
        return no("NO_RECEIPT_ROOTS", f"checkpoint {cid} predates Merkle receipts: its "
                  "manifest signs no receipt root, so no result of it can be proven")
    res = roots.get("results") if isinstance(roots.get("results"), dict) else {}
    assert isinstance(res, dict)
    if roots.get("epoch") != epoch or res.get("count") != count:
        return no("OTHER_EPOCH", f"checkpoint {cid} signs epoch {roots.get('epoch')} with "
                  f"{res.get('count')} results, the proof says epoch {epoch} with {count}")
    if not verify_path(rid, index, count, siblings, str(res.get("root"))):
        return no("PROOF_MISMATCH", f"result {rid!r} is not proven by checkpoint {cid}'s "
                  f"signed root for epoch {epoch}")
    return ProofCheck(True, "OK", f"result {rid!r} was emitted in epoch {epoch} "
                      f"(checkpoint {cid}, signature {manifest['signature']['alg']} "
                      f"{str(manifest['signature']['value'])[:16]}...)")
