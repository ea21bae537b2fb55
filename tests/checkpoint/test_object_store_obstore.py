"""Which client S3Objects sends its requests with, on a real server (SeaweedFS):
obstore with the credentials in the environment (a whole ``sealstream run`` with its
checkpoints in S3 then never imports botocore), botocore when only botocore's chain
finds them (a shared credentials file) or the shared config file sets what obstore
would ignore, botocore for the parts of a large object on both; and the writes of one
client are the versions of the other (the same ETags, the same conflicts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import sealstream
from sealstream._objects import ObjectExistsError, ObjectStoreError, VersionConflictError
from sealstream._objects.s3 import S3Objects
from sealstream.testing.specs import files_source, spec_text, tumbling

SRC = Path(sealstream.__file__).resolve().parents[1]

#: runs the job in this process, then writes one object larger than multipart_bytes,
#: saying after each whether botocore was imported
_SCRIPT = """
import sys
from sealstream.cli import cli
code = cli.main(["run", "spec.toml", "--quiet"], prog_name="sealstream",
                standalone_mode=False)
print("RUN", code or 0, "botocore" in sys.modules, "obstore" in sys.modules, flush=True)
from sealstream._objects.s3 import S3Objects
from sealstream.testing.specs import files_source, spec_text, tumbling
objects = S3Objects.from_url(sys.argv[1] + "-big")
print("BACKEND", objects.backend, flush=True)
objects.multipart_bytes = 5 * 1024 * 1024
big = bytes(range(256)) * (6 * 4096)  # 6 MiB: two parts
assert objects.create("big", big) is True
assert objects.get("big") == big
print("BIG", "botocore" in sys.modules, flush=True)
"""


@pytest.fixture
def s3_env(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SEALSTREAM_S3_CLIENT", raising=False)  # auto
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/sealstream-test/config")
    return s3_server


def _url(server: Any) -> str:
    return f"s3://{server.bucket}/obstore-{uuid.uuid4().hex[:12]}"


def test_a_run_with_env_credentials_never_imports_botocore(s3_env: Any,
                                                           tmp_path: Path) -> None:
    url = _url(s3_env)
    rows = [{"user": f"u{i % 3}", "ts": 1_000 * (i // 4), "amount": i} for i in range(40)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "spec.toml").write_text(spec_text(
        "obstore-light", files_source(["in.jsonl"]), max_delay_ms=0,
        window=tumbling(1000), checkpoint=f"url = {json.dumps(url)}"))
    env = {k: v for k, v in os.environ.items() if k != "SEALSTREAM_S3_CLIENT"}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, url], cwd=tmp_path,
                          env={**env, "PYTHONPATH": str(SRC)}, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "RUN 0 False True" in lines, proc.stdout  # the run: obstore, no botocore
    assert "BACKEND obstore" in lines, proc.stdout
    assert "BIG True" in lines, proc.stdout  # the parts of a large object: botocore
    assert list((tmp_path / "out").glob("*.jsonl"))
    objects = S3Objects.from_url(url)
    assert objects.backend == "obstore"
    assert any(k.endswith("MANIFEST.json") for k in objects.keys()), objects.keys()


def test_credentials_only_botocore_finds_use_botocore(s3_env: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = {s3_env.access_key}\n"
                     f"aws_secret_access_key = {s3_env.secret_key}\n")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    objects = S3Objects.from_url(_url(s3_env))
    assert objects.backend == "botocore"
    assert objects.create("a", b"1") is True and objects.get("a") == b"1"
    monkeypatch.setenv("SEALSTREAM_S3_CLIENT", "obstore")  # asked for: one line, why
    with pytest.raises(ObjectStoreError, match="not in the environment") as info:
        S3Objects.from_url(_url(s3_env))
    assert "\n" not in str(info.value) and s3_env.secret_key not in str(info.value)


def test_a_config_file_setting_obstore_would_ignore_uses_botocore(
        s3_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config"
    config.write_text("[profile other]\ns3 =\n  addressing_style = path\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    assert S3Objects.from_url(_url(s3_env)).backend == "obstore"  # another profile
    monkeypatch.setenv("AWS_PROFILE", "other")
    objects = S3Objects.from_url(_url(s3_env))
    assert objects.backend == "botocore"
    assert objects.create("a", b"1") is True
    config.write_text("[default]\nregion = us-east-1\noutput = json\n")
    monkeypatch.delenv("AWS_PROFILE")
    assert S3Objects.from_url(_url(s3_env)).backend == "obstore"  # region also in env
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    assert S3Objects.from_url(_url(s3_env)).backend == "botocore"  # only in the file


def test_a_bad_switch_is_one_line(s3_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEALSTREAM_S3_CLIENT", "curl")
    with pytest.raises(ObjectStoreError, match="SEALSTREAM_S3_CLIENT='curl'"):
        S3Objects.from_url(_url(s3_env))


def test_the_two_clients_share_versions_and_conflicts(s3_env: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    url = _url(s3_env)
    fast = S3Objects.from_url(url)
    monkeypatch.setenv("SEALSTREAM_S3_CLIENT", "botocore")
    boto = S3Objects.from_url(url)
    assert (fast.backend, boto.backend) == ("obstore", "botocore")
    v1 = fast.replace("LEASE", b"one", None)
    got = boto.read_versioned("LEASE")
    assert got == (b"one", v1) and boto.head("LEASE") == fast.head("LEASE") == (3, v1)
    v2 = boto.replace("LEASE", b"two", v1)
    with pytest.raises(VersionConflictError):
        fast.replace("LEASE", b"three", v1)  # stale: the other client replaced it
    assert fast.replace("LEASE", b"two", v1) == v2  # our own write, its answer lost
    with pytest.raises(VersionConflictError):
        boto.replace("LEASE", b"x", None)  # only if absent: it is there
    assert boto.create("k", b"same") is True
    assert fast.create("k", b"same") is False
    with pytest.raises(ObjectExistsError):
        fast.create("k", b"other")
    assert fast.keys() == boto.keys() == ["LEASE", "k"]
