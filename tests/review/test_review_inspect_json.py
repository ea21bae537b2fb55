"""Every inspection command: ``--json`` is valid JSON on success, and a missing path,
a corrupt checkpoint or an ``s3://`` store whose server does not answer is one line
(``sealstream: error: ...``) with a non-zero exit, never a traceback.

The checkpoints are written by a real ``sealstream run`` (a subprocess); the commands
run in process (``sealstream.cli.main``). The S3 endpoint is a closed local port (no
server listens: the client's connection is refused), retried for 1 s.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sealstream.checkpoint.manifest import KEY_ENV
from sealstream.cli import main
from sealstream.testing.specs import files_source, spec_text, tumbling

T0 = 1_700_000_000_000

SPEC = spec_text(
    "inspect-json", files_source(["in/p0.jsonl", "in/p1.jsonl"]), key="k", batch_size=40,
    max_delay_ms=200, window=tumbling(1000),
    aggregates={"n": "count", "total": "sum(amount)"}, every_events=80, keep=10)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("inspect-json")
    (d / "in").mkdir()
    for p in range(2):
        (d / "in" / f"p{p}.jsonl").write_text("".join(
            json.dumps({"k": ["a", "b", "c"][(i + p) % 3], "ts": T0 + i * 50 + p,
                        "amount": i % 7}) + "\n" for i in range(200)))
    (d / "spec.toml").write_text(SPEC)
    env = {k: v for k, v in os.environ.items() if k not in ("SEALSTREAM_CRASH_AT", KEY_ENV)}
    res = subprocess.run([sys.executable, "-m", "sealstream", "run", "spec.toml", "--quiet"],
                         cwd=d, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert len(list((d / "ckpt").glob("cp-*"))) >= 3
    proofs = d / "proofs.jsonl"
    assert main(["receipts", "export", str(d / "ckpt"), "--epochs", "1",
                 "--to", str(proofs)]) == 0
    (d / "proof.jsonl").write_text(proofs.read_text().splitlines()[0] + "\n")
    return d


@pytest.fixture
def job(base: Path, tmp_path: Path) -> Path:
    d = tmp_path / "job"
    shutil.copytree(base, d)
    return d


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(KEY_ENV, raising=False)
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "review")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "review-secret")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("SEALSTREAM_S3_RETRY_S", "1")
    yield


def commands(store: str, out: Path) -> dict[str, list[str]]:
    """Each inspection command on ``store`` (a checkpoint directory or URL)."""
    return {
        "list": ["checkpoints", "list", store],
        "verify": ["checkpoints", "verify", store],
        "inspect": ["checkpoints", "inspect", store],
        "diff": ["checkpoints", "diff", store, "1", "2"],
        "export": ["checkpoints", "export", store, "--to", str(out / "open.jsonl")],
        "window": ["checkpoints", "window", store, "--key", "a", "--start", str(T0),
                   "--end", str(T0 + 1000)],
        "prune": ["checkpoints", "prune", store, "--keep", "2", "--dry-run"],
        "consistency": ["receipts", "consistency", store, "1", "2"],
        "receipts-export": ["receipts", "export", store, "--epochs", "1",
                            "--to", str(out / "proofs-again.jsonl")],
        "receipts-verify": ["receipts", "verify", str(out / "proof.jsonl"),
                            "--checkpoints", store],
        "agents-repair": ["agents", "repair", store, "--dry-run"],
    }


def run_json(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, Any, str]:
    rc = main([*args, "--json"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, (args, err)
    return rc, json.loads(out) if out.strip() else None, err


def one_line(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str]:
    """The exit code and the one error line of a refused command (nothing on stdout)."""
    rc, data, err = run_json(capsys, args)
    lines = err.splitlines()
    assert rc != 0 and data is None, (args, rc, data)
    assert len(lines) == 1 and lines[0].startswith("sealstream: error: "), (args, err)
    return rc, lines[0]


SUCCESS = ["list", "verify", "inspect", "diff", "export", "window", "prune", "consistency",
           "receipts-export", "receipts-verify"]


@pytest.mark.parametrize("name", SUCCESS)
def test_json_on_success(name: str, job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, data, err = run_json(capsys, commands(str(job / "ckpt"), job)[name])
    assert rc == 0, err
    assert isinstance(data, dict) and data


def test_compare_and_archive_json(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, data, err = run_json(capsys, ["compare", str(job / "out"), str(job / "out")])
    assert rc == 0 and data["equal"] is True, err
    # archive list/verify: one line for a spec that is missing or has no [archive]
    for sub in ("list", "verify"):
        assert one_line(capsys, ["archive", sub, str(job / "nope.toml")])[0] == 2
        rc, line = one_line(capsys, ["archive", sub, str(job / "spec.toml")])
        assert rc == 2 and "no [archive]" in line


@pytest.mark.parametrize("name", [*SUCCESS, "agents-repair"])
def test_missing_path_is_one_line(name: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "proof.jsonl").write_text("{}\n")
    missing = tmp_path / "nowhere"
    rc, line = one_line(capsys, commands(str(missing), tmp_path)[name])
    assert rc == 2 and str(missing) in line
    # the store is named as missing, not judged (before: agents repair said 'not an
    # agent store (no agent_rows table)' of a path that does not exist)
    assert "not exist" in line or "no such file" in line, line


@pytest.mark.parametrize("name", [*SUCCESS, "agents-repair"])
def test_s3_without_server_is_one_line(name: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "proof.jsonl").write_text("{}\n")
    rc, line = one_line(capsys, commands("s3://review-bucket/ck", tmp_path)[name])
    # a server fault (exit 1) that says so; before, agents repair said the prefix was
    # 'not an agent store (no agent LEASE)', a usage error (exit 2)
    assert rc == 1 and "did not answer" in line, line


def test_agents_repair_postgres_without_server_is_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, line = one_line(capsys, ["agents", "repair", f"postgresql://u:pw@127.0.0.1:{port}/db"])
    assert rc == 1 and "cannot connect" in line and "pw" not in line, line


def corrupt(job: Path) -> None:
    """Every checkpoint's manifest truncated, every state file with a flipped byte."""
    for m in (job / "ckpt").glob("cp-*/MANIFEST.json"):
        m.write_text(m.read_text()[:40])
    for s in (job / "ckpt").glob("cp-*/state.arrow"):
        data = bytearray(s.read_bytes())
        data[len(data) // 2] ^= 0xFF
        s.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["list", "verify", "inspect"])
def test_corrupt_is_reported_in_json(name: str, job: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    corrupt(job)
    rc, data, err = run_json(capsys, commands(str(job / "ckpt"), job)[name])
    assert rc == (1 if name == "verify" else 0), err
    text = json.dumps(data)
    assert "ATOMIC_CHECKPOINT" not in text.replace("PARTIAL_CHECKPOINT", ""), text
    assert "MANIFEST" in text


@pytest.mark.parametrize("name", ["diff", "export", "window", "consistency",
                                  "receipts-export"])
def test_corrupt_is_one_line(name: str, job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corrupt(job)
    rc, line = one_line(capsys, commands(str(job / "ckpt"), job)[name])
    assert rc == 1 and "manifest" in line, line


def test_corrupt_receipts_verify_and_prune(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corrupt(job)
    rc, data, err = run_json(capsys, commands(str(job / "ckpt"), job)["receipts-verify"])
    assert rc == 1 and data["verified"] == 0, err
    # prune refuses (nothing ATOMIC) with its JSON report and one line
    rc, data, err = run_json(capsys, commands(str(job / "ckpt"), job)["prune"])
    assert rc == 1 and data["newest_atomic"] is None
    assert len(err.splitlines()) == 1 and err.startswith("sealstream: error: "), err
