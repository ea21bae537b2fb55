"""One SQLite write transaction, for the checkpoint store and the agents' row store.

A module of its own, importing only the standard library: ``sealstream.agents``
uses it without loading the engine (Polars, PyArrow, NumPy).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator

__all__ = ["immediate"]


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``) on an autocommit
    connection. On an error the
    original exception propagates, never "no transaction is active" (SQLite may
    already have rolled back after SQLITE_FULL or IOERR), and a failed COMMIT is
    rolled back so the connection stays usable."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    try:
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise sqlite3.OperationalError(f"commit failed: {exc}") from exc
