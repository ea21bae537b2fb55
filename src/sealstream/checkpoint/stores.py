"""Choosing a checkpoint store: a directory, or a URL.

* a directory path: :class:`~sealstream.checkpoint.store.LocalCheckpointStore`;
* ``sqlite:///relative/ckpt.db`` or ``sqlite:////absolute/ckpt.db``:
  :class:`~sealstream.checkpoint.sqlite_store.SqliteCheckpointStore`;
* ``postgresql://user@host:port/db`` (or ``postgres://``):
  :class:`~sealstream.checkpoint.pg_store.PostgresCheckpointStore`.

In a database the checkpoints are those of one pipeline (several jobs can share
it). URLs are shown with any password replaced by ``***`` (:func:`redact`),
including the ``password=`` query parameter.
"""

from __future__ import annotations

import re
from pathlib import Path

from sealstream.checkpoint.store import CheckpointStore, LocalCheckpointStore
from sealstream.errors import SpecError

SQLITE = "sqlite:///"
POSTGRES_SCHEMES = ("postgresql", "postgres")


def is_url(text: str) -> bool:
    """Whether ``text`` is a store URL rather than a directory path."""
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text) is not None


def scheme(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def is_postgres(url: str) -> bool:
    return scheme(url) in POSTGRES_SCHEMES


def redact(url: str) -> str:
    """``url`` with its password hidden: ``user:PASSWORD@`` and ``password=...``."""
    url = re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/@:]*):[^/@]*@", r"\1:***@", url)
    return re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", url)


def sqlite_path(url: str, base_dir: Path = Path(".")) -> Path:
    """The database file of a ``sqlite:///`` URL (relative paths from ``base_dir``);
    SpecError for any other URL."""
    if not url.startswith(SQLITE):
        raise SpecError(
            f"checkpoint url {redact(url)!r}: expected sqlite:///FILE, "
            "postgresql://HOST/DB (or a directory path)"
        )
    rest = url[len(SQLITE):].split("?", 1)[0]
    if not rest or rest.endswith("/") or "\x00" in rest:
        raise SpecError(f"checkpoint url {redact(url)!r}: names no database file")
    p = Path(rest)
    return p if p.is_absolute() else base_dir / p


def check_url(url: str, base_dir: Path = Path(".")) -> None:
    """SpecError naming what is wrong with a store URL (nothing is connected)."""
    if is_postgres(url):
        rest = url.split("://", 1)[1]
        if not rest.strip("/") or "\x00" in url:
            raise SpecError(f"checkpoint url {redact(url)!r}: names no server or database")
        return
    sqlite_path(url, base_dir)


def open_store(where: str | Path, pipeline: str | None, base_dir: Path = Path(".")
               ) -> CheckpointStore:
    """The store at ``where`` (a directory or a URL) for pipeline ``pipeline``."""
    if isinstance(where, str) and is_url(where):
        check_url(where, base_dir)
        if pipeline is None:
            raise SpecError(f"{redact(where)}: a pipeline name is needed")
        if is_postgres(where):
            from sealstream.checkpoint.pg_store import PostgresCheckpointStore

            return PostgresCheckpointStore(where, pipeline)
        from sealstream.checkpoint.sqlite_store import SqliteCheckpointStore

        return SqliteCheckpointStore(sqlite_path(where, base_dir), pipeline)
    p = Path(where)
    return LocalCheckpointStore(p if p.is_absolute() else base_dir / p)
