"""Object storage stores (``s3://bucket/prefix``) as the console reads them.

A prefix holds one pipeline's checkpoints, as a directory does. The console reads it
through :class:`ReadOnlyObjects`, which passes reads and listings to the real
objects and refuses every create, replace, copy, delete and probe: the console never
takes the lease, never claims an id, never creates ``STORE``. Checkpoints moved aside
under ``rejected/`` are read through :class:`AsideObjectStore`, which shows one
under its own id.

Every store opened for one ``s3://`` URL shares one :class:`S3Objects` (and so one
boto3 client and its connection pool) for the life of the console process: making a
client costs botocore tens of milliseconds of JSON loading, and a page opens the store
several times. The shared objects are keyed by the URL, the endpoint and the AWS
settings in the environment (their SHA-256, not the secret itself), so a changed
credential or endpoint gets a client of its own. boto3 clients are thread-safe, their
sessions are not: a client is made under a lock.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import TYPE_CHECKING

from sealstream._objects import Objects
from sealstream.checkpoint.stores.base import PREFIX, REJECTED, _parse_id, checkpoint_dirname
from sealstream.checkpoint.stores.objects import ObjectCheckpointStore
from sealstream.errors import CheckpointError

if TYPE_CHECKING:
    from sealstream._objects.s3 import S3Objects
    from sealstream.console._stores import Aside

#: the environment a boto3 client reads its endpoint, region and credentials from
_CLIENT_ENV = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
               "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_REGION",
               "AWS_DEFAULT_REGION", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
               "SEALSTREAM_S3_CLIENT")

_shared: dict[tuple[str, str], S3Objects] = {}
_shared_lock = threading.Lock()


def shared_objects(url: str) -> S3Objects:
    """The one :class:`S3Objects` (its client made) of ``url`` and the current AWS
    environment, made on first use and kept for the life of the process."""
    from sealstream._objects.s3 import S3Objects

    settings = "\0".join(f"{n}={os.environ.get(n, '')}" for n in _CLIENT_ENV)
    key = (url, hashlib.sha256(settings.encode()).hexdigest())
    with _shared_lock:
        objects = _shared.get(key)
        if objects is None:
            objects = S3Objects.from_url(url)
            objects.connect()  # made here, under the lock (an error is not kept)
            _shared[key] = objects
        return objects


class ReadOnlyObjects(Objects):
    """``objects`` for reading only: every write raises (and none reaches the server)."""

    def __init__(self, objects: Objects) -> None:
        self.inner = objects
        self.location = objects.location

    def _refuse(self, what: str) -> CheckpointError:
        return CheckpointError(f"{self.location}: the console never writes ({what} refused)")

    def create(self, key: str, data: bytes) -> bool:
        raise self._refuse(f"create {key}")

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes | None:
        return self.inner.get(key, start, length)

    def keys(self, prefix: str = "") -> list[str]:
        return self.inner.keys(prefix)

    def delete(self, key: str) -> None:
        raise self._refuse(f"delete {key}")

    def copy(self, src: str, dst: str) -> bool:
        raise self._refuse(f"copy {src}")

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        return self.inner.read_versioned(key)

    def replace(self, key: str, data: bytes, version: str | None) -> str:
        raise self._refuse(f"replace {key}")

    def probe(self) -> None:
        raise self._refuse("probe")


def s3_agent_store(url: str) -> bool:
    """:func:`sealstream.agents._s3store.is_agent_prefix` (its ``LEASE`` carries
    ``seq``) read through the shared client: one GET, nothing written."""
    from sealstream.agents._s3store import is_agent_prefix

    return is_agent_prefix(url, shared_objects(url))


def open_s3(url: str) -> ObjectCheckpointStore:
    """The store at ``url`` (endpoint from ``AWS_ENDPOINT_URL``), read-only, no probe."""
    return ObjectCheckpointStore(ReadOnlyObjects(shared_objects(url)), probe=False)


def s3_pipeline(url: str) -> str:
    """The prefix's pipeline: the name its newest readable manifest gives (else the
    prefix); CheckpointError when the prefix holds no checkpoint store."""
    store = open_s3(url)
    ids = store.ids()
    if not ids and not store.exists() and not store._keys(f"{REJECTED}/"):
        raise CheckpointError(f"no checkpoint store at {store.location}")
    for cid in reversed(ids):
        doc = store.read_manifest(cid)
        if doc is not None and isinstance(doc.get("pipeline"), str):
            return str(doc["pipeline"])
    return store.location.rstrip("/").rsplit("/", 1)[-1]


def s3_asides(url: str) -> list[tuple[int, str]]:
    """``(id, name)`` of every checkpoint under ``rejected/`` (name: its folder)."""
    store = open_s3(url)
    seen: dict[str, int] = {}
    for key in store._keys(f"{REJECTED}/"):
        head = key[len(REJECTED) + 1:].split("/", 1)[0]
        cid = _parse_id(head[: len(PREFIX) + 12])
        if cid is not None and len(head) > len(PREFIX) + 13 and "/" in key[len(REJECTED) + 1:]:
            seen[head] = cid
    return sorted((cid, head) for head, cid in seen.items())


class AsideObjectStore(ObjectCheckpointStore):
    """A checkpoint under ``rejected/`` shown under its own id; objects it shares with
    older checkpoints (an incremental chain's base) are read where they still are."""

    def __init__(self, url: str, aside: Aside) -> None:
        super().__init__(ReadOnlyObjects(shared_objects(url)), probe=False)
        self.aside = aside
        self._own = f"{checkpoint_dirname(aside.id)}/"
        self._dir = f"{REJECTED}/{aside.handle}/"

    def ids(self) -> list[int]:
        return [self.aside.id]

    def _moved(self, rel: str) -> str:
        return self._dir + rel[len(self._own):] if rel.startswith(self._own) else rel

    def _raw(self, rel: str) -> bytes | None:
        return super()._raw(self._moved(rel))

    def _bounded(self, rel: str, limit: int) -> bytes | None:
        return super()._bounded(self._moved(rel), limit)

    def _names(self, cid: int) -> list[str]:
        if cid != self.aside.id:
            return super()._names(cid)
        return sorted(self._own + k[len(self._dir):] for k in self._keys(self._dir)
                      if not k.rsplit("/", 1)[-1].startswith("."))
