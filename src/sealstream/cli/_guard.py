"""``sealstream checkpoints window``, ``sealstream receipts verify`` and the proofs that
``checkpoints export --receipts`` writes."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import click

from sealstream.checkpoint.manifest import checkpoint_key, load_json
from sealstream.errors import CheckpointError, SealstreamError, SpecError

if TYPE_CHECKING:
    from sealstream.checkpoint.stores import CheckpointStore


def _trees() -> ModuleType:
    """The receipts module, imported when a command needs it: ``sealstream --help``
    imports no columnar library (tests/test_cli_startup.py)."""
    from sealstream.checkpoint import receipts

    return receipts


def results_sink(spec: Path) -> Any:
    """The results sink of the pipeline in ``spec``, to read its committed output back
    (never to write): the proofs of epochs whose checkpoints were pruned are rebuilt
    from it."""
    from sealstream.pipeline import load_spec
    from sealstream.sinks import open_sink

    p = load_spec(spec)
    funcs = {a.name: a.result_kind for a in p.parsed_aggregates}
    sink = open_sink(p.sink, "results", "receiptsreadonly", funcs)
    if hasattr(sink, "key_fields"):
        sink.key_fields = p.source.key_fields
    if hasattr(sink, "pipeline"):
        sink.pipeline = p.name
    return sink


def window_report(store: CheckpointStore, *, key: str, start_ms: int, end_ms: int,
                  checkpoint_id: int | None, require_receipts: bool,
                  max_age_s: float | None, spec: Path | None = None) -> dict[str, Any]:
    """The window's :class:`~sealstream.guard.WindowCheckpoint` and the guard's manifest."""
    from sealstream.guard import ResumePolicy, WindowCheckpointGuard, window_checkpoint

    cp = window_checkpoint(store, key=key, start_ms=start_ms, end_ms=end_ms,
                           checkpoint_id=checkpoint_id,
                           results_sink=None if spec is None else results_sink(spec))
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
    if rec and rec.get("receipt_proof") == 2:
        click.echo(f"  proof: result -> epoch {rec['epoch']} root (leaf {rec['index']} of "
                   f"{rec['count']}) -> emission log of checkpoint {rec['checkpoint']} (leaf "
                   f"{rec['log_index']} of {rec['log_size']}); check it offline with "
                   "`sealstream receipts verify`")
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
    roots = doc.get(_trees().ROOTS_FIELD)
    if not isinstance(roots, dict):
        raise CheckpointError(f"checkpoint {cid} predates Merkle receipts (NO_RECEIPT_ROOTS): "
                              "its manifest signs no receipt root")
    entry = doc.get("files", {}).get("receipt_ids")
    if isinstance(entry, dict):
        data = store.read(str(entry["path"]))
        if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            raise CheckpointError(f"checkpoint {cid}: {entry['path']} does not match its "
                                  "SHA-256 in the manifest")
        ids = _trees().decode_ids(data)
    else:
        ids = _trees().decode_ids(_trees().encode_ids(_empty()))
    if _trees().root(ids) != roots["results"]["root"]:
        raise CheckpointError(f"checkpoint {cid}: its receipt ids do not give the signed root")
    tree = [s.to_list() for s in _trees().levels(ids)]
    epoch, n = int(roots["epoch"]), ids.len()
    tmp = to.parent / f".{to.name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        for i, rid in enumerate(ids.to_list()):  # one proof per result: a file, not a hot path
            proof = _trees().make_proof(str(doc["pipeline"]), cid, epoch, rid, i, n,
                                     _trees().path(tree, i))
            f.write(_trees().proof_bytes(proof) + b"\n")
    os.replace(tmp, to)
    return {"checkpoint": cid, "epoch": epoch, "proofs": n, "to": str(to),
            "root": roots["results"]["root"]}


def _empty() -> Any:
    import polars as pl

    return pl.Series("id", [], dtype=pl.String)


def verify_proof_files(proof_path: Path, manifest: Path | None, directory: str | None,
                       key: bytes | None, pipeline_name: str | None = None
                       ) -> dict[str, Any]:
    """Check every proof in ``proof_path`` (one JSON object, or JSON lines) against the
    manifest file, or the manifest of the checkpoint each names in the store
    ``directory`` (a directory or any store URL; in a database, the checkpoints of
    ``pipeline_name``, default the pipeline the proofs name)."""
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
    proofs = [_unwrap(p) for p in proofs]
    store = None
    if directory is not None:
        from sealstream.cli import _store

        named = {str(p.get("pipeline")) for p in proofs
                 if isinstance(p, dict) and isinstance(p.get("pipeline"), str)}
        if pipeline_name is None and len(named) == 1:
            pipeline_name = named.pop()
        store = _store(directory, pipeline_name, named=False)
    results = []
    for n, proof in enumerate(proofs, 1):
        doc = fixed
        if doc is None and store is not None and isinstance(proof, dict):
            try:
                doc = store.read_manifest(int(proof.get("checkpoint", -1)))
            except (SealstreamError, OSError, ValueError, TypeError):
                doc = None
        check = _trees().verify_proof(proof, doc, key)
        results.append({"line": n, "ok": check.ok, "reason": check.reason,
                        "message": check.message})
    return {"proofs": len(results), "verified": sum(r["ok"] for r in results),
            "results": results}


def _unwrap(doc: Any) -> Any:
    """The proof in ``checkpoints window --json`` output (its receipt), else ``doc``; a
    window report without a receipt becomes a proof that fails (``NO_RECEIPT``)."""
    if isinstance(doc, dict) and isinstance(doc.get("checkpoint"), dict) \
            and "manifest" in doc:
        rec = doc["checkpoint"].get("output_emission_receipt")
        return rec if rec is not None else {"receipt_proof": None}
    return doc


def summary_line(data: dict[str, Any]) -> str:
    """``N proofs checked, M failed`` (the last line of ``receipts verify``)."""
    return (f"{data['proofs']} proof{'s' if data['proofs'] != 1 else ''} checked, "
            f"{data['proofs'] - data['verified']} failed")


def key_from_env() -> bytes | None:
    return checkpoint_key()


# --------------------------------------------------------------------------- the log
def _target(store: CheckpointStore, cid: int | None, allow: tuple[str, ...] = ()) -> Any:
    """Checkpoint ``cid`` (default: the newest) read once through the guard; it must be
    resumable (or refused for a reason in ``allow``, found after its signature and
    hashes verified) and sign an emission log."""
    from dataclasses import replace

    from sealstream.guard import _newest, _read

    cid = _newest(store) if cid is None else cid
    r = _read(store, cid, checkpoint_key())
    if r.doc is None and r.verdict.reason in allow:
        r = replace(r, verdict=replace(r.verdict, verdict="ATOMIC_CHECKPOINT"))
    if r.doc is None:
        # the guard's message names the checkpoint itself: say it once
        why = r.verdict.message.removeprefix(f"checkpoint {cid}: ")
        raise CheckpointError(f"checkpoint {cid}: {r.verdict.verdict} ({r.verdict.reason}): "
                              f"{why}")
    if r.log is None:
        raise CheckpointError(f"checkpoint {cid} predates the emission log (NO_EMISSION_LOG): "
                              "its manifest signs no log")
    return cid, r


def consistency_report(store: CheckpointStore, old: str, new: int) -> dict[str, Any]:
    """Whether checkpoint ``new``'s emission log extends ``old``'s: ``old`` is a
    checkpoint id in ``store`` or a saved MANIFEST.json file (its signature must verify)."""
    from sealstream.checkpoint import proofs
    from sealstream.checkpoint.manifest import signature_ok

    if old.isdigit():
        old_doc = store.read_manifest(int(old))
        where = f"checkpoint {old}"
    else:
        try:
            old_doc = load_json(Path(old).read_bytes(), "manifest")
        except (OSError, ValueError) as exc:
            raise SpecError(f"OLD: {old} is neither a checkpoint id nor a readable manifest "
                            f"({exc})") from None
        where = old
    if not isinstance(old_doc, dict):
        raise CheckpointError(f"{where} has no readable manifest")
    ok, code = signature_ok(old_doc, checkpoint_key())
    if not ok:
        raise CheckpointError(f"{where}: its manifest does not verify ({code})")
    # a log that does not extend its parent's is what this command is for: judge it
    cid, r = _target(store, new, allow=("EMISSION_LOG_REWRITTEN",))
    if old_doc.get("pipeline") != r.doc.get("pipeline"):
        raise CheckpointError(f"{where} is of pipeline {old_doc.get('pipeline')!r}, checkpoint "
                              f"{cid} of {r.doc.get('pipeline')!r}")
    return proofs.consistency(old_doc, r.doc, r.log)


def _epoch_ids(store: CheckpointStore, sink: Any) -> dict[int, Any]:
    """Per epoch, a function giving its sorted result ids: from a retained checkpoint's
    verified receipt ids (read through the guard), else from the committed output."""
    from sealstream.checkpoint import proofs
    from sealstream.guard import _read, _verified_file

    out: dict[int, Any] = {}
    for c in store.ids():
        r = _read(store, c, checkpoint_key())
        roots = r.doc.get(_trees().ROOTS_FIELD) if r.doc is not None else None
        if isinstance(roots, dict):
            def ids(doc: Any = r.doc) -> Any:
                data = _verified_file(store, doc, "receipt_ids")
                return _trees().decode_ids(data) if data is not None else _empty()
            out[int(roots["epoch"])] = ids
    if sink is not None:
        by_epoch: dict[int, list[Any]] = {}
        for f in sink.committed():
            by_epoch.setdefault(int(f.epoch), []).append(f)
        for epoch, files in by_epoch.items():
            if epoch not in out:
                out[epoch] = lambda files=files: proofs.result_ids(sink.read_ids(files))
    return out


def export_log_proofs(store: CheckpointStore, to: Path, *, epochs: tuple[int, int] | None,
                      key: str | None, checkpoint_id: int | None, replace: bool,
                      spec: Path | None) -> dict[str, Any]:
    """Write a proof (format 2, through the emission log of checkpoint ``checkpoint_id``,
    default the newest) for every result of the epochs in ``epochs`` (inclusive), or of
    the results of ``key``, to ``to`` (JSON lines, mode 0600)."""
    from sealstream.checkpoint import proofs

    if to.exists() and not replace:
        raise SpecError(f"--to: {str(to)!r} exists; pass --replace to replace it")
    cid, r = _target(store, checkpoint_id)
    entries = r.log
    chosen = [int(e[0]) for e in entries
              if epochs is None or epochs[0] <= int(e[0]) <= epochs[1]]
    if not chosen:
        raise SpecError(f"no epoch of checkpoint {cid}'s emission log is in the range "
                        f"{epochs[0]}..{epochs[1]}" if epochs else "the emission log is empty")
    sources = _epoch_ids(store, None if spec is None else results_sink(spec))
    tmp = to.parent / f".{to.name}.{os.getpid()}.tmp"
    written, missing = 0, []
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        for epoch in chosen:
            count = int(entries[proofs.log_index(entries, epoch) or 0][1])
            if count == 0:
                continue
            if epoch not in sources:
                missing.append(epoch)
                continue
            try:
                prover = proofs.EpochProver(str(r.doc["pipeline"]), cid, entries, epoch,
                                            sources[epoch]())
            except ValueError as exc:
                tmp.unlink()
                raise CheckpointError(str(exc)) from None
            ids = prover.ids.to_list()
            for i, rid in enumerate(ids):  # one proof per result: a file, not a hot path
                if key is None or rid.startswith(f"{key}|"):
                    f.write(_trees().proof_bytes(prover.proof(i)) + b"\n")
                    written += 1
    if missing:
        tmp.unlink()
        raise CheckpointError(
            f"epochs {', '.join(map(str, missing[:10]))} have results but neither a retained "
            "checkpoint nor (without --spec, or no longer) committed output to prove them from")
    os.replace(tmp, to)
    return {"checkpoint": cid, "epochs": [chosen[0], chosen[-1]], "proofs": written,
            "to": str(to), "log": r.doc["emission_log"]}


# --------------------------------------------------------------------------- commands
def _open(directory: str, pipeline_name: str | None) -> CheckpointStore:
    from sealstream.cli import _store

    store: CheckpointStore = _store(directory, pipeline_name)
    return store


def _epoch_range(text: str) -> tuple[int, int]:
    a, sep, b = text.partition("..")
    try:
        lo = int(a)
        hi = int(b) if sep else lo
    except ValueError:
        raise click.BadParameter(f"{text!r} is not EPOCH or FIRST..LAST") from None
    if hi < lo:
        raise click.BadParameter(f"{text!r}: the last epoch is before the first")
    return lo, hi


def _pubkey(f: Any) -> Any:
    from sealstream.cli._keys import public_key_option

    return public_key_option(f)


@click.command("consistency")
@click.argument("directory", metavar="STORE", type=str)
@click.argument("old", metavar="OLD")
@click.argument("new", metavar="NEW", type=int)
@click.option("--pipeline", "pipeline_name", default=None,
              help="With a database URL: whose checkpoints.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (with the proof).")
@_pubkey
def consistency_cmd(directory: str, old: str, new: int, pipeline_name: str | None,
                    as_json: bool) -> None:
    """Prove that checkpoint NEW's emission log extends OLD's (a checkpoint id, or a
    MANIFEST.json saved earlier): no epoch committed by OLD was removed or rewritten.
    Offline: needs the public key (or SEALSTREAM_CHECKPOINT_KEY). Exit 1 when it does not."""
    data = consistency_report(_open(directory, pipeline_name), old, new)
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(f"{'OK' if data['ok'] else data['reason']}: {data['message']}")
    if not data["ok"]:
        from sealstream.cli import _Exit

        raise _Exit(1)


@click.command("export")
@click.argument("directory", metavar="STORE", type=str)
@click.option("--epochs", default=None, metavar="FIRST..LAST",
              help="The epochs whose results to prove (one EPOCH, or FIRST..LAST).")
@click.option("--key", "window_key", default=None, help="Or every result of this key.")
@click.option("--to", "to", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The JSON-lines file of proofs to write.")
@click.option("--id", "checkpoint_id", type=int, default=None,
              help="The checkpoint whose signed log the proofs end in (default: the newest).")
@click.option("--spec", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The pipeline's spec: prove epochs whose checkpoints were pruned from "
                   "their committed output.")
@click.option("--replace", is_flag=True, help="Replace the --to file if it exists.")
@click.option("--pipeline", "pipeline_name", default=None,
              help="With a database URL: whose checkpoints.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_pubkey
def export_cmd(directory: str, epochs: str | None, window_key: str | None, to: Path,
               checkpoint_id: int | None, spec: Path | None, replace: bool,
               pipeline_name: str | None, as_json: bool) -> None:
    """Write an inclusion proof, through the signed emission log, for every result of a
    range of epochs or of a key (check them with `sealstream receipts verify`)."""
    if (epochs is None) == (window_key is None):
        raise click.UsageError("give exactly one of --epochs FIRST..LAST or --key KEY")
    data = export_log_proofs(_open(directory, pipeline_name), to,
                             epochs=None if epochs is None else _epoch_range(epochs),
                             key=window_key, checkpoint_id=checkpoint_id, replace=replace,
                             spec=spec)
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(f"wrote {data['proofs']} proofs of epochs {data['epochs'][0]}.."
                   f"{data['epochs'][1]} to {data['to']} (through the emission log of "
                   f"checkpoint {data['checkpoint']}, {data['log']['size']} epochs)")
