"""``import sealstream.agents`` (and its modules) loads neither Polars, PyArrow nor
NumPy: agent checkpoints live in rows and need SQLite or psycopg, not the columnar
engine. Checked in a fresh interpreter's ``sys.modules``, never by timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sealstream

SRC = Path(sealstream.__file__).resolve().parents[1]  # the package under test
HEAVY = ("polars", "pyarrow", "numpy")


def _loaded_after(code: str) -> list[str]:
    probe = (f"{code}\nimport sys, json\n"
             f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    env = dict(os.environ, PYTHONPATH=str(SRC))
    res = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    return list(json.loads(res.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("module", [
    "sealstream.agents", "sealstream.agents.checkpoint", "sealstream.agents.ledger",
    "sealstream.agents.store", "sealstream.agents.judge",
])
def test_import_agents_loads_no_columnar_library(module: str) -> None:
    assert _loaded_after(f"import {module}") == []


def test_agent_store_round_trip_loads_no_columnar_library(tmp_path: Path) -> None:
    code = ("import sealstream.agents as a\n"
            f"s = a.AgentCheckpointStore({str(tmp_path / 'a.db')!r}, key=b'k', "
            "encryption_key=None)\n"
            "s.save(a.AgentCheckpoint('e', state={'n': 1}))\n"
            "assert s.latest('e').state == {'n': 1}\ns.close()")
    assert _loaded_after(code) == []


def test_langgraph_saver_loads_no_columnar_library() -> None:
    pytest.importorskip("langgraph.checkpoint.base")
    assert _loaded_after("import sealstream.agents.langgraph") == []
