"""Fixtures of the console's tests: a finished story run's checkpoint directory, and
clients of the console application (Starlette's TestClient) on stores."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")

from _consolekit import story  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from sealstream.checkpoint import manifest as mf  # noqa: E402


@pytest.fixture(scope="session")
def finished_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished story run with its checkpoints in a directory (copy it to change it)."""
    d = tmp_path_factory.mktemp("console-job")
    story(d, env={mf.KEY_ENV: ""})
    return d


@pytest.fixture
def job_copy(tmp_path: Path, finished_job: Path) -> Path:
    return Path(shutil.copytree(finished_job, tmp_path / "job", symlinks=True))


@pytest.fixture(autouse=True)
def _no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(mf.KEY_ENV, raising=False)
    monkeypatch.delenv("SEALSTREAM_ENCRYPTION_KEY", raising=False)
    monkeypatch.delenv("SEALSTREAM_ENCRYPTION_KEY_FILE", raising=False)


def client(*stores: str | Path, job: str | None = None, token: str | None = None
           ) -> TestClient:
    from sealstream.console import create_app

    return TestClient(create_app([str(s) for s in stores], job=job, token=token))


@pytest.fixture
def make_client() -> Iterator[Any]:
    opened: list[TestClient] = []

    def make(*stores: str | Path, job: str | None = None, token: str | None = None
             ) -> TestClient:
        c = client(*stores, job=job, token=token)
        opened.append(c)
        return c

    yield make
    for c in opened:
        c.close()


@pytest.fixture(scope="session")
def finished_sqlite_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished story run with its checkpoints in ``ckpt.db`` (SQLite), made once
    (copy it to change it: ``sqlite_job_copy``)."""
    d = tmp_path_factory.mktemp("console-sqlite-job")
    story(d, url="sqlite:///ckpt.db", env={mf.KEY_ENV: ""})
    return d


@pytest.fixture
def sqlite_job_copy(tmp_path: Path, finished_sqlite_job: Path) -> Path:
    return Path(shutil.copytree(finished_sqlite_job, tmp_path / "job", symlinks=True))
