"""The checkpoint store contract (sealstream.testing.store_contract), run against
the local-directory store and the SQLite store; plus what only SQLite has to show:
several pipelines sharing one database file."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from sealstream.checkpoint.stores import (
    REJECTED,
    CheckpointStore,
    LocalCheckpointStore,
    open_store,
    redact,
    sqlite_path,
)
from sealstream.checkpoint.stores.sqlite import SqliteCheckpointStore, pipelines_in
from sealstream.errors import SpecError
from sealstream.testing.store_contract import (
    PIPELINE,
    StoreContract,
)

FILES = "sealstream_checkpoint_files"


class TestLocalStore(StoreContract):
    def make_store(self, where: Path, pipeline: str = PIPELINE,
                   key: bytes | None = None) -> CheckpointStore:
        return LocalCheckpointStore(where / "ckpt", encryption_key=key)

    def tamper(self, store: CheckpointStore, rel: str, data: bytes | None) -> None:
        path = store.root / rel
        if data is None:
            path.unlink()
        else:
            path.write_bytes(data)

    def stored(self, store: CheckpointStore, rel: str) -> bytes | None:
        path = store.root / rel
        return path.read_bytes() if path.exists() else None

    def kept_aside(self, store: CheckpointStore, cid: int) -> list[bytes]:
        (moved,) = (store.root / REJECTED).glob(f"cp-{cid:012d}-*")
        return [f.read_bytes() for f in moved.iterdir()]


class TestSqliteStore(StoreContract):
    def make_store(self, where: Path, pipeline: str = PIPELINE,
                   key: bytes | None = None) -> CheckpointStore:
        return SqliteCheckpointStore(where / "ckpt.db", pipeline, encryption_key=key)

    def _sql(self, store: CheckpointStore, sql: str, *args: object) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(store.root)
        try:
            with conn:
                return conn.execute(sql, args).fetchall()
        finally:
            conn.close()

    def tamper(self, store: CheckpointStore, rel: str, data: bytes | None) -> None:
        assert isinstance(store, SqliteCheckpointStore)
        if data is None:
            self._sql(store, f"DELETE FROM {FILES} WHERE pipeline = ? AND name = ?",
                      store.pipeline, rel)
        else:
            self._sql(store, f"UPDATE {FILES} SET data = ? WHERE pipeline = ? AND name = ?",
                      data, store.pipeline, rel)

    def stored(self, store: CheckpointStore, rel: str) -> bytes | None:
        assert isinstance(store, SqliteCheckpointStore)
        rows = self._sql(store, f"SELECT data FROM {FILES} WHERE pipeline = ? AND name = ?",
                         store.pipeline, rel)
        return bytes(rows[0][0]) if rows else None

    def kept_aside(self, store: CheckpointStore, cid: int) -> list[bytes]:
        assert isinstance(store, SqliteCheckpointStore)
        rows = self._sql(store, "SELECT data FROM sealstream_rejected WHERE pipeline = ? "
                         "AND id = ?",
                         store.pipeline, cid)
        return [bytes(r[0]) for r in rows]

    def test_wal_and_one_file(self, tmp_path: Path) -> None:
        store = self.make_store(tmp_path)
        store.ensure_root()
        assert self._sql(store, "PRAGMA journal_mode") == [("wal",)]
        assert (tmp_path / "ckpt.db").stat().st_mode & 0o077 == 0

    def pipelines_in(self, store: CheckpointStore) -> list[str] | None:
        return pipelines_in(store.root)


def test_urls() -> None:
    assert sqlite_path("sqlite:///ckpt.db", Path("/spec")) == Path("/spec/ckpt.db")
    assert sqlite_path("sqlite:////abs/x.db", Path("/spec")) == Path("/abs/x.db")
    assert redact("postgresql://bob:s3cret@db:5432/x") == "postgresql://bob:***@db:5432/x"
    with pytest.raises(SpecError, match="expected sqlite:///FILE") as err:
        sqlite_path("postgresql://bob:s3cret@db/x")
    assert "s3cret" not in str(err.value)
    with pytest.raises(SpecError, match="names no database file"):
        sqlite_path("sqlite:///")
    assert isinstance(open_store("ckpt", "p", Path("/spec")), LocalCheckpointStore)
    store = open_store("sqlite:///c.db", "p", Path("/spec"))
    assert isinstance(store, SqliteCheckpointStore) and store.root == Path("/spec/c.db")
    assert store.location == "sqlite:////spec/c.db"
