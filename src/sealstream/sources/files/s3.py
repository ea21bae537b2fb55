"""Bounded file sources read from S3 (``[source] paths = ["s3://bucket/events/*.jsonl"]``).

The simplest correct shape (docs/object-storage.md, *Inputs in S3*): at run start
every object matching a path (a glob on the key after the last prefix without a
wildcard, sorted) is downloaded once into a run-local cache next to the spec,
``.sealstream-cache/s3/<sha256 of the object's URL, 16 hex>/<key's last part>``,
checked against the size and ETag the server gives for it, and then read by the
file reader of its kind unchanged. The partition keeps the object's ``s3://`` URL
as its name, so checkpoints, progress and errors name the object.

The checkpoint records the object's ETag and size in the partition's position
identity (``s3_etag``, ``s3_size``) beside the reader's own identity of the consumed
bytes. A resumed job whose object has another ETag now stops with one line (a
:class:`~sealstream.errors.SourceChangedError`, exit 1), as a local file changed
under a resumed job does: an object is immutable, so any other version is a change.

Objects are talked to through :mod:`sealstream._objects` only; the endpoint is
``AWS_ENDPOINT_URL`` (else AWS), credentials the standard AWS chain.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from sealstream.errors import SourceChangedError, SourceError, SpecError

from .._base import Chunk, PartitionPosition, PartitionReader

__all__ = ["S3Partition", "is_s3", "resolve"]

#: the identity keys the S3 wrapper adds to the reader's position identity
OWN_KEYS = ("s3_etag", "s3_size")


def is_s3(path: str) -> bool:
    return re.match(r"(?i)^s3://", path) is not None


def _matches(key: list[str], pattern: list[str]) -> bool:
    """A glob per ``/``-separated part (``*`` never crosses a ``/``, as on disk;
    names starting with ``.`` match only a pattern starting with ``.``)."""
    return len(key) == len(pattern) and all(
        fnmatch.fnmatchcase(k, p) and (p.startswith(".") or not k.startswith("."))
        for k, p in zip(key, pattern, strict=True))


def _meta_path(local: Path) -> Path:
    return local.with_name(local.name + ".s3.json")


def resolve(setting: str, written: str, base_dir: Path) -> list[tuple[str, Path]]:
    """``(object URL, cached local file)`` for every object ``written`` names, sorted
    by key; SpecError (exit 2) for a bad URL, a missing bucket or no match,
    SourceError (exit 1) when the server cannot be read."""
    from sealstream._objects import NoSuchBucketError, ObjectStoreError
    from sealstream._objects.s3 import S3Objects, parse_url

    try:
        bucket, pattern = parse_url(written)
    except ObjectStoreError as exc:
        raise SpecError(f"{setting}: {exc}") from None
    if not pattern:
        raise SpecError(f"{setting}: {written!r}: name an object or a glob of keys, "
                        "e.g. s3://bucket/events/*.jsonl")
    parts = pattern.split("/")
    fixed = 0
    while fixed < len(parts) - 1 and not glob.has_magic(parts[fixed]):
        fixed += 1
    prefix = "/".join(parts[:fixed])
    rest = "/".join(parts[fixed:])
    objects = S3Objects(bucket, prefix)
    try:
        if glob.has_magic(rest):
            want = rest.split("/")
            keys = [k for k in objects.keys() if _matches(k.split("/"), want)]
        else:
            keys = [rest] if objects.head(rest) is not None else []
    except NoSuchBucketError as exc:
        raise SpecError(f"{setting}: {exc}") from None
    except ObjectStoreError as exc:
        raise SourceError(f"{setting}: {exc}") from None
    if not keys:
        raise SpecError(f"{setting}: {written!r} matches no object in {objects.location}")
    out = []
    for key in sorted(keys):
        url = f"{objects.location}/{key}"
        out.append((url, _fetch(objects, key, url, base_dir)))
    return out


def _fetch(objects: Any, key: str, url: str, base_dir: Path) -> Path:
    """The object's bytes in the cache (downloaded unless the cached copy has the
    server's size and ETag), with its ``.s3.json`` record of both."""
    from sealstream._objects import ObjectStoreError

    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    local = base_dir / ".sealstream-cache" / "s3" / digest / key.rsplit("/", 1)[-1]
    try:
        head = objects.head(key)
        if head is None:
            raise SourceError(f"object {url} disappeared while the run started")
        size, etag = head
        meta = _meta_path(local)
        if local.is_file() and meta.is_file() and local.stat().st_size == size:
            try:
                have = json.loads(meta.read_text())
            except ValueError:
                have = {}
            if have == {"url": url, "etag": etag, "size": size}:
                return local
        got = objects.read_versioned(key)
    except ObjectStoreError as exc:
        raise SourceError(f"cannot read {url}: {exc}") from None
    if got is None or got[1] != etag or len(got[0]) != size:
        raise SourceError(f"object {url} changed while it was downloaded (ETag {etag}, "
                          f"{size} bytes when listed); start the run again")
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = local.with_name(f".{local.name}.{os.getpid()}.tmp")
    tmp.write_bytes(got[0])
    os.replace(tmp, local)
    meta_tmp = tmp.with_name(tmp.name + ".json")
    meta_tmp.write_text(json.dumps({"url": url, "etag": etag, "size": size}))
    os.replace(meta_tmp, _meta_path(local))
    return local


class S3Partition:
    """A file reader of a cached object, its positions carrying the object's ETag
    and size; see the module docstring."""

    def __init__(self, inner_open: Any, name: str, path: Path,
                 position: PartitionPosition | None) -> None:
        try:
            meta = json.loads(_meta_path(path).read_text())
            self._own: dict[str, Any] = {"s3_etag": str(meta["etag"]),
                                         "s3_size": int(meta["size"])}
        except (OSError, ValueError, KeyError, TypeError):
            raise SourceError(f"partition {name!r}: its cached copy {path} has no "
                              "readable record of the object's ETag") from None
        if position is not None and "s3_etag" in position.identity:
            was = (position.identity.get("s3_etag"), position.identity.get("s3_size"))
            now = (self._own["s3_etag"], self._own["s3_size"])
            if was != now:
                raise SourceChangedError(
                    f"partition {name!r} changed since its checkpoint at offset "
                    f"{position.offset}: the object is now ETag {now[0]}, {now[1]} bytes; "
                    f"the checkpoint read ETag {was[0]}, {was[1]} bytes; resuming would skip "
                    "or repeat records - replay from an earlier position into an isolated "
                    "destination instead")
            position = replace(position, identity={k: v for k, v in position.identity.items()
                                                   if k not in OWN_KEYS})
        self.name = name
        self._inner: PartitionReader = inner_open(position)

    def next_chunk(self, max_records: int) -> Chunk | None:
        chunk = self._inner.next_chunk(max_records)
        if chunk is None:
            return None
        pos = chunk.position
        return replace(chunk, position=replace(pos, identity={**pos.identity, **self._own}))

    def size_hint(self) -> tuple[int, int] | None:
        return self._inner.size_hint()

    def close(self) -> None:
        self._inner.close()
