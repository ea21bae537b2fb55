"""Proofs of emission through the emission log (format 2): result -> epoch root -> log
root signed by a checkpoint's manifest.

A format-2 proof is one JSON object::

    {"receipt_proof": 2, "pipeline": P, "checkpoint": N, "epoch": E, "id": ID,
     "index": I, "count": C, "path": B64, "epoch_root": R,
     "log_index": M, "log_size": S, "log_path": B64}

* ``index``/``count``/``path``: result ``ID`` is leaf ``I`` of the ``C`` sorted result
  ids of epoch ``E``, whose Merkle root is ``R`` (:mod:`.receipts`);
* ``log_index``/``log_size``/``log_path``: the leaf ``{"count": C, "epoch": E, "root":
  R}`` is leaf ``M`` of the emission log of size ``S`` (:mod:`.emission_log`), whose root
  checkpoint ``N``'s manifest signs (``emission_log``).

Checking it needs only that manifest and the trusted public key (or HMAC key): it
holds for as long as any checkpoint whose log includes epoch ``E`` is kept, whatever
older checkpoints retention removed. Its size grows with log2 of the epoch's results
plus log2 of the number of epochs: about 1.5 KB for 10 million results.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from sealstream.checkpoint import emission_log as log
from sealstream.checkpoint import receipts as trees

FORMAT = 2


def result_ids(ids: pl.DataFrame) -> pl.Series:
    """The sorted result-id texts (``key|kint|window_start|window_end``) of identity
    columns read back from a results sink (:meth:`Sink.read_ids`)."""
    return ids.select(pl.concat_str(
        [pl.col("key"), pl.col("__kint").cast(pl.String), pl.col("window_start")
         .cast(pl.String), pl.col("window_end").cast(pl.String)], separator="|"
    ).alias("id")).sort("id")["id"]


def log_index(entries: list[Any], epoch: int) -> int | None:
    """Where epoch ``epoch`` is in the log's entries (None when it is not)."""
    for i, e in enumerate(entries):
        if isinstance(e, list) and e and e[0] == epoch:
            return i
    return None


class EpochProver:
    """Proofs for the results of one epoch against one signed log: the epoch's tree is
    built once (columnar), each proof is then a list lookup."""

    def __init__(self, pipeline: str, cid: int, entries: list[Any], epoch: int,
                 ids: pl.Series) -> None:
        m = log_index(entries, epoch)
        if m is None:
            raise ValueError(f"epoch {epoch} is not in checkpoint {cid}'s emission log")
        root = trees.root(ids)
        if entries[m][1] != ids.len() or entries[m][2] != root:
            raise ValueError(f"epoch {epoch}'s result ids do not give the root the emission "
                             "log holds for it (its ids or output were altered)")
        hashes = log.leaf_hashes(entries)
        self.pipeline, self.cid, self.epoch, self.ids = pipeline, cid, epoch, ids
        self.root, self.m, self.n = root, m, len(hashes)
        self.log_path = trees._b64([h.hex() for h in log.inclusion_path(hashes, m)])
        self.tree = trees.levels(ids)  # Series: a proof gathers one hash per level

    def index_of(self, result_id: str) -> int | None:
        hit = self.ids.to_frame("id").with_row_index("i").filter(pl.col("id") == result_id)
        return int(hit["i"][0]) if hit.height else None

    def proof(self, index: int) -> dict[str, Any]:
        return {"receipt_proof": FORMAT, "pipeline": self.pipeline, "checkpoint": self.cid,
                "epoch": self.epoch, "id": str(self.ids[index]), "index": index,
                "count": self.ids.len(), "path": trees._b64(self._path(index)),
                "epoch_root": self.root, "log_index": self.m, "log_size": self.n,
                "log_path": self.log_path}

    def _path(self, index: int) -> list[str]:
        out: list[str] = []
        i = index
        for level in self.tree[:-1]:
            sib = i ^ 1
            if sib < level.len():
                out.append(str(level[sib]))
            i //= 2
        return out

    def proofs(self) -> list[dict[str, Any]]:
        return [self.proof(i) for i in range(self.ids.len())]


def verify(proof: dict[str, Any], manifest: Any, key: bytes | None) -> trees.ProofCheck:
    """Check a format-2 proof against checkpoint ``proof["checkpoint"]``'s manifest."""
    def no(reason: str, message: str) -> trees.ProofCheck:
        return trees.ProofCheck(False, reason, message)

    try:
        cid, epoch = int(proof["checkpoint"]), int(proof["epoch"])
        rid, index, count = str(proof["id"]), int(proof["index"]), int(proof["count"])
        siblings = trees._unb64(str(proof["path"]))
        epoch_root = str(proof["epoch_root"])
        m, n = int(proof["log_index"]), int(proof["log_size"])
        log_path = [bytes.fromhex(h) for h in trees._unb64(str(proof["log_path"]))]
    except (KeyError, TypeError, ValueError) as exc:
        return no("PROOF_MALFORMED", f"proof has a malformed field ({exc})")
    problem = trees.manifest_problem(proof, manifest, key, cid)
    if problem is not None:
        return problem
    signed = manifest.get(log.LOG_FIELD)
    if not isinstance(signed, dict):
        return no("NO_EMISSION_LOG", f"checkpoint {cid} predates the emission log")
    if signed.get("size") != n:
        return no("OTHER_LOG", f"checkpoint {cid} signs a log of {signed.get('size')} epochs, "
                  f"the proof says {n}")
    if not trees.verify_path(rid, index, count, siblings, epoch_root):
        return no("PROOF_MISMATCH", f"result {rid!r} is not under epoch {epoch}'s root")
    leaf = log.hash_leaf(log.leaf_bytes(epoch, count, epoch_root))
    try:
        signed_root = bytes.fromhex(str(signed.get("root")))
    except ValueError:
        return no("PROOF_MISMATCH", f"checkpoint {cid}'s log root is not hex")
    if not log.verify_inclusion(leaf, m, n, log_path, signed_root):
        return no("PROOF_MISMATCH", f"epoch {epoch}'s root is not in checkpoint {cid}'s "
                  "signed emission log")
    sig = manifest["signature"]
    who = f"{sig.get('alg')} key {sig['key_id']}" if "key_id" in sig else str(sig.get("alg"))
    return trees.ProofCheck(True, "OK", f"result {rid!r} was emitted in epoch {epoch} (leaf "
                            f"{m} of the emission log signed by checkpoint {cid}, {who})")


def consistency(old: Any, new: Any, new_entries: Any) -> dict[str, Any]:
    """Whether checkpoint ``new``'s log (its manifest and its verified ``receipts.json``
    entries) extends checkpoint ``old``'s signed log: the RFC 6962 consistency proof
    from ``new``'s leaves, checked against both signed heads. Manifests must have been
    verified by the caller."""
    o, n = old.get(log.LOG_FIELD), new.get(log.LOG_FIELD)
    if not isinstance(o, dict) or not isinstance(n, dict):
        return {"ok": False, "reason": "NO_EMISSION_LOG",
                "message": "a checkpoint predates the emission log"}
    hashes = log.leaf_hashes(new_entries)
    if log.head(new_entries) != n:
        return {"ok": False, "reason": "EMISSION_LOG_MISMATCH",
                "message": f"checkpoint {new.get('id')}'s log does not match its signed head"}
    m = int(o["size"])
    if m > len(hashes):
        return {"ok": False, "reason": "LOG_SHRANK",
                "message": f"checkpoint {new.get('id')}'s log ({len(hashes)} epochs) is shorter "
                           f"than checkpoint {old.get('id')}'s ({m})"}
    path = log.consistency_path(hashes, m)
    ok = log.verify_consistency(m, len(hashes), bytes.fromhex(str(o["root"])),
                                bytes.fromhex(str(n["root"])), path)
    return {"ok": ok, "reason": "OK" if ok else "NOT_AN_EXTENSION",
            "old": {"checkpoint": old.get("id"), **o}, "new": {"checkpoint": new.get("id"), **n},
            "proof": [h.hex() for h in path],
            "message": (f"checkpoint {new.get('id')}'s log ({len(hashes)} epochs) extends "
                        f"checkpoint {old.get('id')}'s ({m} epochs): nothing emitted was "
                        "removed or rewritten") if ok else
                       (f"checkpoint {new.get('id')}'s log does not extend checkpoint "
                        f"{old.get('id')}'s: an epoch's receipts were removed or rewritten")}
