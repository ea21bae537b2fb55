"""The window-level guard: the window-commit-invariants API over sealstream checkpoints.

Code written against the window-commit-invariants specification runs unchanged::

    from sealstream.guard import ResumePolicy, WindowCheckpointGuard, window_checkpoint

    cp = window_checkpoint("ckpt", key="u1", start_ms=0, end_ms=60_000)  # a real checkpoint
    m = WindowCheckpointGuard.evaluate_checkpoint(
        cp, ResumePolicy(require_output_emission_receipt=True,
                         max_checkpoint_age_sec=3600, current_epoch=time.time()))
    print(m.verdict, m.directive)   # CheckpointVerdict.ATOMIC_CHECKPOINT PROCEED: ...

It is a thin layer over the pure checkpoint guard (:mod:`sealstream.checkpoint.guard`),
not a second one. Where it is stricter than the specification's sketch:

* the ``atomicity_signature`` is *verified*, with the store's key
  (``SEALSTREAM_CHECKPOINT_KEY``, or ``key=``), not merely checked for presence;
* a watermark or epoch that does not cohere with the state hash gives
  ``INCONSISTENT_STATE`` (the window's fields are recomputed from the verified
  checkpoint and compared);
* a missing receipt gives ``PARTIAL_CHECKPOINT_REJECT`` when the policy requires one;
* a checkpoint older than ``max_checkpoint_age_sec`` is refused (``INCONSISTENT_STATE``,
  reason ``STALE``, as ``checkpoints verify --max-age`` says);
* the ``manifest_digest`` covers the receipt too;
* the directive is a runbook line: ``PROCEED: resume window W at watermark T``,
  ``PROCEED WITH REBUILD: ...``, ``FALL BACK: ... to checkpoint N``, ``REJECT: ...``.

Units: ``watermark_epoch`` is event time in milliseconds (sealstream's watermark);
``checkpoint_epoch`` and ``current_epoch`` are wall-clock seconds since the Unix
epoch; the *emission epoch* inside a receipt is the number of the epoch (the output
between two checkpoints) in which the window's result was committed.

A :class:`WindowCheckpoint` built by hand (no ``source``) is judged on its own fields:
its ``atomicity_signature`` must be :func:`sign_window` of them under the key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import polars as pl

from sealstream.checkpoint import emission_log as _log
from sealstream.checkpoint import guard as _guard
from sealstream.checkpoint import proofs as _proofs
from sealstream.checkpoint import receipts as _receipts
from sealstream.checkpoint.manifest import (
    ALG_HMAC,
    ALG_PLAIN,
    checkpoint_key,
    signature_ok,
)
from sealstream.checkpoint.stores import CheckpointStore, LocalCheckpointStore
from sealstream.errors import CheckpointError, SpecError
from sealstream.sources._base import KEY, KEY_IS_INT
from sealstream.state import incremental
from sealstream.watermark import json_ms
from sealstream.windows.aggregates import WEND, WSTART

__all__ = [
    "CheckpointManifest",
    "CheckpointVerdict",
    "ResumePolicy",
    "WindowCheckpoint",
    "WindowCheckpointGuard",
    "sign_window",
    "window_checkpoint",
]

_FROM_ENV: Any = object()
#: the reason of a window that no checkpoint holds open and no epoch emitted (exit 1)
WINDOW_NOT_FOUND = "WINDOW_NOT_FOUND"


class CheckpointVerdict(Enum):
    """The three verdicts (their values are the strings ``checkpoints verify`` prints)."""

    ATOMIC_CHECKPOINT = _guard.ATOMIC
    PARTIAL_CHECKPOINT_REJECT = _guard.PARTIAL
    INCONSISTENT_STATE = _guard.INCONSISTENT


@dataclass(frozen=True)
class CheckpointSource:
    """Where a :class:`WindowCheckpoint` was read: the guard re-reads and verifies it."""

    store: CheckpointStore
    checkpoint_id: int
    start_ms: int
    end_ms: int
    key: str


@dataclass(frozen=True)
class WindowCheckpoint:
    """One window as a checkpoint records it (the specification's fields).

    ``window_id`` is the result id ``key|key_is_int|window_start|window_end``;
    ``aggregation_state_hash`` the SHA-256 of the window's state row (or of its
    absence, once emitted) bound to the watermark and the state file's hash;
    ``output_emission_receipt`` the compact JSON of an inclusion proof that the result
    was committed (None while the window is open); ``atomicity_signature`` the
    checkpoint manifest's signature, ``alg:hex``."""

    window_id: str
    watermark_epoch: float
    aggregation_state_hash: str
    output_emission_receipt: str | None
    atomicity_signature: str
    checkpoint_epoch: float
    source: CheckpointSource | None = field(default=None, compare=False)
    #: what the view found out while building it (e.g. a checkpoint without roots)
    notes: tuple[str, ...] = field(default=(), compare=False)
    #: "open" (in the state), "emitted" (a receipt found), "absent" (neither: never seen,
    #: or emitted before every retained checkpoint), "unknown" (state unreadable), or
    #: "" for a hand-built one
    status: str = field(default="", compare=False)


@dataclass(frozen=True)
class ResumePolicy:
    """What the successor requires. ``max_checkpoint_age_sec`` and ``current_epoch`` are
    wall-clock seconds."""

    require_output_emission_receipt: bool
    max_checkpoint_age_sec: float
    current_epoch: float


@dataclass(frozen=True)
class CheckpointManifest:
    """The guard's decision for one window checkpoint."""

    verdict: CheckpointVerdict
    resume_watermark: float | None
    directive: str
    manifest_digest: str
    reason: str = ""
    checkpoint_id: int | None = None
    #: the checkpoint to fall back to (FALL BACK / REJECT), when one verifies
    fallback_id: int | None = None
    rebuild: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "reason": self.reason,
            "resume_watermark": self.resume_watermark,
            "directive": self.directive,
            "manifest_digest": self.manifest_digest,
            "checkpoint_id": self.checkpoint_id,
            "fallback_id": self.fallback_id,
            "rebuild": list(self.rebuild),
        }


# --------------------------------------------------------------------------- signing
def _window_body(cp: WindowCheckpoint) -> bytes:
    return json.dumps({
        "window": cp.window_id, "watermark": cp.watermark_epoch,
        "aggregation": cp.aggregation_state_hash, "receipt": cp.output_emission_receipt,
        "checkpoint_epoch": cp.checkpoint_epoch,
    }, sort_keys=True, separators=(",", ":")).encode()


def sign_window(cp: WindowCheckpoint, key: bytes | None) -> str:
    """The ``atomicity_signature`` of a hand-built window checkpoint: ``hmac-sha256:HEX``
    over all its other fields under ``key`` (``sha256:HEX`` without a key, which detects
    corruption only)."""
    data = _window_body(cp)
    if key is None:
        return f"{ALG_PLAIN}:{hashlib.sha256(data).hexdigest()}"
    return f"{ALG_HMAC}:{hmac.new(key, data, hashlib.sha256).hexdigest()}"


def _sig_text(doc: Mapping[str, Any]) -> str:
    sig = doc.get("signature")
    if not isinstance(sig, dict):
        return ""
    return f"{sig.get('alg')}:{sig.get('value')}"


# --------------------------------------------------------------------------- the view
def _num(value: Any) -> float:
    value = json_ms(int(value)) if isinstance(value, int) else value
    if value == "-inf":
        return -math.inf
    if value == "+inf":
        return math.inf
    return float(value)


def _fmt(wm: float) -> str:
    return ("+inf" if wm > 0 else "-inf") if math.isinf(wm) else f"{wm:.0f}"


def _state_hash(window_id: str, row: str | None, watermark: Any, state_sha: Any) -> str:
    body = {"window": window_id, "row": row, "watermark": watermark, "state_sha256": state_sha}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _open_store(store: CheckpointStore | str | Path) -> CheckpointStore:
    if isinstance(store, CheckpointStore):
        return store
    path = Path(store)
    if not path.is_dir():
        raise SpecError(f"checkpoint directory {path} does not exist")
    return LocalCheckpointStore(path)


def _newest(store: CheckpointStore) -> int:
    ids = [c for c in store.ids() if store.has_manifest(c)]
    if not ids:
        raise SpecError(f"no published checkpoint in {store.location}")
    return ids[-1]


@dataclass(frozen=True)
class _Read:
    """One checkpoint read once through the checkpoint guard: its verdict and, when it
    is resumable, what the guard verified (the manifest and ``receipts.json``)."""

    verdict: _guard.Verdict
    receipts: Mapping[str, Any] | None

    @property
    def doc(self) -> Mapping[str, Any] | None:
        return self.verdict.manifest if self.verdict.resumable else None

    @property
    def log(self) -> list[Any] | None:
        """The emission log's entries, when the manifest signs one."""
        if self.doc is None or self.receipts is None or _log.LOG_FIELD not in self.doc:
            return None
        entries = self.receipts.get(_log.LEAVES_KEY)
        return entries if isinstance(entries, list) else None


def _read(store: CheckpointStore, cid: int, key: bytes | None) -> _Read:
    ev = store.evidence(cid, key)
    v = _guard.judge_resumable(ev, store.verified_parent(cid, key), _guard.Policy(key=key))
    return _Read(v, ev.receipts)


def _verified_file(store: CheckpointStore, doc: Mapping[str, Any], role: str) -> bytes | None:
    """The bytes of the file ``doc`` names for ``role``, checked against its SHA-256
    (ValueError when they differ); None when it names none."""
    entry = doc["files"].get(role)
    if not isinstance(entry, dict):
        return None
    data = store.read(str(entry["path"]))
    if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        raise ValueError(f"{entry['path']} does not match its SHA-256")
    return data


def _find_receipt(store: CheckpointStore, target: _Read, cid: int, window_id: str,
                  key: bytes | None, results_sink: Any) -> tuple[str | None, list[str]]:
    """The proof (compact JSON) that ``window_id`` was emitted, against checkpoint
    ``cid`` (read as ``target``): found in the result ids of a retained checkpoint at
    or before it (each read through the guard), else, when ``results_sink`` is given,
    in the committed output of an epoch of the emission log whose checkpoint retention
    removed (its tree rebuilt from that output and checked against the log's root).
    Notes say what could not be read."""
    notes: list[str] = []
    assert target.doc is not None
    pipeline = str(target.doc.get("pipeline"))
    entries = target.log
    searched: set[int] = set()
    for c in reversed([c for c in store.ids() if c <= cid]):
        r = target if c == cid else _read(store, c, key)
        if r.doc is None:
            notes.append(f"{r.verdict.reason}: checkpoint {c} does not verify; its receipts "
                         "were not read")
            continue
        roots = r.doc.get(_receipts.ROOTS_FIELD)
        if not isinstance(roots, dict):
            notes.append(f"NO_RECEIPT_ROOTS: checkpoint {c} predates Merkle receipts")
            continue
        epoch = int(roots["epoch"])
        searched.add(epoch)
        try:
            data = _verified_file(store, r.doc, "receipt_ids")
            if data is None:
                continue  # an epoch without results
            ids = _receipts.decode_ids(data)
        except (OSError, ValueError) as exc:
            notes.append(f"RECEIPT_IDS_UNREADABLE: checkpoint {c}: {exc}")
            continue
        proof = _prove(pipeline, cid, entries, epoch, ids, window_id, c)
        if proof is not None:
            return proof, notes
    if entries is None:
        return None, notes
    pruned = [int(e[0]) for e in entries if int(e[0]) not in searched and int(e[1]) > 0]
    if pruned and results_sink is None:
        notes.append(f"PRUNED_EPOCHS: the checkpoints of {len(pruned)} epoch(s) with results "
                     f"(epochs {pruned[0]}..{pruned[-1]}) were pruned; pass --spec to search "
                     "their committed output")
        return None, notes
    if not pruned:
        return None, notes
    by_epoch: dict[int, list[Any]] = {}
    for f in results_sink.committed():
        by_epoch.setdefault(int(f.epoch), []).append(f)
    for epoch in reversed(pruned):
        files = by_epoch.get(epoch)
        if not files:
            notes.append(f"OUTPUT_NOT_RETAINED: epoch {epoch}'s committed output is gone")
            continue
        ids = _proofs.result_ids(results_sink.read_ids(files))
        try:
            proof = _prove(pipeline, cid, entries, epoch, ids, window_id, cid)
        except ValueError as exc:
            notes.append(f"OUTPUT_MISMATCH: {exc}")
            continue
        if proof is not None:
            return proof, notes
    return None, notes


def _prove(pipeline: str, cid: int, entries: list[Any] | None, epoch: int, ids: pl.Series,
           window_id: str, signer: int) -> str | None:
    """The proof of ``window_id`` among epoch ``epoch``'s ``ids`` (None when it is not
    one of them): through checkpoint ``cid``'s emission log when it has one, else
    against checkpoint ``signer``'s signed epoch root (format 1)."""
    if entries is not None and _proofs.log_index(entries, epoch) is not None:
        prover = _proofs.EpochProver(pipeline, cid, entries, epoch, ids)
        index = prover.index_of(window_id)
        if index is None:
            return None
        return _receipts.proof_bytes(prover.proof(index)).decode()
    hit = ids.to_frame("id").with_row_index("i").filter(pl.col("id") == window_id)
    if not hit.height:
        return None
    index = int(hit["i"][0])
    tree = [s.to_list() for s in _receipts.levels(ids)]
    proof = _receipts.make_proof(pipeline, signer, epoch, window_id, index, ids.len(),
                                 _receipts.path(tree, index))
    return _receipts.proof_bytes(proof).decode()


def window_checkpoint(store: CheckpointStore | str | Path, *, key: str, start_ms: int,
                      end_ms: int, checkpoint_id: int | None = None,
                      signing_key: bytes | None | Any = _FROM_ENV,
                      results_sink: Any = None) -> WindowCheckpoint:
    """The :class:`WindowCheckpoint` of window ``[start_ms, end_ms)`` of ``key`` in a real
    checkpoint (default: the newest published one): open (its state row's hash and the
    watermark) or emitted (its receipt: an inclusion proof through the checkpoint's signed
    emission log, from the result ids of the epoch that committed it). Reads what it can;
    :meth:`WindowCheckpointGuard.evaluate_checkpoint` verifies it. A numeric ``key``
    matches an integer key, else the string.

    Every checkpoint is read once through the checkpoint guard (its signature under
    ``signing_key``, default ``SEALSTREAM_CHECKPOINT_KEY``, and the trusted public keys;
    its files' hashes); nothing of one that is not resumable is used. ``results_sink``
    (the pipeline's results :class:`~sealstream.sinks.Sink`) lets the proof of a result
    whose checkpoint retention removed be rebuilt from its epoch's committed output."""
    sk: bytes | None = checkpoint_key() if signing_key is _FROM_ENV else signing_key
    st = _open_store(store)
    cid = _newest(st) if checkpoint_id is None else checkpoint_id
    raw = st.read_manifest(cid)
    if not isinstance(raw, dict):
        raise CheckpointError(f"checkpoint {cid} in {st.location} has no readable manifest")
    target = _read(st, cid, sk)
    doc: Mapping[str, Any] = target.doc if target.doc is not None else raw
    wm = doc.get("watermark", {}).get("global_ms") if isinstance(doc.get("watermark"),
                                                                  dict) else None
    notes: list[str] = []
    row_json: str | None = None
    kint = "false"
    try:
        if target.doc is None:
            raise ValueError(f"{target.verdict.reason}: checkpoint {cid} does not verify; "
                             "its files were not used")
        state, _meta = incremental.load_chain(doc["files"], st.read)
        rows = state.filter((pl.col(KEY) == key) & (pl.col(WSTART) == start_ms)
                            & (pl.col(WEND) == end_ms))
        if rows.height > 1:
            rows = rows.filter(pl.col(KEY_IS_INT) == key.lstrip("-").isdigit())
        if rows.height:
            kint = "true" if bool(rows[KEY_IS_INT][0]) else "false"
            row_json = rows.head(1).write_json()
        elif key.lstrip("-").isdigit():
            kint = "true"
    except (OSError, ValueError, KeyError, TypeError, pl.exceptions.PolarsError) as exc:
        notes.append(f"STATE_UNREADABLE: {exc}")
        row_json = "<unreadable>"
    window_id = f"{key}|{kint}|{start_ms}|{end_ms}"
    receipt = None
    if row_json is None:
        receipt, more = _find_receipt(st, target, cid, window_id, sk, results_sink)
        notes.extend(more)
    state_sha = doc.get("state", {}).get("sha256") if isinstance(doc.get("state"),
                                                                   dict) else None
    return WindowCheckpoint(
        window_id=window_id,
        watermark_epoch=_num(wm) if wm is not None else math.nan,
        aggregation_state_hash=_state_hash(window_id, row_json, wm, state_sha),
        output_emission_receipt=receipt,
        atomicity_signature=_sig_text(doc),
        checkpoint_epoch=float(doc.get("created_ms", 0)) / 1000,
        source=CheckpointSource(st, cid, start_ms, end_ms, key),
        notes=tuple(notes),
        status=("unknown" if row_json == "<unreadable>" else "open" if row_json is not None
                else "emitted" if receipt is not None else "absent"),
    )


# --------------------------------------------------------------------------- the guard
class WindowCheckpointGuard:
    """Evaluates a :class:`WindowCheckpoint` against a :class:`ResumePolicy`."""

    @classmethod
    def evaluate_checkpoint(cls, cp: WindowCheckpoint, policy: ResumePolicy, *,
                            key: bytes | None | Any = _FROM_ENV) -> CheckpointManifest:
        """The verdict, the watermark to resume at, a runbook directive and a digest
        over all of it (receipt included). ``key``: the store's signing key (default:
        ``SEALSTREAM_CHECKPOINT_KEY``). Never raises for a bad checkpoint."""
        k: bytes | None = checkpoint_key() if key is _FROM_ENV else key
        return _Evaluation(cp, policy, k).run()


class _Evaluation:
    def __init__(self, cp: WindowCheckpoint, policy: ResumePolicy, key: bytes | None) -> None:
        self.cp, self.policy, self.key = cp, policy, key
        self.cid = cp.source.checkpoint_id if cp.source is not None else None
        self.what = (f"window {cp.window_id}" + (f" of checkpoint {self.cid}"
                                                  if self.cid is not None else ""))

    def _manifest(self, verdict: CheckpointVerdict, reason: str, directive: str,
                  resume: float | None = None, fallback: int | None = None,
                  rebuild: tuple[str, ...] = ()) -> CheckpointManifest:
        cp = self.cp
        body = {"verdict": verdict.value, "reason": reason, "window": cp.window_id,
                "watermark": str(cp.watermark_epoch), "aggregation": cp.aggregation_state_hash,
                "receipt": cp.output_emission_receipt, "atomicity": cp.atomicity_signature,
                "checkpoint_epoch": str(cp.checkpoint_epoch), "checkpoint": self.cid,
                "resume_watermark": None if resume is None else str(resume),
                "rebuild": list(rebuild)}
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        return CheckpointManifest(verdict, resume, " ".join(directive.split()), digest,
                                  reason, self.cid, fallback, rebuild)

    def _fallback(self) -> tuple[int | None, str]:
        src = self.cp.source
        if src is None:
            return None, "the previous atomic checkpoint"
        pol = _guard.Policy(key=self.key)
        for cid in reversed([c for c in src.store.ids() if c < src.checkpoint_id]):
            v = _guard.judge(src.store.evidence(cid, self.key),
                             src.store.verified_parent(cid, self.key), pol)
            if v.ok:
                return cid, f"checkpoint {cid} (watermark {v.watermark_ms})"
        return None, "no older checkpoint verifies: start from the beginning"

    def _refuse(self, verdict: CheckpointVerdict, reason: str, why: str) -> CheckpointManifest:
        fb, where = self._fallback()
        if verdict is CheckpointVerdict.PARTIAL_CHECKPOINT_REJECT:
            text = f"FALL BACK: {self.what} is partial ({reason}: {why}); resume from {where}"
        else:
            text = (f"REJECT: {self.what} is inconsistent ({reason}: {why}); re-process from "
                    f"the last known-good watermark: {where}")
        if fb is None and verdict is CheckpointVerdict.PARTIAL_CHECKPOINT_REJECT \
                and self.cp.source is not None:
            text = f"FALL BACK: {self.what} is partial ({reason}: {why}); {where}"
        return self._manifest(verdict, reason, text, fallback=fb)

    def run(self) -> CheckpointManifest:
        cp, pol = self.cp, self.policy
        P, INC = CheckpointVerdict.PARTIAL_CHECKPOINT_REJECT, CheckpointVerdict.INCONSISTENT_STATE
        # ---- presence (decision rule 2)
        if not cp.atomicity_signature:
            return self._refuse(P, "NO_SIGNATURE", "no atomicity signature")
        if not cp.aggregation_state_hash:
            return self._refuse(P, "NO_STATE_HASH", "no aggregation state hash")
        if cp.watermark_epoch is None or math.isnan(cp.watermark_epoch):
            return self._refuse(P, "NO_WATERMARK", "no watermark epoch")
        v = None
        if cp.source is not None:
            src = cp.source
            v = _guard.judge_resumable(src.store.evidence(src.checkpoint_id, self.key),
                                       src.store.verified_parent(src.checkpoint_id, self.key),
                                       _guard.Policy(key=self.key))
        if pol.require_output_emission_receipt and not cp.output_emission_receipt:
            if v is not None and not v.resumable:
                # the receipt is missing because the checkpoint could not be read (no
                # public key, a bad signature...): that is the reason to give
                return self._refuse(CheckpointVerdict(v.verdict), v.reason, v.message)
            return self._refuse(P, "NO_RECEIPT", "no output emission receipt, and the "
                                "policy requires one (the window is open or its receipt "
                                "is not retained)")
        rebuild: tuple[str, ...] = ()
        # ---- the checkpoint, then the window's coherence with it (decision rule 3)
        if cp.source is not None:
            src = cp.source
            assert v is not None
            if not v.resumable:
                return self._refuse(CheckpointVerdict(v.verdict), v.reason, v.message)
            rebuild = v.rebuild
            assert v.manifest is not None
            if cp.atomicity_signature != _sig_text(v.manifest):
                return self._refuse(INC, "SIGNATURE_MISMATCH", "the atomicity signature is "
                                    "not the checkpoint's")
            fresh = window_checkpoint(src.store, key=src.key, start_ms=src.start_ms,
                                      end_ms=src.end_ms, checkpoint_id=src.checkpoint_id,
                                      signing_key=self.key)
            if fresh.watermark_epoch != cp.watermark_epoch:
                return self._refuse(INC, "WATERMARK_INCOHERENT",
                                    f"watermark {cp.watermark_epoch} is not the checkpoint's "
                                    f"{fresh.watermark_epoch}")
            if fresh.aggregation_state_hash != cp.aggregation_state_hash:
                return self._refuse(INC, "STATE_HASH_MISMATCH", "the aggregation state hash "
                                    "does not match the window's state in the checkpoint")
            if fresh.checkpoint_epoch != cp.checkpoint_epoch:
                return self._refuse(INC, "EPOCH_INCOHERENT",
                                    f"checkpoint epoch {cp.checkpoint_epoch} is not the "
                                    f"checkpoint's {fresh.checkpoint_epoch}")
            if cp.output_emission_receipt is not None:
                problem = self._receipt_problem(src.store)
                if problem is not None:
                    return self._refuse(INC, *problem)
                if fresh.status == "open":
                    return self._refuse(INC, "RECEIPT_FOR_OPEN_WINDOW", "a receipt for a "
                                        "window the checkpoint holds open")
        else:
            ok = hmac.compare_digest(cp.atomicity_signature, sign_window(cp, self.key))
            if not ok:
                return self._refuse(INC, "SIGNATURE_MISMATCH", "the atomicity signature does "
                                    "not verify over the window's fields (wrong key, or a "
                                    "field changed after signing)")
            parts = cp.window_id.split("|")
            if cp.output_emission_receipt and len(parts) >= 2 and parts[-1].lstrip(
                    "-").isdigit() and float(parts[-1]) > cp.watermark_epoch:
                return self._refuse(INC, "RECEIPT_FOR_OPEN_WINDOW",
                                    f"a receipt for a window ending at {parts[-1]}, which "
                                    f"watermark {cp.watermark_epoch} has not closed")
        # ---- freshness
        age = pol.current_epoch - cp.checkpoint_epoch
        if age > pol.max_checkpoint_age_sec:
            return self._refuse(INC, "STALE", f"the checkpoint is {age:.0f} s old, over "
                                f"max_checkpoint_age_sec {pol.max_checkpoint_age_sec:g}")
        wm = cp.watermark_epoch
        if cp.status == "absent":  # never a directive to proceed (semantics, section 16)
            why = "; ".join(n for n in cp.notes if n.startswith("PRUNED_EPOCHS"))
            return self._manifest(
                CheckpointVerdict.ATOMIC_CHECKPOINT, WINDOW_NOT_FOUND,
                f"NOT FOUND: window {cp.window_id} was never seen or emitted: checkpoint "
                f"{self.cid} holds no state for it and no epoch of its emission log "
                f"committed it" + (f" ({why})" if why else ""))
        done = (" (its result was emitted: do not emit it again)"
                if cp.output_emission_receipt else "")
        if rebuild:
            return self._manifest(
                P, _guard.REBUILDABLE_REASON,
                f"PROCEED WITH REBUILD: resume window {cp.window_id} at watermark {_fmt(wm)} "
                f"from checkpoint {self.cid}, rebuilding its {', '.join(rebuild)}{done}",
                resume=wm, rebuild=rebuild)
        return self._manifest(CheckpointVerdict.ATOMIC_CHECKPOINT, "OK",
                              f"PROCEED: resume window {cp.window_id} at watermark {_fmt(wm)}"
                              f"{done}", resume=wm)

    def _receipt_problem(self, store: CheckpointStore) -> tuple[str, str] | None:
        try:
            proof = json.loads(self.cp.output_emission_receipt or "")
            pcid = int(proof["checkpoint"])
        except (ValueError, KeyError, TypeError):
            return "RECEIPT_MALFORMED", "the receipt is not an inclusion proof"
        if proof.get("id") != self.cp.window_id:
            return "RECEIPT_MISMATCH", "the receipt proves another window"
        doc = store.read_manifest(pcid) if pcid in store.ids() else None
        if doc is None:
            return "RECEIPT_NOT_RETAINED", f"checkpoint {pcid}, which signs it, is gone"
        check = _receipts.verify_proof(proof, doc, self.key)
        if not check.ok:
            return check.reason, check.message
        ok, code = signature_ok(doc, self.key)
        return None if ok else (code, "the receipt's checkpoint does not verify")
