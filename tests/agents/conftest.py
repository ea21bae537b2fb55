"""Fixtures for the agent tests: one backend parameter running every contract on
SQLite (the embedded default) and on PostgreSQL (``pg_url`` from tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

SIGNING_KEY = b"agent-test-signing-key"
ENCRYPTION_KEY = bytes(range(32))


@pytest.fixture(params=["sqlite", "postgresql"])
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a fresh agent store lives: a SQLite file or a new PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agents.db'}"
    return str(request.getfixturevalue("pg_url"))
