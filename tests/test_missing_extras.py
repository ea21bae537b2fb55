"""A spec that needs an optional dependency that is not installed: one line naming the
extra to install, exit 2, never a ModuleNotFoundError traceback. The module is hidden
from a subprocess by a sitecustomize shim (``sys.modules[name] = None``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIM = """import sys
for name in {names!r}:
    sys.modules[name] = None
"""
COMMON = """
key = "user"
time = "ts"

[window]
kind = "tumbling"
size_ms = 1000

[aggregates]
n = "count"
"""
CASES = {
    "kafka": ('[source]\nkind = "kafka"\nbootstrap = "127.0.0.1:9"\ntopic = "t"\nstop = "end"',
              '[sink]\nkind = "jsonl"\npath = "out"', ["confluent_kafka"]),
    "nats": ('[source]\nkind = "nats"\nservers = "nats://127.0.0.1:9"\nstream = "s"\n'
             'subjects = ["a"]\nstop = "end"', '[sink]\nkind = "jsonl"\npath = "out"', ["nats"]),
    "postgres": ('[source]\nkind = "jsonl"\npaths = ["in.jsonl"]',
                 '[sink]\nkind = "postgresql"\nurl = "postgresql://u@127.0.0.1:9/db"\n'
                 'table = "t"', ["psycopg", "psycopg_pool"]),
}


@pytest.mark.parametrize("extra", sorted(CASES))
def test_a_missing_extra_is_one_line_naming_it(tmp_path: Path, extra: str) -> None:
    source, sink, modules = CASES[extra]
    (tmp_path / "shim").mkdir()
    (tmp_path / "shim" / "sitecustomize.py").write_text(SHIM.format(names=modules))
    (tmp_path / "in.jsonl").write_text('{"user": "a", "ts": 1}\n')
    spec = tmp_path / "spec.toml"
    spec.write_text(f'[pipeline]\nname = "p"\n\n{source}{COMMON}\n{sink}\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "shim"), str(ROOT / "src")]))
    proc = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        f"sealstream: error: the '{extra}' extra is not installed (Python module "
        f"'{modules[0]}' is missing): pip install 'sealstream[{extra}]'"]


def test_the_kafka_trial_broker_without_noida_db_is_one_line(tmp_path: Path) -> None:
    """``python -m sealstream.testing.brokers kafka`` without noida-db: one line, exit 1,
    and no empty temporary folder left behind."""
    (tmp_path / "shim").mkdir()
    (tmp_path / "shim" / "sitecustomize.py").write_text(SHIM.format(names=["noida_db"]))
    (tmp_path / "tmp").mkdir()
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"),
               PYTHONPATH=os.pathsep.join([str(tmp_path / "shim"), str(ROOT / "src")]))
    proc = subprocess.run([sys.executable, "-m", "sealstream.testing.brokers", "kafka"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "python -m sealstream.testing.brokers: error: noida-db is not installed "
        "(pip install 'noida-db==0.2.3')"]
    assert list((tmp_path / "tmp").iterdir()) == []
