"""The proof commands' edges (issue 31): a window asked for without the public key it
needs says the key is missing, an error names its checkpoint once, a missing store is
exit 2 whatever kind it is, and `receipts verify --checkpoints` takes any store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
if str(SCENARIOS) not in sys.path:
    sys.path.insert(0, str(SCENARIOS))

from _story import committed, in_process, make_input, run, write_spec  # noqa: E402

from sealstream.checkpoint import manifest as mf  # noqa: E402
from sealstream.checkpoint import signing  # noqa: E402


def _auditor_env(public: Path | None = None, **more: str) -> dict[str, str]:
    """Someone holding only the public key (or no key at all)."""
    e = {k: v for k, v in os.environ.items()
         if k not in (mf.KEY_ENV, signing.SIGNING_KEY_ENV, signing.SIGNING_KEY_FILE_ENV,
                      signing.VERIFY_KEYS_ENV)}
    if public is not None:
        e[signing.VERIFY_KEYS_ENV] = str(public)
    e.update(more)
    return e


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``sealstream ARGS`` in this process (an inspection command needs no process of
    its own; a subprocess costs a Python start and the Polars/Arrow imports), with
    exactly ``env`` as its environment: every other variable is unset for the call."""
    return in_process(*args, env={**dict.fromkeys(os.environ), **env})


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished job signed with an Ed25519 key."""
    d = tmp_path_factory.mktemp("signed")
    signing.generate(d / "keys")
    spec = write_spec(d / "job", make_input(d / "job", events=200), keep=20)
    res = run(spec, env={signing.SIGNING_KEY_FILE_ENV: str(d / "keys" / signing.PRIVATE_NAME)})
    assert res.returncode == 0, res.stderr
    return d


def _window_args(store: str, r: dict[str, Any]) -> list[str]:
    return ["checkpoints", "window", store, "--key", str(r["key"]), "--start",
            str(r["window_start"]), "--end", str(r["window_end"]), "--json"]


def test_require_receipts_without_any_public_key_says_the_key_is_missing(signed: Path
                                                                         ) -> None:
    first = committed(signed / "job", "out")[0]
    args = _window_args(str(signed / "job" / "ckpt"), first)
    res = _cli(*args, "--require-receipts", env=_auditor_env())
    assert res.returncode == 1, res.stderr
    m = json.loads(res.stdout)["manifest"]
    # the receipt is missing only because the checkpoint could not be verified
    assert (m["verdict"], m["reason"]) == ("INCONSISTENT_STATE", signing.NO_PUBLIC_KEY), m
    assert "SEALSTREAM_VERIFY_KEYS" in m["directive"]
    # with the public key the same question proves the window
    res = _cli(*args, "--require-receipts",
               env=_auditor_env(signed / "keys" / signing.PUBLIC_NAME))
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout)["manifest"]["verdict"] == "ATOMIC_CHECKPOINT"


def test_an_error_names_its_checkpoint_once(signed: Path, tmp_path: Path) -> None:
    store = str(signed / "job" / "ckpt")
    newest = max(int(p.name[3:]) for p in (signed / "job" / "ckpt").glob("cp-*"))
    for args in (["receipts", "export", store, "--epochs", "1..9", "--to",
                  str(tmp_path / "p.jsonl")],
                 ["receipts", "export", store, "--key", "u1", "--to",
                  str(tmp_path / "p.jsonl")]):
        res = _cli(*args, env=_auditor_env())
        assert res.returncode == 1, res.stdout + res.stderr
        line = res.stderr.strip()
        assert len(line.splitlines()) == 1, line
        assert line.count(f"checkpoint {newest}:") == 1, line
        assert signing.NO_PUBLIC_KEY in line


def _missing(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, dict]:
    """The URL of a store that does not exist, and the environment to reach its kind."""
    if kind == "directory":
        return str(tmp_path / "nowhere"), {}
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'nowhere.db'}", {}
    if kind == "postgresql":
        url = str(request.getfixturevalue("pg_url"))
        base, _, _db = url.rpartition("/")
        return f"{base}/sealstream_no_such_db", {}
    server = request.getfixturevalue("s3_server")
    env = dict(server.env())
    if kind == "s3-bucket":
        return "s3://sealstream-no-such-bucket/job", env
    return f"s3://{server.bucket}/no/such/store", env


@pytest.mark.parametrize("kind", ["directory", "sqlite", "postgresql", "s3-bucket",
                                  "s3-prefix"])
def test_a_missing_store_is_exit_2_on_every_kind(kind: str, tmp_path: Path,
                                                 request: pytest.FixtureRequest) -> None:
    url, env = _missing(kind, tmp_path, request)
    for args in (["checkpoints", "verify", url], ["checkpoints", "list", url],
                 ["receipts", "consistency", url, "1", "2"]):
        res = _cli(*args, env=_auditor_env(**env))
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert "does not exist" in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_receipts_verify_takes_a_store_url(tmp_path: Path) -> None:
    signing.generate(tmp_path / "keys")
    job = tmp_path / "job"
    spec = write_spec(job, make_input(job, events=200), keep=20)
    spec.write_text(spec.read_text().replace('path = "ckpt"', 'url = "sqlite:///ckpt.db"'))
    res = run(spec, env={signing.SIGNING_KEY_FILE_ENV: str(tmp_path / "keys" /
                                                           signing.PRIVATE_NAME)})
    assert res.returncode == 0, res.stderr
    url = f"sqlite:///{job / 'ckpt.db'}"
    auditor = _auditor_env(tmp_path / "keys" / signing.PUBLIC_NAME)
    res = _cli(*_window_args(url, committed(job, "out")[-1]), env=auditor)
    assert res.returncode == 0, res.stdout + res.stderr
    (tmp_path / "w.json").write_text(res.stdout)
    res = _cli("receipts", "verify", str(tmp_path / "w.json"), "--checkpoints", url,
               env=auditor)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines()[-1] == "1 proof checked, 0 failed"
    # a flipped proof still fails against the database's manifests
    data = json.loads((tmp_path / "w.json").read_text())
    rec = data["checkpoint"]["output_emission_receipt"]
    rec["epoch_root"] = ("0" if rec["epoch_root"][0] != "0" else "1") + rec["epoch_root"][1:]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    res = _cli("receipts", "verify", str(tmp_path / "bad.json"), "--checkpoints", url,
               env=auditor)
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stdout.splitlines()[-1] == "1 proof checked, 1 failed"
