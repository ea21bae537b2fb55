"""The shape under the pipeline model: the rooms the model's settings are compiled by
never import the model (no import circle through it)."""

from __future__ import annotations

import ast
from pathlib import Path

import sealstream

SRC = Path(sealstream.__file__).parent
BELOW_MODEL = ["aggspec.py", "transforms", "sources", "state", "watermark.py", "errors.py"]


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside functions (lazy imports too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_nothing_below_the_model_imports_it_or_the_windows() -> None:
    offenders = []
    for room in BELOW_MODEL:
        base = SRC / room
        files = [base] if base.is_file() else sorted(base.rglob("*.py"))
        for f in files:
            for mod in _imports(f):
                if mod.startswith(("sealstream.pipeline", "sealstream.windows")):
                    offenders.append(f"{f.relative_to(SRC)} imports {mod}")
    assert offenders == []
