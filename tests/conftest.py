"""Shared fixtures: a fresh PostgreSQL database per test.

The server's URL comes from ``SEALSTREAM_TEST_PG`` (``make test`` and ``.ci/run``
set it from ``scripts/pg-test-server``). Without a reachable server the
PostgreSQL tests skip with the reason, unless ``SEALSTREAM_REQUIRE_PG=1`` (set by
``.ci/run``), which turns that skip into a failure.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest


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
