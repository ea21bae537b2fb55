"""The test S3 server itself: SeaweedFS on loopback, signed requests only, data kept
across a SIGKILL and a restart, stopped by its PID, its temporary data removed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sealstream.testing.brokers import SeaweedServer


def test_s3_server_refuses_a_second_create_and_keeps_data_across_a_crash(own_s3) -> None:  # type: ignore[no-untyped-def]
    from botocore.exceptions import ClientError

    server: SeaweedServer = own_s3
    c = server.client()
    c.put_object(Bucket=server.bucket, Key="k", Body=b"one", IfNoneMatch="*")
    with pytest.raises(ClientError) as info:
        c.put_object(Bucket=server.bucket, Key="k", Body=b"two", IfNoneMatch="*")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    pid = server.pid
    assert pid is not None
    server.kill()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    server.start()  # same ports, same data
    body = server.client().get_object(Bucket=server.bucket, Key="k")["Body"].read()
    assert body == b"one"


def test_s3_server_refuses_unsigned_and_wrongly_signed_requests(s3_server) -> None:  # type: ignore[no-untyped-def]
    import boto3
    from botocore.exceptions import ClientError

    bad = boto3.client("s3", endpoint_url=s3_server.endpoint, aws_access_key_id="nobody",
                       aws_secret_access_key="wrong", region_name="us-east-1")
    with pytest.raises(ClientError) as info:
        bad.put_object(Bucket=s3_server.bucket, Key="x", Body=b"x")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_s3_server_close_removes_its_data(tmp_path: Path) -> None:
    server = SeaweedServer()
    server.start()
    pid, data = server.pid, server.data_dir
    assert pid is not None and data.is_dir()
    server.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not data.exists()


def test_brokers_s3_command_prints_the_variables_and_stops_on_sigterm(tmp_path: Path) -> None:
    with subprocess.Popen([sys.executable, "-m", "sealstream.testing.brokers", "s3",
                           "--data-dir", str(tmp_path / "d")],
                          stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}) as proc:
        _talk_then_stop(proc)
    assert (tmp_path / "d").is_dir()  # a data directory given is kept


def _talk_then_stop(proc: subprocess.Popen[str]) -> None:
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(5)]
        env = dict(line.removeprefix("export ").strip().split("=", 1) for line in lines)
        assert env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
        import boto3

        c = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                         aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                         aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
        c.put_object(Bucket="sealstream", Key="hello", Body=b"hi")
    finally:
        proc.terminate()
        assert proc.wait(60) == 0
