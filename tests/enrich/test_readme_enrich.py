"""The README's enrichment example runs as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sealstream.checkpoint.manifest import KEY_ENV
from sealstream.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"
TITLE = "Enrichment: orders per country, as of each order's time"


def test_the_readme_enrichment_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    text = README.read_text(encoding="utf-8")
    m = re.search(rf"## {re.escape(TITLE)}\n(?:(?!\n## ).)*?```toml\n(.*?)```", text, re.S)
    assert m, "README has no enrichment example"
    (tmp_path / "spec.toml").write_text(m.group(1))
    (tmp_path / "orders").mkdir()
    orders = [{"user": "ann", "ts": 1_000, "amount": 10}, {"user": "bob", "ts": 2_000,
                                                             "amount": 4},
              {"user": "ann", "ts": 70_000, "amount": 5}, {"user": "eve", "ts": 3_000,
                                                            "amount": 9}]
    (tmp_path / "orders" / "o.jsonl").write_text("".join(json.dumps(o) + "\n" for o in orders))
    (tmp_path / "users.csv").write_text("user,country,since\nann,FR,0\nann,DE,60000\n"
                                        "bob,FR,0\n")
    assert main(["run", str(tmp_path / "spec.toml"), "-q"]) == 0, capsys.readouterr().err
    rows = sorted((json.loads(line) for f in (tmp_path / "orders-per-country").glob("*.jsonl")
                   for line in f.read_text().splitlines()), key=lambda r: r["window_start"])
    assert rows == [
        {"country": "FR", "window_start": 0, "window_end": 60000, "orders": 2, "revenue": 14},
        {"country": "DE", "window_start": 60000, "window_end": 120000, "orders": 1,
         "revenue": 5},
    ]
    (tmp_path / "users.csv").write_text("user,country,since\nann,FR,0\nbob,FR,0\n")
    assert main(["run", str(tmp_path / "spec.toml"), "-q"]) == 1
    assert "--accept-table-change" in capsys.readouterr().err
