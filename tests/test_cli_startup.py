"""Commands that read no data start without the columnar libraries.

``--help``, ``--version`` and ``import sealstream`` must not import Polars,
PyArrow or NumPy (0.5-1 s of startup): the engine is imported by the commands
that need it. Checked in a fresh interpreter's ``sys.modules``, never by timing.
"""

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


def _loaded_after(code: str) -> tuple[list[str], str]:
    probe = (f"{code}\nimport sys, json\nsys.stdout.flush()\n"
             f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)")
    env = dict(os.environ, PYTHONPATH=str(SRC))
    res = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(res.stderr.strip().splitlines()[-1]), res.stdout


@pytest.mark.parametrize("argv", [
    ["--version"], ["--help"], ["run", "--help"], ["checkpoints", "list", "--help"],
    ["checkpoints", "verify", "--help"], ["replay", "--help"],
])
def test_cli_without_data_imports_no_columnar_library(argv: list[str]) -> None:
    loaded, out = _loaded_after(
        f"from sealstream.cli import main\nassert main({argv!r}) == 0")
    assert loaded == [], f"sealstream {' '.join(argv)} imported {loaded}"
    assert out.strip()  # the command did print its help or version


def test_import_sealstream_is_light_and_its_names_still_resolve() -> None:
    loaded, _ = _loaded_after("import sealstream\nassert sealstream.__version__")
    assert loaded == []
    loaded, out = _loaded_after(
        "import sealstream as ss\nprint(ss.Pipeline.__name__, ss.load_spec.__name__, "
        "ss.Job.__name__, sorted(ss.__all__) == ss.__all__)")
    assert out.split() == ["Pipeline", "load_spec", "Job", "True"]
    assert "polars" in loaded  # the engine's names bring the engine


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        sealstream.no_such_name  # noqa: B018


def test_import_agents_loads_no_columnar_library() -> None:
    """The agents' checkpoints and ledger live in rows: they need SQLite, not Polars."""
    loaded, _ = _loaded_after("import sealstream.agents\nimport sealstream.agents.store")
    assert loaded == []
