"""Objects: the few storage operations that checkpoint stores, file sinks and file
sources share, on a local directory or in S3-compatible object storage.

This room sits beside :mod:`sealstream._fs`, below everything else (it imports
nothing from sealstream but ``_fs``). An :class:`Objects` is a flat namespace of
keys (``a/b/c``: slashes are only part of names) under one root:

* :meth:`Objects.create` - create-if-absent. Returns True when it created the
  object, False when the very same bytes were there already (an idempotent retry);
  raises :class:`ObjectExistsError` when other bytes are there (a conflict).
  Never half visible: a reader sees the whole object or nothing.
* :meth:`Objects.get` - the whole object or a byte range, None when absent.
* :meth:`Objects.keys` - the keys under a prefix, sorted. Only what strong
  read-after-write gives is promised: a key created (or deleted) before the
  listing started is (or is not) in it.
* :meth:`Objects.head` - an object's size and version (an ETag on S3), None when
  absent, without reading it.
* :meth:`Objects.delete` (absent: nothing to do), :meth:`Objects.delete_many` and
  :meth:`Objects.copy`.
* :meth:`Objects.read_versioned` / :meth:`Objects.replace` - compare-and-swap of
  one small object by its version (an ETag): the lease of a single writer.

:class:`LocalObjects` keeps them as files (created ``O_EXCL`` and published by a
hard link of a fully written, fsynced temporary file); :class:`S3Objects` in a
bucket, with ``If-None-Match: *`` and ``If-Match`` conditional writes
(:mod:`sealstream._objects.s3`, which needs obstore or boto3).

Errors: :class:`ObjectExistsError`, :class:`VersionConflictError`, and
:class:`ObjectStoreError` for everything else (a server that did not answer for the
retry budget, refused credentials, a missing bucket): one line, no secret.
"""

from __future__ import annotations

import abc
import re

__all__ = [
    "LocalObjects",
    "NoSuchBucketError",
    "ObjectExistsError",
    "ObjectStoreError",
    "Objects",
    "VersionConflictError",
    "is_object_url",
    "open_objects",
]


class ObjectStoreError(Exception):
    """The object store could not do what was asked (the message says why, in one
    line, naming the store without credentials)."""


class NoSuchBucketError(ObjectStoreError):
    """The bucket does not exist (a store there does not exist: a usage error)."""


class ObjectExistsError(ObjectStoreError):
    """A create-if-absent found other bytes under the key."""


class VersionConflictError(ObjectStoreError):
    """A compare-and-swap found another version than the one it was given."""


class Objects(abc.ABC):
    """A namespace of immutable objects (plus compare-and-swap ones); see the module."""

    #: where the objects live, for messages (never a credential)
    location: str

    @abc.abstractmethod
    def create(self, key: str, data: bytes) -> bool:
        """Create ``key`` with ``data`` only if absent; see the module docstring."""

    @abc.abstractmethod
    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes | None:
        """Bytes ``start .. start+length`` of ``key`` (fewer at its end), None when absent."""

    def head(self, key: str) -> tuple[int, str] | None:
        """``(size, version)`` of ``key``, None when absent. The version changes when
        the bytes do (an ETag on S3). The default reads the object; the
        implementations ask for its metadata only."""
        import hashlib

        data = self.get(key)
        return None if data is None else (len(data), hashlib.sha256(data).hexdigest())

    @abc.abstractmethod
    def keys(self, prefix: str = "") -> list[str]:
        """Every key that starts with ``prefix``, sorted."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key`` (nothing to do when it is absent)."""

    def delete_many(self, keys: list[str]) -> None:
        """Remove every key of ``keys`` (absent ones: nothing to do), in no promised
        order (S3: one ``DeleteObjects`` request per 1,000 keys)."""
        for key in keys:
            self.delete(key)

    def copy(self, src: str, dst: str) -> bool:
        """Create ``dst`` with the bytes of ``src``; False when ``src`` is absent."""
        data = self.get(src)
        if data is None:
            return False
        self.create(dst, data)
        return True

    @abc.abstractmethod
    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        """The bytes of ``key`` and their version, None when absent."""

    @abc.abstractmethod
    def replace(self, key: str, data: bytes, version: str | None) -> str:
        """Write ``data`` under ``key`` only if its version is still ``version`` (None:
        only if absent); the new version. VersionConflictError otherwise."""

    def probe(self) -> None:  # noqa: B027 - a local directory needs no probe
        """ObjectStoreError unless the store refuses a second create of one key and a
        replace of a stale version (checked against the real server, once)."""


def is_object_url(text: str) -> bool:
    """Whether ``text`` names objects in S3 (``s3://bucket/prefix``)."""
    return re.match(r"(?i)^s3://", text) is not None


def open_objects(where: str, endpoint_url: str | None = None) -> Objects:
    """The objects at ``s3://bucket/prefix`` (S3) or under a directory path."""
    if is_object_url(where):
        from sealstream._objects.s3 import S3Objects

        return S3Objects.from_url(where, endpoint_url)
    from pathlib import Path

    return LocalObjects(Path(where))


from sealstream._objects.local import LocalObjects  # noqa: E402 - after the base class
