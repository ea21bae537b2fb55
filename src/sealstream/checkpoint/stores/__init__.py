"""The checkpoint stores, and choosing one: a directory, or a URL.

* a directory path: :class:`~sealstream.checkpoint.stores.directory.LocalCheckpointStore`;
* ``sqlite:///relative/ckpt.db`` or ``sqlite:////absolute/ckpt.db``:
  :class:`~sealstream.checkpoint.stores.sqlite.SqliteCheckpointStore`;
* ``postgresql://user@host:port/db`` (or ``postgres://``):
  :class:`~sealstream.checkpoint.stores.postgres.PostgresCheckpointStore`;
* ``s3://bucket/prefix``: :class:`~sealstream.checkpoint.stores.objects.ObjectCheckpointStore`
  on S3 (the endpoint from ``endpoint_url`` or ``AWS_ENDPOINT_URL``, credentials from
  the standard AWS chain). A prefix holds one job's checkpoints, as a directory does.

In a database the checkpoints are those of one pipeline (several jobs can share
it). URLs are shown with any password replaced by ``***`` (:func:`redact`),
including the ``password=`` query parameter.
"""

from __future__ import annotations

from pathlib import Path

from sealstream.checkpoint.stores._urls import (
    POSTGRES_SCHEMES,
    SQLITE,
    check_url,
    is_postgres,
    is_s3,
    is_url,
    redact,
    scheme,
    sqlite_path,
)
from sealstream.checkpoint.stores.base import (
    PREFIX,
    REJECTED,
    CheckpointStore,
    checkpoint_dirname,
)
from sealstream.checkpoint.stores.directory import LocalCheckpointStore
from sealstream.errors import SpecError

__all__ = [
    "POSTGRES_SCHEMES",
    "PREFIX",
    "REJECTED",
    "SQLITE",
    "CheckpointStore",
    "LocalCheckpointStore",
    "check_url",
    "checkpoint_dirname",
    "is_postgres",
    "is_s3",
    "is_url",
    "open_store",
    "redact",
    "scheme",
    "sqlite_path",
]


def open_store(where: str | Path, pipeline: str | None, base_dir: Path = Path("."),
               endpoint_url: str | None = None) -> CheckpointStore:
    """The store at ``where`` (a directory or a URL) for pipeline ``pipeline``
    (``endpoint_url``: an S3 store's endpoint, else ``AWS_ENDPOINT_URL``)."""
    if isinstance(where, str) and is_url(where):
        check_url(where, base_dir)
        if is_s3(where):
            from sealstream._objects.s3 import S3Objects
            from sealstream.checkpoint.stores.objects import ObjectCheckpointStore

            return ObjectCheckpointStore(S3Objects.from_url(where, endpoint_url), pipeline)
        if pipeline is None:
            raise SpecError(f"{redact(where)}: a pipeline name is needed")
        if is_postgres(where):
            from sealstream.checkpoint.stores.postgres import PostgresCheckpointStore

            return PostgresCheckpointStore(where, pipeline)
        from sealstream.checkpoint.stores.sqlite import SqliteCheckpointStore

        return SqliteCheckpointStore(sqlite_path(where, base_dir), pipeline)
    p = Path(where)
    return LocalCheckpointStore(p if p.is_absolute() else base_dir / p)
