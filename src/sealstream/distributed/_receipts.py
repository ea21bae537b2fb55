"""Per-worker receipts: the epoch's result ids stay on the workers.

The epoch's receipt (section 6 and :mod:`sealstream.checkpoint.receipts`) is the digest
and the Merkle root over the epoch's result ids sorted bytewise, and the checkpoint
keeps those sorted ids (``receipt-ids.arrow``, the leaves of inclusion proofs). With
the results staged by the workers (:mod:`._sinks`), the ids are built where the
results are:

1. every step, each key worker keeps the identities of the results it staged, per
   epoch (:class:`EpochIds`), and returns only their number and largest window end;
2. at a checkpoint, the coordinator asks each worker for its epoch's ids
   (:meth:`ShardWorker.take_receipt_ids`, an Arrow buffer in Ray's object store) and
   passes the references, unresolved, to one worker, the epoch's *receipt worker*
   (``epoch mod N``): it fetches every worker's ids worker to worker, sorts them once,
   and computes the digest, the root and the ids file (:func:`build`), returning
   only the count, digest and root;
3. the receipt worker writes the ids file into the checkpoint itself (create-if-absent,
   fenced, as a state part; with an SQLite store the coordinator takes the bytes and
   writes them, as it does the state's parts there), and the coordinator signs the
   root in the manifest.

The root is the single-process root over the same ids: it does not depend on the
worker count, the format of receipts and proofs is unchanged, and every reader
(``checkpoints window``, ``receipts``, the guard, the rebuild of a pruned epoch from
its committed output) reads it as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from sealstream.checkpoint import receipts as trees
from sealstream.checkpoint.proofs import result_ids


class EpochIds:
    """A worker's identities of the results it staged, per epoch (columns ``key``,
    ``__kint``, ``window_start``, ``window_end``)."""

    def __init__(self) -> None:
        self.frames: dict[int, list[pl.DataFrame]] = {}

    def add(self, epoch: int, ids: pl.DataFrame) -> None:
        self.frames.setdefault(epoch, []).append(ids)

    def take(self, epoch: int) -> pl.DataFrame | None:
        """The ids of ``epoch`` (None when there are none); older epochs' are dropped
        (a checkpoint that failed: the job restarts and stages them again)."""
        frames = self.frames.pop(epoch, [])
        self.frames = {e: f for e, f in self.frames.items() if e > epoch}
        return pl.concat(frames, how="vertical") if frames else None


@dataclass
class Built:
    """An epoch's receipt built on its receipt worker."""

    count: int
    digest: str
    root: str
    #: the ids file (``receipt-ids.arrow``), None for an epoch without results
    data: bytes | None

    def summary(self) -> dict[str, Any]:
        """What goes back to the coordinator: a few numbers."""
        return {"count": self.count, "digest": self.digest, "root": self.root}


def build(frames: list[pl.DataFrame]) -> Built:
    """The receipt of an epoch whose result identities are ``frames`` (every worker's
    and the coordinator's share): one sort over all of them, columnar."""
    if not frames:
        return Built(0, trees.joined_digest(pl.Series("id", [], pl.String)), trees.EMPTY_ROOT,
                     None)
    ids = result_ids(pl.concat(frames, how="vertical"))
    return Built(ids.len(), trees.joined_digest(ids), trees.root(ids), trees.encode_ids(ids))
