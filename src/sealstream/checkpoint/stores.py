"""Choosing a checkpoint store: a directory, or a URL.

* a directory path: :class:`~sealstream.checkpoint.store.LocalCheckpointStore`;
* ``sqlite:///relative/ckpt.db`` or ``sqlite:////absolute/ckpt.db``:
  :class:`~sealstream.checkpoint.sqlite_store.SqliteCheckpointStore`, whose
  checkpoints are those of one pipeline (several jobs can share the file).

PostgreSQL (``postgresql://``) is not implemented yet. URLs are shown with any
password replaced by ``***`` (:func:`redact`).
"""

from __future__ import annotations

import re
from pathlib import Path

from sealstream.checkpoint.store import CheckpointStore, LocalCheckpointStore
from sealstream.errors import SpecError

SQLITE = "sqlite:///"


def is_url(text: str) -> bool:
    """Whether ``text`` is a store URL rather than a directory path."""
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text) is not None


def redact(url: str) -> str:
    """``url`` with the password of its authority (``user:PASSWORD@``) hidden."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/@:]*):[^/@]*@", r"\1:***@", url)


def sqlite_path(url: str, base_dir: Path = Path(".")) -> Path:
    """The database file of a ``sqlite:///`` URL (relative paths from ``base_dir``);
    SpecError for any other URL."""
    if not url.startswith(SQLITE):
        scheme = url.split("://", 1)[0] if "://" in url else url
        if scheme in ("postgresql", "postgres"):
            raise SpecError(
                f"checkpoint url {redact(url)!r}: PostgreSQL checkpoint stores are not "
                "supported yet; use a directory or sqlite:///FILE"
            )
        raise SpecError(
            f"checkpoint url {redact(url)!r}: expected sqlite:///FILE "
            "(or a directory path)"
        )
    rest = url[len(SQLITE):].split("?", 1)[0]
    if not rest or rest.endswith("/") or "\x00" in rest:
        raise SpecError(f"checkpoint url {redact(url)!r}: names no database file")
    p = Path(rest)
    return p if p.is_absolute() else base_dir / p


def open_store(where: str | Path, pipeline: str | None, base_dir: Path = Path(".")
               ) -> CheckpointStore:
    """The store at ``where`` (a directory or a URL) for pipeline ``pipeline``."""
    if isinstance(where, str) and is_url(where):
        from sealstream.checkpoint.sqlite_store import SqliteCheckpointStore

        db = sqlite_path(where, base_dir)
        if pipeline is None:
            raise SpecError(f"{redact(where)}: a pipeline name is needed")
        return SqliteCheckpointStore(db, pipeline)
    p = Path(where)
    return LocalCheckpointStore(p if p.is_absolute() else base_dir / p)
