"""docs/guard.md's example runs as written on a real checkpoint and prints what it says."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest
from _story import make_input, run, write_spec

DOC = Path(__file__).resolve().parents[2] / "docs" / "guard.md"


def _blocks() -> tuple[str, str]:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("### Example on a real checkpoint"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    shown = re.search(r"prints,.*?```\n(.*?)```", section, re.S)
    assert code and shown
    return code.group(1), shown.group(1)


def test_the_guard_page_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_spec(tmp_path, make_input(tmp_path), keep=20)
    assert run(spec).returncode == 0
    code, shown = _blocks()
    (tmp_path / "example.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SEALSTREAM_CHECKPOINT_KEY", raising=False)
    runpy.run_path(str(tmp_path / "example.py"), run_name="__main__")
    assert capsys.readouterr().out == shown
