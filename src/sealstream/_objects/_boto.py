"""Building the S3 client with less work (see :mod:`sealstream._objects.s3`).

A botocore client for S3 parses botocore's whole S3 model (about 100 operations,
1.3 MB of JSON with their documentation) and the endpoints of every AWS service
(1.2 MB) before its first request: about a third of the CPU the client costs, and a
run's first read waits for it. :class:`S3Objects` calls only the operations of
:data:`OPERATIONS`, so this module hands botocore a model trimmed to them (their
shapes, without documentation: about 55 KB) and the endpoints of S3 alone,
kept in a small cache file between runs:

* the cache lives in ``$SEALSTREAM_CACHE_DIR`` (else ``$XDG_CACHE_HOME/sealstream``,
  else ``~/.cache/sealstream``; ``SEALSTREAM_CACHE_DIR=""`` turns it off), one file per
  botocore version and per size and modification time of the data files it was made
  from, so an upgraded botocore makes a new one;
* it is made from botocore's own files by botocore's own loader the first time (that
  run pays the full parse, as without the cache), written to a temporary file and
  renamed into place (concurrent runs write the same bytes);
* it is JSON, read with ``json.loads`` and checked (its format, botocore version, key
  and exactly these operations) before botocore sees it; anything else is ignored
  and made again. It holds no secret and nothing of the bucket;
* when models may come from elsewhere than botocore's own data (``AWS_DATA_PATH``, or
  ``~/.aws/models`` holding an S3 model or endpoints), nothing is trimmed: botocore
  loads as it always does.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["OPERATIONS", "cache_dir", "s3_client"]

#: every S3 operation S3Objects calls, and those botocore's S3 customizations call on
#: the same client (HeadBucket: the region redirector; CreateSession: S3 Express)
OPERATIONS = frozenset({
    "AbortMultipartUpload", "CompleteMultipartUpload", "CreateMultipartUpload",
    "CreateSession", "DeleteObject", "DeleteObjects", "GetObject", "HeadBucket",
    "HeadObject", "ListObjectsV2", "PutObject", "UploadPart",
})
_FORMAT = 1
_TYPES = ("service-2", "endpoint-rule-set-1")


def cache_dir() -> Path | None:
    """Where the trimmed model is kept; None when the cache is turned off."""
    env = os.environ.get("SEALSTREAM_CACHE_DIR")
    if env is not None:
        return Path(env) if env else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sealstream"


def s3_client(endpoint_url: str | None, config: Any) -> Any:
    """A botocore S3 client, on the trimmed model when it can be used."""
    import botocore.session

    session = botocore.session.Session()
    loader = _trimmed_loader(session)
    if loader is not None:
        session.register_component("data_loader", loader)
    return session.create_client("s3", endpoint_url=endpoint_url, config=config)


def _sources(session: Any) -> tuple[str, str, list[Path]] | None:
    """``(api version, cache key, source files)`` of botocore's own S3 data; None when
    botocore may load models from elsewhere (nothing is trimmed then)."""
    import botocore
    from botocore.loaders import Loader

    if session.get_config_variable("data_path"):
        return None
    custom = Path(Loader.CUSTOMER_DATA_PATH)
    if (custom / "s3").exists() or any(custom.glob("endpoints.json*")):
        return None
    data = Path(Loader.BUILTIN_DATA_PATH)
    try:
        api = max(p.name for p in (data / "s3").iterdir() if p.is_dir())
        files = sorted([*(data / "s3" / api).glob("service-2*"),
                        *(data / "s3" / api).glob("endpoint-rule-set-1*"),
                        *data.glob("endpoints.json*")])
        stamp = [(f.name, st.st_size, st.st_mtime_ns) for f in files for st in [f.stat()]]
    except (OSError, ValueError):
        return None
    key = hashlib.sha256(json.dumps([botocore.__version__, api, stamp]).encode()).hexdigest()
    return api, key[:24], files


def _trimmed_loader(session: Any) -> Any:
    """A loader answering S3's model and the endpoints from the trimmed data; None
    when the data cannot be trimmed (botocore then loads as it always does)."""
    import botocore
    from botocore.loaders import Loader

    found = _sources(session)
    if found is None:
        return None
    api, key, _ = found
    where = cache_dir()
    path = where / f"botocore-s3-{botocore.__version__}-{key}.json" if where else None
    kept = _read(path, key) if path is not None else None
    if kept is None:
        kept = _make(Loader(), api, key)
        if path is not None:
            _write(path, kept)
    doc: dict[str, Any] = kept
    endpoints_path = os.path.join(Loader.BUILTIN_DATA_PATH, "endpoints")

    class TrimmedLoader(Loader):  # type: ignore[misc] # botocore has no types
        def load_service_model(self, service_name: str, type_name: str,
                               api_version: str | None = None) -> Any:
            if service_name == "s3" and api_version in (None, api) and type_name in _TYPES:
                return doc["models"][type_name]
            return super().load_service_model(service_name, type_name, api_version)

        def load_data_with_path(self, name: str) -> Any:
            if name == "endpoints":
                return doc["endpoints"], endpoints_path
            return super().load_data_with_path(name)

    return TrimmedLoader()


def _strip(node: Any) -> Any:
    """``node`` without its documentation strings (at every depth)."""
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items()
                if not (k == "documentation" and isinstance(v, str))}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def _make(loader: Any, api: str, key: str) -> dict[str, Any]:
    """The trimmed data, from botocore's own files through botocore's own loader."""
    import botocore

    service = loader.load_service_model("s3", "service-2", api)
    ops = {name: op for name, op in service["operations"].items() if name in OPERATIONS}
    shapes: set[str] = set()
    todo = [ref["shape"] for op in ops.values()
            for ref in (op.get("input"), op.get("output"), *op.get("errors", [])) if ref]
    while todo:
        name = todo.pop()
        if name in shapes:
            continue
        shapes.add(name)
        shape = service["shapes"][name]
        todo.extend(m["shape"] for m in shape.get("members", {}).values())
        todo.extend(shape[k]["shape"] for k in ("member", "key", "value") if k in shape)
    trimmed = {k: v for k, v in service.items()
               if k not in ("operations", "shapes", "documentation")}
    trimmed["operations"] = _strip(ops)
    trimmed["shapes"] = _strip({name: service["shapes"][name] for name in sorted(shapes)})
    endpoints = loader.load_data("endpoints")
    endpoints = {**endpoints, "partitions": [
        {**p, "services": {k: v for k, v in p.get("services", {}).items() if k == "s3"}}
        for p in endpoints["partitions"]]}
    return {"format": _FORMAT, "botocore": botocore.__version__, "key": key,
            "models": {"service-2": trimmed,
                       "endpoint-rule-set-1": loader.load_service_model(
                           "s3", "endpoint-rule-set-1", api)},
            "endpoints": endpoints}


def _read(path: Path, key: str) -> dict[str, Any] | None:
    """The cache file when it is whole and is this one (see the module), else None."""
    import botocore

    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    try:
        ok = (doc["format"] == _FORMAT and doc["botocore"] == botocore.__version__
              and doc["key"] == key
              and set(doc["models"]["service-2"]["operations"]) == OPERATIONS
              and isinstance(doc["models"]["service-2"]["shapes"], dict)
              and isinstance(doc["models"]["endpoint-rule-set-1"], dict)
              and isinstance(doc["endpoints"]["partitions"], list))
    except (KeyError, TypeError):
        return None
    return doc if ok else None


def _write(path: Path, doc: dict[str, Any]) -> None:
    """Keep ``doc`` for the next runs (a temporary file renamed into place); a cache
    that cannot be written is no error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".botocore-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(json.dumps(doc, separators=(",", ":")).encode())
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass
