"""The README's examples run as written."""

from __future__ import annotations

import json
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from sealstream.testing.datagen import generate

README = Path(__file__).resolve().parents[1] / "README.md"


def _block(title: str, lang: str) -> str:
    text = README.read_text(encoding="utf-8")
    m = re.search(rf"## {re.escape(title)}\n\n```{lang}\n(.*?)```", text, re.S)
    assert m, f"README has no {lang} block under '## {title}'"
    return m.group(1)


def test_python_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    generate(tmp_path / "in", events=5_000, keys=10, partitions=2)
    (tmp_path / "example.py").write_text(_block("The same in Python", "python"))
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(tmp_path / "example.py"), run_name="__main__")
    results = [json.loads(x) for f in sorted((tmp_path / "out").glob("*.jsonl"))
               for x in f.read_text().splitlines()]
    assert results and sum(r["n"] for r in results) == 5_000


def test_spec_example_runs(tmp_path: Path) -> None:
    generate(tmp_path / "in", events=5_000, keys=10, partitions=2)
    spec = tmp_path / "payments.toml"
    spec.write_text(_block("A pipeline in a spec file", "toml"))
    res = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--json"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["events"] == 5_000 and summary["checkpoints"]["count"] >= 1
