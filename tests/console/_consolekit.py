"""Helpers of the console's tests: real checkpoint stores written by real runs of the
crash stories' job (tests/scenarios/_story.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scenarios._story import make_input, run, write_spec


def story(d: Path, *, url: str | None = None, env: dict[str, str] | None = None) -> Path:
    """A finished run of the story job in ``d`` (keeping 20 checkpoints), its checkpoints
    in ``d/ckpt`` or in the store at ``url``; returns the spec."""
    spec = write_spec(d, make_input(d), keep=20)
    if url is not None:
        spec.write_text(spec.read_text().replace('path = "ckpt"', f"url = {json.dumps(url)}"))
    res = run(spec, env=env)
    assert res.returncode == 0, res.stderr
    return spec


def emitted_window(d: Path, back: int = 0) -> dict[str, Any]:
    """A result line of the newest epoch's output file (its window was emitted there), or
    of the epoch ``back`` epochs before it."""
    newest = sorted((d / "out").glob("part-*.jsonl"))[-1 - back]
    return dict(json.loads(newest.read_text().splitlines()[0]))


def tree(root: Path) -> dict[str, bytes | None]:
    """Every name under ``root`` with its bytes (None for a directory or a FIFO)."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() and not p.is_symlink()
            else None for p in sorted(root.rglob("*"))}




def clone_checkpoints(ckpt: Path, n: int) -> None:
    """Replace the checkpoints in ``ckpt`` with ``n`` copies of its first one under ids
    1..n, each manifest rewritten (id, parent, time, file paths) and sealed again
    without a key: ``n`` ATOMIC checkpoints in seconds, for pagination and scale."""
    import shutil

    from sealstream.checkpoint import manifest as mf

    first = sorted(ckpt.glob("cp-*"))[0]
    doc = json.loads((first / "MANIFEST.json").read_text())
    blobs = {role: (first / e["path"].split("/", 1)[1]).read_bytes()
             for role, e in doc["files"].items()}
    for old in sorted(ckpt.glob("cp-*")):
        shutil.rmtree(old)
    doc.pop("signature")
    base_ms = int(doc["created_ms"])
    for cid in range(1, n + 1):
        name = f"cp-{cid:012d}"
        (ckpt / name).mkdir(mode=0o700)
        for role, entry in doc["files"].items():
            entry["path"] = f"{name}/{entry['path'].rsplit('/', 1)[1]}"
            (ckpt / entry["path"]).write_bytes(blobs[role])
        # the epoch stays the first one's: its receipts file names it
        doc.update(id=cid, parent=cid - 1 if cid > 1 else None,
                   created_ms=base_ms + cid * 1000)
        (ckpt / name / "MANIFEST.json").write_bytes(mf.seal(doc, None))
