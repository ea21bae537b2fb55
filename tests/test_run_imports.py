"""``sealstream run`` imports only what its spec needs.

A JSONL -> JSONL job with a checkpoint directory must not load the clients of the
servers it does not talk to (PostgreSQL, Kafka, NATS, S3, Ray), the console's web
stack, SQLite, the ``cryptography`` package (only needed for public-key signatures
and encryption keys), nor sealstream's own modules for those (the Kafka and database
sinks, ``[[enrich]]``, the CLI's other commands): each is start-up time every run,
and every test that starts ``sealstream`` in a subprocess, pays for nothing.

What was imported is read from ``python -X importtime``'s report (every module the
process imported, up to its exit), never from timing.
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
NEVER_FOR_JSONL = (
    "psycopg", "psycopg_pool", "confluent_kafka", "nats", "boto3", "botocore", "obstore",
    "ray", "starlette", "uvicorn", "rich", "langgraph", "sqlite3", "cryptography",
    "sealstream.sinks.kafka", "sealstream.sinks.database", "sealstream.enrich",
    "sealstream.cli._agents", "sealstream.cli._console", "sealstream.cli._compare",
    "sealstream.cli._archive", "sealstream.cli._guard",
)
SPEC = """[pipeline]
name = "light"

[source]
kind = "jsonl"
paths = ["in.jsonl"]
key = "user"
time = "ts"

[watermark]
max_delay_ms = 0

[window]
kind = "tumbling"
size_ms = 1000

[aggregates]
n = "count"
total = "sum(amount)"

[sink]
kind = "jsonl"
path = "out"

[errors]
kind = "jsonl"
path = "errors"

[checkpoint]
path = "ckpt"
"""


def _run(tmp_path: Path, *args: str, env: dict[str, str] | None = None
         ) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """``sealstream`` ``args`` under ``-X importtime``: the modules it imported."""
    if env is None:  # no key configured: nothing to sign or encrypt with a public key
        env = {k: v for k, v in os.environ.items() if not k.startswith("SEALSTREAM_")}
    full_env = dict(env, PYTHONPATH=str(SRC))
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "sealstream", *args],
                          cwd=tmp_path, env=full_env, capture_output=True, text=True,
                          timeout=600, check=False)
    modules = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
               if line.startswith("import time:") and line.count("|") == 2}
    return modules, proc


def _loaded(modules: set[str], name: str) -> bool:
    return any(m == name or m.startswith(name + ".") for m in modules)


def _job(tmp_path: Path) -> None:
    rows = [{"user": f"u{i % 3}", "ts": 1_000 * (i // 4), "amount": i} for i in range(40)]
    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"user": "u1", "ts": "soon"}\n')
    (tmp_path / "spec.toml").write_text(SPEC)


def test_a_jsonl_run_imports_no_client_nor_module_it_does_not_use(tmp_path: Path) -> None:
    _job(tmp_path)
    modules, proc = _run(tmp_path, "run", "spec.toml", "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "polars" in modules and "sealstream._runtime.engine" in modules  # report read
    assert list((tmp_path / "out").glob("*.jsonl")) and list((tmp_path / "errors").glob("*"))
    loaded = [name for name in NEVER_FOR_JSONL if _loaded(modules, name)]
    assert loaded == [], f"a JSONL -> JSONL run imported {loaded}"
    # and a second run resumes from the checkpoint it wrote (the guard reads it back)
    modules, proc = _run(tmp_path, "checkpoints", "verify", "ckpt")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not _loaded(modules, "cryptography")


def test_a_signing_key_still_signs_with_ed25519(tmp_path: Path) -> None:
    """The lazily imported ``cryptography`` is there when the spec's run needs it."""
    _job(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEALSTREAM_")}
    env["SEALSTREAM_SIGNING_KEY"] = "11" * 32  # 32 raw bytes as hex
    modules, proc = _run(tmp_path, "run", "spec.toml", "--quiet", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _loaded(modules, "cryptography")
    manifests = sorted((tmp_path / "ckpt").rglob("MANIFEST.json"))
    assert manifests, sorted(p.name for p in (tmp_path / "ckpt").rglob("*"))
    sig = json.loads(manifests[-1].read_text())["signature"]
    assert isinstance(sig, dict) and sig["alg"] == "ed25519", sig
    _, proc = _run(tmp_path, "checkpoints", "verify", "ckpt", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("argv", [["keys", "--help"], ["receipts", "export", "--help"],
                                  ["agents", "--help"], ["compare", "--help"]])
def test_the_commands_imported_on_use_still_answer(tmp_path: Path, argv: list[str]) -> None:
    from click.testing import CliRunner

    from sealstream.cli import cli

    res = CliRunner().invoke(cli, argv)
    assert res.exit_code == 0, res.output
    assert res.output.startswith("Usage: ")


def test_the_engine_names_the_enrich_manifest_field_as_enrich_does() -> None:
    from sealstream._runtime import engine
    from sealstream.enrich import MANIFEST_FIELD

    assert engine.ENRICH_FIELD == MANIFEST_FIELD
