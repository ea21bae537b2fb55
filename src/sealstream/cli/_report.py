"""What ``sealstream checkpoints list|verify`` compute and print."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sealstream.checkpoint import guard, signing
from sealstream.checkpoint.manifest import checkpoint_key
from sealstream.checkpoint.stores import CheckpointStore
from sealstream.pipeline import Pipeline
from sealstream.watermark import json_ms


def _wm(value: Any) -> Any:
    """Watermarks as JSON: integers, or the strings "-inf"/"+inf"."""
    return None if value is None else json_ms(int(value))


def list_checkpoints(store: CheckpointStore) -> dict[str, Any]:
    out = []
    for cid in store.ids():
        doc = store.read_manifest(cid)
        entry: dict[str, Any] = {
            "id": cid,
            # with the emission log segments it names (shared with other checkpoints)
            "files": sorted(store.files_of(cid) + store.shared_files_of(cid)),
            "complete": doc is not None,
        }
        if doc is None and store.has_manifest(cid):
            # present but not readable as plaintext (encrypted without the key, or
            # damaged): say why rather than calling it partial
            entry["problem"] = guard.judge(store.evidence(cid), None, guard.Policy()).reason
        if doc is not None:
            entry.update(
                parent=doc.get("parent"),
                created_ms=doc.get("created_ms"),
                epoch=doc.get("epoch"),
                watermark_ms=_wm(doc.get("watermark", {}).get("global_ms")),
                positions={p.get("partition"): p.get("next_offset")
                           for p in doc.get("positions", []) if isinstance(p, dict)},
                open_windows=doc.get("state", {}).get("open_windows"),
            )
        out.append(entry)
    return {"checkpoints": out}


def verify_checkpoints(store: CheckpointStore, pipeline: Pipeline | None,
                       max_age_s: float | None = None,
                       require_receipts: bool = False) -> dict[str, Any]:
    """Every checkpoint's verdict; ``max_age_s``: older ones are STALE;
    ``require_receipts``: ones without signed receipt roots are PARTIAL."""
    import time

    policy = guard.Policy(
        key=checkpoint_key(),
        pipeline=pipeline.name if pipeline else None,
        fingerprint=pipeline.fingerprint() if pipeline else None,
        max_age_ms=None if max_age_s is None else round(max_age_s * 1000),
        now_ms=None if max_age_s is None else int(time.time() * 1000),
        require_receipt_roots=require_receipts,
    )
    results = []
    resume = None
    for cid in store.ids():
        v = guard.judge_resumable(store.evidence(cid, policy.key),
                                  store.verified_parent(cid, policy.key), policy)
        entry = v.to_json()
        entry["signer"] = v.signer
        entry["watermark_ms"] = _wm(v.watermark_ms)
        results.append(entry)
        if v.resumable:  # ATOMIC, or only rebuildable components damaged
            resume = cid
    return {
        "checkpoints": results,
        "resume_from": resume,
        "key": _keys_text(policy.key),
    }


def _keys_text(hmac_key: bytes | None) -> str:
    """What the verdicts were judged with: the trusted public keys' ids, the HMAC key."""
    ids = sorted(signing.trusted_keys())
    parts = [f"ed25519 {', '.join(ids)}"] if ids else []
    if hmac_key:
        parts.append("hmac-sha256 (SEALSTREAM_CHECKPOINT_KEY set)")
    return " + ".join(parts) or "none (sha256)"


def render_list(data: dict[str, Any], directory: Path | str) -> None:
    console = Console(highlight=False)
    if not data["checkpoints"]:
        console.print(f"no checkpoints in {directory}")
        return
    table = Table(title=f"checkpoints in {directory}")
    for col in ("id", "parent", "epoch", "watermark", "open windows"):
        table.add_column(col)
    longest = max((len(f) for c in data["checkpoints"] for f in c["files"]), default=1)
    table.add_column("files it depends on", no_wrap=True, min_width=longest)
    for c in data["checkpoints"]:
        files = "\n".join(c["files"]) or "-"  # one per line: a checkpoint lists a handful
        if not c["complete"]:
            what = c.get("problem") or "partial: no manifest"
            table.add_row(str(c["id"]), "", "", f"[yellow]{what}[/]", "", files)
            continue
        table.add_row(str(c["id"]), str(c.get("parent")), str(c.get("epoch")),
                      str(c.get("watermark_ms")), str(c.get("open_windows")), files)
    console.print(table)


def render_verify(data: dict[str, Any], directory: Path | str) -> None:
    console = Console(highlight=False)
    if not data["checkpoints"]:
        console.print(f"no checkpoints in {directory}; a run would start from the beginning")
        return
    table = Table(title=f"checkpoint verdicts in {directory} (key: {data['key']})")
    for col in ("id", "verdict", "reason", "detail"):
        table.add_column(col)
    colours = {guard.ATOMIC: "green", guard.PARTIAL: "yellow", guard.INCONSISTENT: "red"}
    for c in data["checkpoints"]:
        colour = colours.get(c["verdict"], "white")
        table.add_row(str(c["id"]), f"[{colour}]{c['verdict']}[/]", c["reason"], c["message"])
    console.print(table)
    resume = data["resume_from"]
    rebuild = next((c.get("rebuild") for c in data["checkpoints"] if c["id"] == resume), None)
    console.print(
        (f"a run would resume from checkpoint {resume}"
         + (f" and rebuild its {', '.join(rebuild)}" if rebuild else ""))
        if resume is not None
        else "[red]no checkpoint verifies: a run would refuse to start[/]"
    )
