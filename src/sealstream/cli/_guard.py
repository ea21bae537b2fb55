"""``sealstream checkpoints window``, ``sealstream receipts verify`` and the proofs that
``checkpoints export --receipts`` writes."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import click

from sealstream.checkpoint import receipts as trees
from sealstream.checkpoint.manifest import checkpoint_key, load_json
from sealstream.checkpoint.stores import CheckpointStore
from sealstream.errors import CheckpointError, SealstreamError, SpecError


def window_report(store: CheckpointStore, *, key: str, start_ms: int, end_ms: int,
                  checkpoint_id: int | None, require_receipts: bool,
                  max_age_s: float | None) -> dict[str, Any]:
    """The window's :class:`~sealstream.guard.WindowCheckpoint` and the guard's manifest."""
    from sealstream.guard import ResumePolicy, WindowCheckpointGuard, window_checkpoint

    cp = window_checkpoint(store, key=key, start_ms=start_ms, end_ms=end_ms,
                           checkpoint_id=checkpoint_id)
    policy = ResumePolicy(require_output_emission_receipt=require_receipts,
                          max_checkpoint_age_sec=float("inf") if max_age_s is None
                          else max_age_s, current_epoch=time.time())
    m = WindowCheckpointGuard.evaluate_checkpoint(cp, policy)
    receipt = json.loads(cp.output_emission_receipt) if cp.output_emission_receipt else None
    return {
        "checkpoint": {
            "window_id": cp.window_id,
            "status": cp.status,
            "watermark_epoch": _json_num(cp.watermark_epoch),
            "aggregation_state_hash": cp.aggregation_state_hash,
            "output_emission_receipt": receipt,
            "atomicity_signature": cp.atomicity_signature,
            "checkpoint_epoch": cp.checkpoint_epoch,
            "checkpoint_id": cp.source.checkpoint_id if cp.source else None,
            "notes": list(cp.notes),
        },
        "manifest": {**m.to_json(), "resume_watermark": _json_num(m.resume_watermark)},
    }


def _json_num(value: float | None) -> Any:
    if value is None:
        return None
    if value in (float("inf"), float("-inf")):
        return "+inf" if value > 0 else "-inf"
    return value


def render_window(data: dict[str, Any]) -> None:
    cp, m = data["checkpoint"], data["manifest"]
    rec = cp["output_emission_receipt"]
    click.echo(f"window {cp['window_id']} in checkpoint {cp['checkpoint_id']}")
    if rec:
        click.echo(f"  emitted in epoch {rec['epoch']} (receipt signed by checkpoint "
                   f"{rec['checkpoint']}, leaf {rec['index']} of {rec['count']})")
    else:
        click.echo(f"  {cp['status']}: no emission receipt")
    click.echo(f"  watermark epoch {cp['watermark_epoch']}, state hash "
               f"{cp['aggregation_state_hash'][:16]}..., signature "
               f"{cp['atomicity_signature'][:28]}...")
    for note in cp["notes"]:
        click.echo(f"  note: {note}")
    click.echo(f"{m['verdict']} ({m['reason']})")
    click.echo(m["directive"])


# --------------------------------------------------------------------------- proofs
def export_proofs(store: CheckpointStore, cid: int, to: Path, *, replace: bool,
                  key: bytes | None) -> dict[str, Any]:
    """Write one inclusion proof per result of checkpoint ``cid``'s epoch to ``to`` (JSON
    lines, mode 0600). The checkpoint's manifest must verify; refuses a checkpoint
    without signed roots (``NO_RECEIPT_ROOTS``)."""
    if to.exists() and not replace:
        raise SpecError(f"--to: {str(to)!r} exists; pass --replace to replace it")
    doc = store.read_manifest(cid)
    if doc is None:
        raise CheckpointError(f"checkpoint {cid} in {store.location} has no readable manifest")
    from sealstream.checkpoint.manifest import signature_ok

    ok, code = signature_ok(doc, key)
    if not ok:
        raise CheckpointError(f"checkpoint {cid}: its manifest does not verify ({code}); "
                              "no proof is written against it")
    roots = doc.get(trees.ROOTS_FIELD)
    if not isinstance(roots, dict):
        raise CheckpointError(f"checkpoint {cid} predates Merkle receipts (NO_RECEIPT_ROOTS): "
                              "its manifest signs no receipt root")
    entry = doc.get("files", {}).get("receipt_ids")
    if isinstance(entry, dict):
        data = store.read(str(entry["path"]))
        if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            raise CheckpointError(f"checkpoint {cid}: {entry['path']} does not match its "
                                  "SHA-256 in the manifest")
        ids = trees.decode_ids(data)
    else:
        ids = trees.decode_ids(trees.encode_ids(_empty()))
    if trees.root(ids) != roots["results"]["root"]:
        raise CheckpointError(f"checkpoint {cid}: its receipt ids do not give the signed root")
    tree = [s.to_list() for s in trees.levels(ids)]
    epoch, n = int(roots["epoch"]), ids.len()
    tmp = to.parent / f".{to.name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        for i, rid in enumerate(ids.to_list()):  # one proof per result: a file, not a hot path
            proof = trees.make_proof(str(doc["pipeline"]), cid, epoch, rid, i, n,
                                     trees.path(tree, i))
            f.write(trees.proof_bytes(proof) + b"\n")
    os.replace(tmp, to)
    return {"checkpoint": cid, "epoch": epoch, "proofs": n, "to": str(to),
            "root": roots["results"]["root"]}


def _empty() -> Any:
    import polars as pl

    return pl.Series("id", [], dtype=pl.String)


def verify_proof_files(proof_path: Path, manifest: Path | None, directory: str | None,
                       key: bytes | None) -> dict[str, Any]:
    """Check every proof in ``proof_path`` (one JSON object, or JSON lines) against the
    manifest file, or the manifest of the checkpoint each names in ``directory``."""
    try:
        text = proof_path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read {proof_path}: {exc.strerror or exc}") from None
    try:
        try:
            proofs = [load_json(text, "proof")]  # one JSON document
        except ValueError:
            proofs = [load_json(ln, "proof") for ln in text.splitlines() if ln.strip()]
    except ValueError as exc:
        raise SpecError(f"{proof_path}: not a JSON proof ({exc})") from None
    fixed = None
    if manifest is not None:
        try:
            fixed = load_json(manifest.read_bytes(), "manifest")
        except (OSError, ValueError) as exc:
            raise SpecError(f"cannot read manifest {manifest}: {exc}") from None
    store = None
    if directory is not None:
        from sealstream.checkpoint.stores import LocalCheckpointStore

        store = LocalCheckpointStore(Path(directory))
    results = []
    for n, proof in enumerate(proofs, 1):
        doc = fixed
        if doc is None and store is not None and isinstance(proof, dict):
            try:
                doc = store.read_manifest(int(proof.get("checkpoint", -1)))
            except (SealstreamError, OSError, ValueError, TypeError):
                doc = None
        check = trees.verify_proof(proof, doc, key)
        results.append({"line": n, "ok": check.ok, "reason": check.reason,
                        "message": check.message})
    return {"proofs": len(results), "verified": sum(r["ok"] for r in results),
            "results": results}


def key_from_env() -> bytes | None:
    return checkpoint_key()
