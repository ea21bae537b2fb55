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


