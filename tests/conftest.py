"""Shared fixtures: a fresh PostgreSQL database per test.

The server's URL comes from ``SEALSTREAM_TEST_PG`` (``make test`` and ``.ci/run``
set it from ``scripts/pg-test-server``). Without a reachable server the
PostgreSQL tests skip with the reason, unless ``SEALSTREAM_REQUIRE_PG=1`` (set by
``.ci/run``), which turns that skip into a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_OWN_CACHE: list[str] = []


#: where each xdist worker writes what it was doing and Python's fault dump, so that a
#: worker that dies ("worker 'gw0' crashed while running ...", and nothing else) is
#: reported with its last words: set by the controller, inherited by its workers
_FAULTS_ENV = "SEALSTREAM_TEST_FAULTS_DIR"


def pytest_configure(config: pytest.Config) -> None:
    """Tests and the sealstream processes they start keep the S3 client's model cache
    (``sealstream._objects._boto``) in a directory of their own, not in the user's
    ``~/.cache``: CI leaves nothing behind, and each run starts from no cache."""
    if "SEALSTREAM_CACHE_DIR" not in os.environ:
        _OWN_CACHE.append(tempfile.mkdtemp(prefix="sealstream-test-cache-"))
        os.environ["SEALSTREAM_CACHE_DIR"] = _OWN_CACHE[-1]
    if getattr(config, "workerinput", None) is None:
        if _FAULTS_ENV not in os.environ:
            _OWN_CACHE.append(tempfile.mkdtemp(prefix="sealstream-test-faults-"))
            os.environ[_FAULTS_ENV] = _OWN_CACHE[-1]


_FAULT_LOG: list[Any] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    # here, not in pytest_configure: after pytest's faulthandler plugin has pointed the
    # fault dump at stderr, which is lost with the worker
    worker = getattr(session.config, "workerinput", None)
    if worker is not None and os.environ.get(_FAULTS_ENV):
        _start_fault_log(Path(os.environ[_FAULTS_ENV]) / f"{worker['workerid']}.log")


def _start_fault_log(path: Path) -> None:
    """This worker's PID, each test it starts, and (on SIGSEGV, SIGABRT, SIGBUS, SIGFPE,
    SIGILL) every thread's Python stack, in ``path``."""
    import faulthandler

    f = open(path, "a", buffering=1)  # noqa: SIM115 - open for the worker's life
    f.write(f"pid {os.getpid()}\n")
    faulthandler.enable(file=f, all_threads=True)
    _FAULT_LOG.append(f)


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    if _FAULT_LOG:
        _FAULT_LOG[0].write(f"{time.strftime('%H:%M:%S')} {nodeid}\n")


_PLUMBING = r"/site-packages/(pluggy|_pytest|execnet|xdist)/|^Extension modules"


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: Any, sched: Any) -> None:
    """Add the crashed worker's last words to its report: the tail of its fault log
    and of the Ray driver log its PID wrote (Ray ends a driver whose raylet or GCS is
    gone with a line there, not on the worker's captured stderr)."""
    d = os.environ.get(_FAULTS_ENV)
    node = getattr(report, "node", None)
    if not d or node is None:
        return
    log = Path(d) / f"{node.gateway.id}.log"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    fatal = [i for i, ln in enumerate(lines) if ln.startswith("Fatal Python error")]
    # the dump's own frames, without pytest's and xdist's (they are the same every time)
    dump = [ln for ln in lines[fatal[-1]:] if not re.search(_PLUMBING, ln)] if fatal else []
    started = [ln for ln in lines if re.match(r"\d\d:\d\d:\d\d ", ln)]
    extra = [f"{log} (the last tests it started, then its fault dump if any):",
             *started[-3:], *dump[:80]]
    pids = [ln.split()[1] for ln in lines if ln.startswith("pid ")]
    if pids:
        import glob

        for ray_log in sorted(glob.glob(f"/tmp/ray/session_*/logs/python-core-driver-*_"
                                        f"{pids[-1]}.log"))[-2:]:
            tail = Path(ray_log).read_text(errors="replace").splitlines()[-25:]
            extra += [f"{ray_log}:", *tail]
    report.longrepr = f"{report.longrepr}\n" + "\n".join(extra)


def pytest_unconfigure(config: pytest.Config) -> None:
    for f in _FAULT_LOG:
        f.close()
    if getattr(config, "workerinput", None) is not None:
        return  # the controller removes the directories
    for path in _OWN_CACHE:
        shutil.rmtree(path, ignore_errors=True)
        for k in ("SEALSTREAM_CACHE_DIR", _FAULTS_ENV):
            if os.environ.get(k) == path:
                del os.environ[k]


#: the settings a test must not leave behind: sealstream's own and S3 credentials. The
#: runs a later test starts inherit this process's environment, so a leaked
#: ``SEALSTREAM_PG_RETRY_S=3`` (``sealstream console`` set it in-process) failed an
#: unrelated test that expects the default 30 s, in CI, on whichever worker ran both.
_GUARDED = ("SEALSTREAM_", "AWS_")


def _guarded_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(_GUARDED)}


@pytest.fixture(autouse=True)
def _no_leaked_settings() -> Iterator[None]:
    """Fail the test that changes a guarded variable without putting it back (and put
    it back, so the tests after it run in the environment they expect)."""
    before = _guarded_env()
    yield
    after = _guarded_env()
    if after != before:
        for k in set(after) - set(before):
            del os.environ[k]
        os.environ.update(before)
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        pytest.fail(f"the test left the environment changed: {', '.join(changed)}",
                    pytrace=False)


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
