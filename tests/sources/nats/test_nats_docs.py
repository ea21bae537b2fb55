"""The NATS examples of docs/nats.md and the README run as written (against the tests'
server instead of 127.0.0.1:4222)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]


def _block(md: Path, lang: str, after: str = "") -> str:
    text = md.read_text(encoding="utf-8")
    if after:
        text = text[text.index(after):]
    m = re.search(rf"```{lang}\n(.*?)```", text, re.S)
    assert m, f"{md.name}: no {lang} block"
    return m.group(1)


def test_the_docs_and_readme_examples_run(nats_server: Any, tmp_path: Path) -> None:
    env = {**os.environ, "NATS_URL": nats_server.url}
    publisher = tmp_path / "publish.py"
    publisher.write_text(_block(ROOT / "docs" / "nats.md", "python"))
    res = subprocess.run([sys.executable, str(publisher)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    for name, md, after in (("docs", ROOT / "docs" / "nats.md", "## A runnable example"),
                            ("readme", ROOT / "README.md", "## NATS to files")):
        d = tmp_path / name
        d.mkdir()
        spec = _block(md, "toml", after).replace("nats://127.0.0.1:4222", nats_server.url)
        (d / "orders.toml").write_text(spec)
        res = subprocess.run([sys.executable, "-m", "sealstream", "run", "orders.toml",
                              "--quiet"], cwd=d, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        rows = [json.loads(x) for f in sorted((d / "orders-per-minute").glob("*.jsonl"))
                for x in f.read_text().splitlines()]
        late = [x for f in sorted((d / "late").glob("*.jsonl")) if (d / "late").is_dir()
                for x in f.read_text().splitlines()]
        assert sum(r["orders"] for r in rows) + len(late) == 2_000
