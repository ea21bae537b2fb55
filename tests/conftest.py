"""Shared fixtures: a fresh PostgreSQL database per test.

The server's URL comes from ``SEALSTREAM_TEST_PG`` (``make test`` and ``.ci/run``
set it from ``scripts/pg-test-server``). Without a reachable server the
PostgreSQL tests skip with the reason, unless ``SEALSTREAM_REQUIRE_PG=1`` (set by
``.ci/run``), which turns that skip into a failure.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator

import pytest

_OWN_CACHE: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Tests and the sealstream processes they start keep the S3 client's model cache
    (``sealstream._objects._boto``) in a directory of their own, not in the user's
    ``~/.cache``: CI leaves nothing behind, and each run starts from no cache."""
    if "SEALSTREAM_CACHE_DIR" not in os.environ:
        _OWN_CACHE.append(tempfile.mkdtemp(prefix="sealstream-test-cache-"))
        os.environ["SEALSTREAM_CACHE_DIR"] = _OWN_CACHE[-1]


def pytest_unconfigure(config: pytest.Config) -> None:
    for path in _OWN_CACHE:
        shutil.rmtree(path, ignore_errors=True)
        if os.environ.get("SEALSTREAM_CACHE_DIR") == path:
            del os.environ["SEALSTREAM_CACHE_DIR"]


def _admin_url() -> str:
    url = os.environ.get("SEALSTREAM_TEST_PG", "").strip()
    required = os.environ.get("SEALSTREAM_REQUIRE_PG") == "1"
    if not url:
        msg = "PostgreSQL not configured: SEALSTREAM_TEST_PG is not set (make test sets it)"
        if required:
            pytest.fail(msg + " and SEALSTREAM_REQUIRE_PG=1", pytrace=False)
        pytest.skip(msg)
    try:
        import psycopg
    except ImportError:  # pragma: no cover - dev extra installs it
        if required:
            pytest.fail("psycopg is not installed", pytrace=False)
        pytest.skip("psycopg is not installed")
    try:
        psycopg.connect(url, connect_timeout=5, autocommit=True).close()
    except psycopg.Error as exc:
        msg = f"PostgreSQL at SEALSTREAM_TEST_PG is not reachable: {str(exc).strip()}"
        if required:
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return url


def _with_db(url: str, db: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{db}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """The URL of a new, empty PostgreSQL database, dropped after the test."""
    import psycopg

    admin = _admin_url()
    name = f"sealstream_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_db(admin, name)
    finally:
        _drop(admin, name)


def _drop(admin: str, name: str) -> None:
    """Drop a test database; a session of another role (say, an autovacuum worker)
    may hold it for a moment, so a refused drop is retried for a few seconds."""
    import psycopg

    for attempt in range(20):
        try:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.ObjectInUse):
            if attempt == 19:
                raise
            time.sleep(0.25)


# ------------------------------------------------------------------ brokers
# One Kafka-protocol broker and one nats-server per test process (pytest-xdist
# worker), started on 127.0.0.1 with temporary data and stopped by PID. A test
# that kills or restarts its broker takes its own with ``own_kafka`` / ``own_nats``.


class KafkaForTests:
    """A broker's address and fresh, uniquely named topics on it."""

    def __init__(self, bootstrap: str, broker: object | None = None) -> None:
        self.bootstrap = bootstrap
        self.broker = broker  # a KafkaBroker when the tests started it, else None

    def new_topic(self, partitions: int = 1, **config: str) -> str:
        from sealstream.testing.brokers import create_topic

        name = f"t-{uuid.uuid4().hex[:12]}"
        create_topic(self.bootstrap, name, partitions, **config)
        return name


def _require_module(name: str, why: str) -> None:
    import importlib.util

    if importlib.util.find_spec(name) is None:
        pytest.fail(f"{name} is not installed ({why}); make test installs it", pytrace=False)


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaForTests]:
    """The tests' Kafka-protocol broker (``SEALSTREAM_TEST_KAFKA`` names a real one)."""
    from sealstream.testing.brokers import KafkaBroker, external_kafka

    _require_module("confluent_kafka", "the Kafka tests need confluent-kafka")
    ext = external_kafka()
    if ext:
        yield KafkaForTests(ext)
        return
    _require_module("noida_db", "the Kafka tests run against the noida-db broker")
    broker = KafkaBroker()
    broker.start()
    try:
        yield KafkaForTests(broker.bootstrap, broker)
    finally:
        broker.close()


@pytest.fixture
def own_kafka() -> Iterator[KafkaForTests]:
    """A broker of this test's own, which it may kill (``.broker.kill()``) and restart."""
    from sealstream.testing.brokers import KafkaBroker, external_kafka

    if external_kafka():
        pytest.skip("stops and restarts its broker: runs on the local test broker only")
    _require_module("noida_db", "the Kafka tests run against the noida-db broker")
    broker = KafkaBroker()
    broker.start()
    try:
        yield KafkaForTests(broker.bootstrap, broker)
    finally:
        broker.close()


@pytest.fixture(scope="session")
def nats_server() -> Iterator[object]:
    """The tests' nats-server with JetStream (``.url``)."""
    from sealstream.testing.brokers import NatsServer

    _require_module("nats", "the NATS tests need nats-py")
    server = NatsServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def own_nats() -> Iterator[object]:
    """A nats-server of this test's own, which it may kill and restart."""
    from sealstream.testing.brokers import NatsServer

    _require_module("nats", "the NATS tests need nats-py")
    server = NatsServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


# ------------------------------------------------------------------ object storage
@pytest.fixture(scope="session")
def s3_server() -> Iterator[object]:
    """The tests' SeaweedFS S3 server (``.endpoint``, ``.bucket``, ``.env()``)."""
    from sealstream.testing.brokers import SeaweedServer

    _require_module("boto3", "the S3 tests need boto3")
    server = SeaweedServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def own_s3() -> Iterator[object]:
    """A SeaweedFS server of this test's own, which it may kill and restart."""
    from sealstream.testing.brokers import SeaweedServer

    _require_module("boto3", "the S3 tests need boto3")
    server = SeaweedServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


# ------------------------------------------------------------------ event loops
# A test module must not leave an asyncio event loop running in the main thread: the
# next module's ``asyncio.run()`` would fail ("cannot be called from a running event
# loop"; Playwright's sync API keeps its loop running until ``stop()``). Checked once
# a module's fixtures are torn down, i.e. when the next test is in another module.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    if nextitem is None or nextitem.path == item.path:
        return
    import asyncio
    import threading

    if threading.current_thread() is threading.main_thread() and \
            asyncio._get_running_loop() is not None:
        pytest.fail(f"{item.path.name} left an asyncio event loop running in the main "
                    "thread after its fixtures were torn down", pytrace=False)
