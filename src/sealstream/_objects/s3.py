"""Objects in S3-compatible storage, through obstore or boto3 (see
:mod:`sealstream._objects`).

The requests go through obstore (Rust's ``object_store``: conditional puts first
class, requests that release the GIL, a cheap import) when it is installed and the
credentials are in the environment, else through botocore; the parts of an object
larger than :attr:`S3Objects.multipart_bytes` always go up by botocore (object_store
cannot complete a multipart upload with ``If-None-Match: *``). Both paths send the same
requests and classify the answers alike; ``SEALSTREAM_S3_CLIENT`` picks one (see
:mod:`sealstream._objects._obstore`).

Why boto3: it is the AWS SDK, kept by AWS, and its ``put_object`` and
``complete_multipart_upload`` take ``IfNoneMatch="*"`` and ``IfMatch=ETAG`` as first
class parameters (botocore >= 1.36), which is all the commit protocol needs; it reads
credentials from the standard chain (environment, shared profile, instance or
container role) and ``AWS_ENDPOINT_URL``. Checked against SeaweedFS 4.48: a second
``If-None-Match: *`` create of a key and a stale ``If-Match`` replace are refused
with 412, also at the completion of a multipart upload.

* Create-if-absent: ``PutObject`` with ``If-None-Match: *``; an object larger than
  :attr:`S3Objects.multipart_bytes` goes up in parts (:attr:`S3Objects.part_threads`
  at a time) and is completed with ``If-None-Match: *`` only once every part is
  stored (aborted otherwise), so it is never visible half-written. A refused create
  reads what is there: the same bytes are an idempotent retry (a first attempt whose
  answer was lost), other bytes a conflict.
* Compare-and-swap: ``PutObject`` with ``If-Match: ETAG`` (``If-None-Match: *`` for
  "only if absent").
* Listing: ``ListObjectsV2``, which S3 (and SeaweedFS) answer with strong
  read-after-write consistency; nothing more is assumed of it.
* Server faults (connection refused or reset, timeouts, 5xx, throttling) are retried
  with backoff for :func:`retry_seconds` (``SEALSTREAM_S3_RETRY_S``, default 30 s),
  then one line naming the endpoint, the bucket and the last reason. Refused
  credentials, a missing bucket and other 4xx answers are not retried.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sealstream._env import seconds
from sealstream._objects import (
    NoSuchBucketError,
    ObjectExistsError,
    Objects,
    ObjectStoreError,
    VersionConflictError,
)
from sealstream._objects._obstore import choose, make_store, missing_header, parse_fault

__all__ = ["S3Objects", "retry_seconds"]


class _Answer(Exception):  # noqa: N818 - an answer, not an error
    """An obstore request answered with a refused precondition (``precondition``),
    no such key (``absent``) or a range past the end (``range``)."""

    def __init__(self, kind: str, code: str, status: int) -> None:
        super().__init__(kind)
        self.kind, self.code, self.status = kind, code, status

_RETRIED_CODES = {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout",
                  "Throttling", "ThrottlingException", "RequestTimeTooSkewed"}
_PRECONDITION = {"PreconditionFailed", "ConditionalRequestConflict"}


def retry_seconds() -> float:
    """How long server faults are retried (``SEALSTREAM_S3_RETRY_S``, default 30)."""
    return seconds("SEALSTREAM_S3_RETRY_S", 30.0)


def _redact(url: str) -> str:
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@", r"\1***@", url)


def parse_url(url: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of ``s3://bucket/prefix`` (the prefix without a trailing
    slash, maybe empty); ObjectStoreError for anything else."""
    m = re.fullmatch(r"(?i)s3://([^/?#]+)/?([^?#]*)", url)
    if m is None or not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", m.group(1)):
        raise ObjectStoreError(f"{_redact(url)}: expected s3://BUCKET/PREFIX "
                               "(a bucket name of 3-63 lowercase letters, digits, . and -)")
    prefix = m.group(2).strip("/")
    if any(p in ("", ".", "..") for p in prefix.split("/")) and prefix:
        raise ObjectStoreError(f"{_redact(url)}: the prefix has an empty, . or .. part")
    return m.group(1), prefix


class S3Objects(Objects):
    """Objects under ``s3://bucket/prefix``; see the module docstring."""

    #: objects larger than this go up in a multipart upload, in parts of this size
    multipart_bytes = 16 * 1024 * 1024
    #: the parts of one multipart upload sent at a time
    part_threads = 4
    #: the client's connections (one client per store, shared by its threads)
    pool_connections = 16

    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None,
                 client: Any = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
        where = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.location = where
        self._shown_endpoint = _redact(self.endpoint_url) if self.endpoint_url else "AWS"
        self._client = client
        self._client_lock = threading.Lock()
        #: the client the requests go through: "obstore" or "botocore" (a given
        #: ``client`` is a botocore one); see :mod:`sealstream._objects._obstore`
        self.backend: str
        try:
            self.backend = "botocore" if client is not None else choose(self.endpoint_url)
        except ValueError as exc:
            raise ObjectStoreError(f"{self.location}: {exc}") from None
        self._obstore: Any = None
        self._obstore_bulk: Any = None

    @classmethod
    def from_url(cls, url: str, endpoint_url: str | None = None) -> S3Objects:
        bucket, prefix = parse_url(url)
        return cls(bucket, prefix, endpoint_url)

    # ------------------------------------------------------------ plumbing
    def connect(self) -> None:
        """Make the client the requests go through now (no request is sent)."""
        if self.backend == "obstore":
            self.store  # noqa: B018
        else:
            self.client  # noqa: B018

    @property
    def store(self) -> Any:
        """The obstore ``S3Store`` (on the obstore path), made once for every thread."""
        return self._obstore or self._make_store(False)

    @property
    def bulk_store(self) -> Any:
        """The obstore ``S3Store`` that deletes with ``DeleteObjects`` (made on the
        first :meth:`delete_many`)."""
        return self._obstore_bulk or self._make_store(True)

    def _make_store(self, bulk: bool) -> Any:
        with self._client_lock:
            made = self._obstore_bulk if bulk else self._obstore
            if made is None:
                try:
                    made = make_store(self.bucket, self.endpoint_url, self.pool_connections,
                                      retry_seconds(), bulk_delete=bulk)
                except ImportError:
                    raise ObjectStoreError(
                        f"{self.location}: S3 needs obstore or boto3 "
                        "(pip install 'sealstream[s3]')") from None
                except Exception as exc:  # noqa: BLE001 - a setting obstore refused
                    raise ObjectStoreError(
                        f"{self.location}: cannot set up the S3 client "
                        f"({type(exc).__name__})") from None
                if bulk:
                    self._obstore_bulk = made
                else:
                    self._obstore = made
            return made

    @property
    def client(self) -> Any:
        """The botocore client: every request on the botocore path, and the multipart
        uploads on the obstore path (made on first use)."""
        if self._client is not None:
            return self._client
        with self._client_lock:  # one client (and its connection pool) for every thread
            return self._make_client()

    def _make_client(self) -> Any:
        if self._client is None:
            try:  # botocore's own session: boto3's resources, s3transfer and their
                # data are not needed (a fifth of the client's start-up, measured)
                from botocore.config import Config

                from sealstream._objects._boto import s3_client
            except ImportError:
                raise ObjectStoreError(
                    f"{self.location}: S3 needs boto3 (pip install 'sealstream[s3]')"
                ) from None
            style = "path" if self.endpoint_url else "auto"
            # on S3's model trimmed to the operations used, kept between runs (_boto)
            self._client = s3_client(
                self.endpoint_url,
                Config(s3={"addressing_style": style}, connect_timeout=5, read_timeout=30,
                       retries={"mode": "standard", "max_attempts": 2},
                       max_pool_connections=self.pool_connections))
        return self._client

    def _key(self, key: str) -> str:
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in key.split("/")):
            raise ObjectStoreError(f"{self.location}: {key!r} is not an object name")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _where(self) -> str:
        return f"{self.location} (endpoint {self._shown_endpoint})"

    def _call(self, what: str, fn: Any, **kw: Any) -> Any:
        """``fn(Bucket=..., **kw)``, server faults retried for :func:`retry_seconds`."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        deadline = time.monotonic() + retry_seconds()
        delay = 0.1
        while True:
            try:
                return fn(Bucket=self.bucket, **kw)
            except ClientError as exc:
                err = exc.response.get("Error", {})
                code = str(err.get("Code", ""))
                status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
                if code in _PRECONDITION or status == 412:
                    raise
                if code in ("NoSuchKey", "404", "NotFound") or status == 404 \
                        and code != "NoSuchBucket":
                    raise
                if code == "InvalidRange" or status == 416:
                    raise
                if not (status >= 500 or code in _RETRIED_CODES):
                    error = NoSuchBucketError if code == "NoSuchBucket" else ObjectStoreError
                    raise error(self._refused(what, code, status, err)) from None
                reason = f"{code or status}"
            except NoCredentialsError:
                raise ObjectStoreError(
                    f"cannot {what} in {self._where()}: no AWS credentials found (set "
                    "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE)") from None
            except BotoCoreError as exc:
                reason = type(exc).__name__
            delay = self._back_off(what, deadline, delay, reason)

    def _ob_call(self, what: str, fn: Any, *args: Any, **kw: Any) -> Any:
        """``fn(*args, **kw)`` through obstore, classified as :meth:`_call` does:
        server faults (no answer, a cut body, 5xx, throttling) retried for
        :func:`retry_seconds`; a refused precondition, a missing key and a range past
        the end raised as :class:`_Answer` for the caller; other refusals one line."""
        # obstore itself first: its Rust module puts obstore.exceptions in sys.modules
        # before filling it, so a thread importing that while another thread imports
        # obstore could find it half made; ``import obstore`` waits for the whole
        import obstore  # noqa: F401
        from obstore.exceptions import (
            AlreadyExistsError,
            BaseError,
            NotSupportedError,
            PermissionDeniedError,
            PreconditionError,
            UnauthenticatedError,
        )

        deadline = time.monotonic() + retry_seconds()
        delay = 0.1
        while True:
            try:
                return fn(*args, **kw)
            except (BaseError, FileNotFoundError) as exc:  # obstore's NotFound: the latter
                code, status, message, kind = parse_fault(exc)
                if isinstance(exc, AlreadyExistsError | PreconditionError) \
                        or code in _PRECONDITION or status == 412:
                    raise _Answer("precondition", code, status) from None
                if code == "NoSuchBucket":
                    raise NoSuchBucketError(self._refused(what, code, status, {})) from None
                if isinstance(exc, FileNotFoundError) or code in ("NoSuchKey", "NotFound") \
                        or status == 404:
                    raise _Answer("absent", code, status) from None
                if code == "InvalidRange" or status == 416:
                    raise _Answer("range", code, status) from None
                header = missing_header(exc) if not status else None
                if header is not None:
                    raise ObjectStoreError(
                        f"cannot {what} in {self._where()}: the server's answer has no "
                        f"{header} (not an S3-compatible answer)") from None
                if isinstance(exc, PermissionDeniedError | UnauthenticatedError) and \
                        not status:
                    status = 403
                if status and not (status >= 500 or code in _RETRIED_CODES):
                    raise ObjectStoreError(self._refused(what, code, status,
                                                         {"Message": message})) from None
                if isinstance(exc, NotSupportedError):
                    raise ObjectStoreError(f"cannot {what} in {self._where()}: not "
                                           "supported by the S3 client") from None
                reason = f"{code or status}" if status else kind
            delay = self._back_off(what, deadline, delay, reason)

    def _back_off(self, what: str, deadline: float, delay: float, reason: str) -> float:
        """After a server fault (``reason``): wait ``delay`` and return the next one
        (doubling, at most 2 s), or, past ``deadline``, fail with one line."""
        if time.monotonic() >= deadline:
            raise ObjectStoreError(
                f"cannot {what} in {self._where()}: the server did not answer for "
                f"{retry_seconds():.0f} s (last: {reason}); nothing more was written")
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        return min(delay * 2, 2.0)

    def _refused(self, what: str, code: str, status: int, err: dict[str, Any]) -> str:
        if code == "NoSuchBucket":
            return f"cannot {what} in {self._where()}: bucket {self.bucket!r} does not exist"
        if code in ("AccessDenied", "SignatureDoesNotMatch", "InvalidAccessKeyId") \
                or status == 403:
            return (f"cannot {what} in {self._where()}: access denied ({code or status}); "
                    "check the AWS credentials and the bucket's policy")
        return f"cannot {what} in {self._where()}: {code or status} {err.get('Message', '')}"

    @staticmethod
    def _code(exc: Exception) -> tuple[str, int]:
        resp = getattr(exc, "response", {}) or {}
        return (str(resp.get("Error", {}).get("Code", "")),
                int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0))

    def _is_precondition(self, exc: Exception) -> bool:
        code, status = self._code(exc)
        return code in _PRECONDITION or status == 412

    def _is_absent(self, exc: Exception) -> bool:
        code, status = self._code(exc)
        return code in ("NoSuchKey", "404", "NotFound") or (status == 404 and
                                                            code != "NoSuchBucket")

    def _fetch(self, **kw: Any) -> tuple[bytes, Any]:
        """``GetObject`` and its body, read whole: a connection cut in the middle of the
        body (botocore's ResponseStreamingError, IncompleteReadError, ReadTimeoutError)
        is a server fault that :meth:`_call` retries like a refused connection."""
        resp = self.client.get_object(**kw)
        body: bytes = resp["Body"].read()
        return body, resp.get("ETag")

    def _etag(self, etag: Any, what: str) -> str:
        """The ETag of an answer; one line when the server left it out (an answer no
        S3-compatible server gives to a write it applied, nor to a read)."""
        if not etag:
            raise ObjectStoreError(f"cannot {what} in {self._where()}: the server's "
                                   "answer has no ETag (not an S3-compatible answer)")
        return str(etag)

    # ------------------------------------------------------------ operations
    def create(self, key: str, data: bytes) -> bool:
        if self.backend == "obstore" and len(data) <= self.multipart_bytes:
            return self._ob_create(key, data)
        # a multipart create stays on botocore on both paths: object_store cannot
        # complete a multipart upload with If-None-Match: * (conditional completion),
        # and its own conditional puts are single requests (botocore imported here)
        from botocore.exceptions import ClientError

        full = self._key(key)
        try:
            if len(data) > self.multipart_bytes:
                self._multipart(full, data)
            else:
                self._call(f"create {key}", self.client.put_object, Key=full, Body=data,
                           IfNoneMatch="*")
        except ClientError as exc:
            if not self._is_precondition(exc):
                code, status = self._code(exc)
                raise ObjectStoreError(f"cannot create {key} in {self._where()}: "
                                       f"{code or status}") from None
            if self.get(key) == data:
                return False
            raise ObjectExistsError(f"{self.location}/{key} exists with other bytes") from None
        return True

    def _multipart(self, full: str, data: bytes) -> None:
        c = self.client
        upload = self._call("start an upload", c.create_multipart_upload, Key=full)["UploadId"]
        view = memoryview(data)
        size = self.multipart_bytes

        def part(n: int) -> dict[str, Any]:
            body = bytes(view[(n - 1) * size:n * size])
            r = self._call(f"upload part {n} of {full}", c.upload_part, Key=full,
                           UploadId=upload, PartNumber=n, Body=body)
            return {"PartNumber": n, "ETag": self._etag(r.get("ETag"), f"upload part {n} "
                                                        f"of {full}")}

        try:
            count = -(-len(data) // size)
            with ThreadPoolExecutor(min(self.part_threads, count),
                                    thread_name_prefix="sealstream-s3part") as pool:
                parts = list(pool.map(part, range(1, count + 1)))  # every part, or raise
            self._call(f"complete {full}", c.complete_multipart_upload, Key=full,
                       UploadId=upload, MultipartUpload={"Parts": parts}, IfNoneMatch="*")
        except BaseException:
            try:
                c.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload)
            except Exception:  # noqa: BLE001,S110 - the server cleans up abandoned uploads
                pass
            raise

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes | None:
        kw: dict[str, Any] = {"Key": self._key(key)}
        if start or length is not None:
            if length is not None and length <= 0:
                return b"" if self.get(key, 0, 1) is not None else None
        if self.backend == "obstore":
            return self._ob_get(key, start, length)
        from botocore.exceptions import ClientError

        if start or length is not None:
            kw["Range"] = f"bytes={start}-" + ("" if length is None else str(start + length - 1))
        try:
            body: bytes = self._call(f"read {key}", self._fetch, **kw)[0]
            return body
        except ClientError as exc:
            if self._is_absent(exc):
                return None
            code, status = self._code(exc)
            if code == "InvalidRange" or status == 416:  # past the end (or empty)
                return b"" if self.get(key) is not None else None
            raise ObjectStoreError(f"cannot read {key} in {self._where()}: {code}") from None

    def head(self, key: str) -> tuple[int, str] | None:
        """``HeadObject``: the size and the ETag, without the bytes."""
        if self.backend == "obstore":
            return self._ob_head(key)
        from botocore.exceptions import ClientError

        try:
            resp = self._call(f"read {key}", self.client.head_object, Key=self._key(key))
        except ClientError as exc:
            if self._is_absent(exc):
                return None
            raise ObjectStoreError(f"cannot read {key} in {self._where()}: "
                                   f"{self._code(exc)[0] or self._code(exc)[1]}") from None
        return self._sized(key, resp.get("ContentLength"), resp.get("ETag"))

    def _sized(self, key: str, size: Any, etag: Any) -> tuple[int, str]:
        """A HEAD's answer: its size (never guessed: 0 would read as an empty object)
        and its ETag, each one line naming the store when missing."""
        if size is None:
            raise ObjectStoreError(f"cannot read {key} in {self._where()}: the server's "
                                   "answer has no Content-Length")
        return int(size), self._etag(etag, f"read {key}")

    def keys(self, prefix: str = "") -> list[str]:
        if self.backend == "obstore":
            return self._ob_keys(prefix)
        base = f"{self.prefix}/" if self.prefix else ""
        out: list[str] = []
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"Prefix": base + prefix}
            if token:
                kw["ContinuationToken"] = token
            resp = self._call("list", self.client.list_objects_v2, **kw)
            out.extend(o["Key"][len(base):] for o in resp.get("Contents", []))
            if not resp.get("IsTruncated"):
                return sorted(out)
            token = resp.get("NextContinuationToken")

    def delete(self, key: str) -> None:
        if self.backend == "obstore":
            import obstore

            try:
                self._ob_call(f"delete {key}", obstore.delete, self.store, self._key(key))
            except _Answer as ans:
                if ans.kind != "absent":  # absent (a 404 some servers give): nothing to do
                    raise ObjectStoreError(f"cannot delete {key} in {self._where()}: "
                                           f"{ans.code or ans.status}") from None
            return
        self._call(f"delete {key}", self.client.delete_object, Key=self._key(key))

    def delete_many(self, keys: list[str]) -> None:
        for at in range(0, len(keys), 1000):
            batch = keys[at:at + 1000]
            if len(batch) == 1:
                self.delete(batch[0])
                continue
            if self.backend == "obstore":
                self._ob_delete_many(batch)
                continue
            resp = self._call(f"delete {len(batch)} objects", self.client.delete_objects,
                              Delete={"Objects": [{"Key": self._key(k)} for k in batch],
                                      "Quiet": True})
            base = f"{self.prefix}/" if self.prefix else ""
            for err in resp.get("Errors") or []:  # per key: a server fault retried alone
                key, code = str(err.get("Key", ""))[len(base):], str(err.get("Code", ""))
                if code in _RETRIED_CODES or code == "NoSuchKey":
                    self.delete(key)
                    continue
                raise ObjectStoreError(f"cannot delete {key} in {self._where()}: {code} "
                                       f"{err.get('Message', '')}")

    def copy(self, src: str, dst: str) -> bool:
        # read and create: create-if-absent and idempotent like every create
        return super().copy(src, dst)

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        if self.backend == "obstore":
            try:
                body, etag = self._ob_call(f"read {key}", self._ob_fetch, self._key(key), None)
            except _Answer as ans:
                if ans.kind == "absent":
                    return None
                raise ObjectStoreError(f"cannot read {key} in {self._where()}: "
                                       f"{ans.code or ans.status}") from None
            return body, self._etag(etag, f"read {key}")
        from botocore.exceptions import ClientError

        try:
            body, etag = self._call(f"read {key}", self._fetch, Key=self._key(key))
        except ClientError as exc:
            if self._is_absent(exc):
                return None
            raise ObjectStoreError(f"cannot read {key} in {self._where()}: "
                                   f"{self._code(exc)[0]}") from None
        return body, self._etag(etag, f"read {key}")

    def replace(self, key: str, data: bytes, version: str | None) -> str:
        if self.backend == "obstore":
            return self._ob_replace(key, data, version)
        from botocore.exceptions import ClientError

        cond = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        try:
            resp = self._call(f"replace {key}", self.client.put_object, Key=self._key(key),
                              Body=data, **cond)
        except ClientError as exc:
            if self._is_precondition(exc):
                return self._refused_replace(key, data)
            raise ObjectStoreError(f"cannot replace {key} in {self._where()}: "
                                   f"{self._code(exc)[0]}") from None
        return self._etag(resp.get("ETag"), f"replace {key}")

    def _refused_replace(self, key: str, data: bytes) -> str:
        """A replace refused by its condition: our own earlier write whose answer was
        lost (the same bytes are there: their version), else VersionConflictError."""
        now = self.read_versioned(key)
        if now is not None and now[0] == data:
            return now[1]
        raise VersionConflictError(f"{self.location}/{key} was replaced by another writer"
                                   ) from None  # (called while a refusal is handled)

    #: a probe takes a few round trips; one older than this (by the server's clock)
    #: was left by a run killed during its probe, never by a probe still running
    PROBE_STALE_S = 60.0

    def _stale_probes(self, ours: str) -> list[str]:
        """The probe objects of runs killed between a probe's create and its delete.
        Ages are compared on the server's clock (each LastModified against that of our
        own probe object), so a skewed local clock cannot delete a live probe."""
        if self.backend == "obstore":
            import obstore

            def listing() -> dict[str, Any]:
                return {o["path"]: o["last_modified"] for chunk in obstore.list(
                    self.store, self._key(".probe/x")[:-2], chunk_size=1000) for o in chunk}

            found = self._ob_call("list probe objects", listing)
        else:
            resp = self._call("list probe objects", self.client.list_objects_v2,
                              Prefix=self._key(".probe/x")[:-1])
            found = {o["Key"]: o["LastModified"] for o in resp.get("Contents", [])}
        now = found.get(ours)
        if now is None:
            return []  # listing not yet showing our probe: sweep next time
        return [k for k, when in found.items()
                if k != ours and (now - when).total_seconds() > self.PROBE_STALE_S]

    def probe(self) -> None:
        """Create one probe object, then, concurrently, create it again (must be
        refused), replace it with a stale version (must be refused too) and list the
        probe objects; then remove it, and the probe objects that runs killed during
        their probe left (see _stale_probes): three round trips."""
        if self.backend == "obstore":
            self._ob_probe()
            return
        from botocore.exceptions import ClientError

        key = f".probe/{uuid.uuid4().hex}"
        full = self._key(key)
        c = self.client
        first = self._call("write a probe object", c.put_object, Key=full, Body=b"1",
                           IfNoneMatch="*")
        server = first.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("server", "")
        who = f"{self._shown_endpoint}" + (f" ({server})" if server else "")
        # each write must be refused (HTTP 412); the guarantee missing when one is not
        refused = (
            ({"Body": b"2", "IfNoneMatch": "*"},
             "create-if-absent (If-None-Match: *): a second create of one key succeeded"),
            ({"Body": b"3", "IfMatch": '"0123456789abcdef0123456789abcdef"'},
             "compare-and-swap (If-Match): a replace of a stale version succeeded"),
        )

        def accepted(kw: dict[str, Any]) -> bool:
            try:
                self._call("write a probe object", c.put_object, Key=full, **kw)
            except ClientError as exc:
                if not self._is_precondition(exc):
                    raise
                return False
            return True

        missing = None
        stale: list[str] = []
        try:
            with ThreadPoolExecutor(3, thread_name_prefix="sealstream-s3probe") as pool:
                tries = [pool.submit(accepted, kw) for kw, _ in refused]
                sweep = pool.submit(self._stale_probes, full)
                for (_, guarantee), got in zip(refused, tries, strict=True):
                    if got.result() and missing is None:
                        missing = guarantee
                if missing is None:
                    stale = sweep.result()
        finally:
            gone = [full, *stale]
            with ThreadPoolExecutor(len(gone), thread_name_prefix="sealstream-s3probe") as pool:
                for done in [pool.submit(self._call, "remove a probe object", c.delete_object,
                                         Key=k) for k in gone]:
                    done.result()
        self._refuse_probe(who, missing)

    def _refuse_probe(self, who: str, missing: str | None) -> None:
        if missing is not None:
            raise ObjectStoreError(
                f"refusing {self.location}: the S3 server at {who} does not honour "
                f"{missing}; without it two writers could overwrite each other's checkpoints")

    # ------------------------------------------------------------ obstore path
    def _ob_create(self, key: str, data: bytes) -> bool:
        import obstore

        try:
            self._ob_call(f"create {key}", obstore.put, self.store, self._key(key), data,
                          mode="create", use_multipart=False)
        except _Answer as ans:
            if ans.kind != "precondition":
                raise ObjectStoreError(f"cannot create {key} in {self._where()}: "
                                       f"{ans.code or ans.status}") from None
            if self.get(key) == data:
                return False
            raise ObjectExistsError(f"{self.location}/{key} exists with other bytes") from None
        return True

    def _ob_fetch(self, full: str, span: Any) -> tuple[bytes, Any]:
        """A GET and its body, read whole inside the retried call (a body cut in the
        middle is a server fault, retried like a refused connection)."""
        import obstore

        got = obstore.get(self.store, full, options={"range": span} if span else None)
        body = bytes(got.bytes())
        return body, got.meta.get("e_tag")

    def _ob_get(self, key: str, start: int, length: int | None) -> bytes | None:
        span: Any = None
        if start or length is not None:
            span = {"offset": start} if length is None else (start, start + length)
        try:
            body: bytes = self._ob_call(f"read {key}", self._ob_fetch, self._key(key), span)[0]
            return body
        except _Answer as ans:
            if ans.kind == "absent":
                return None
            if ans.kind == "range":  # past the end (or empty)
                return b"" if self.get(key) is not None else None
            raise ObjectStoreError(f"cannot read {key} in {self._where()}: "
                                   f"{ans.code or ans.status}") from None

    def _ob_head(self, key: str) -> tuple[int, str] | None:
        import obstore

        try:
            meta = self._ob_call(f"read {key}", obstore.head, self.store, self._key(key))
        except _Answer as ans:
            if ans.kind == "absent":
                return None
            raise ObjectStoreError(f"cannot read {key} in {self._where()}: "
                                   f"{ans.code or ans.status}") from None
        return self._sized(key, meta.get("size"), meta.get("e_tag"))

    def _ob_keys(self, prefix: str) -> list[str]:
        """``ListObjectsV2`` by obstore, whose prefixes are whole path segments: the
        listing starts at the prefix's last ``/`` just before the first key that can
        start with it (S3's ``start-after``) and stops at the first key past it (S3
        lists in key order)."""
        import obstore

        base = f"{self.prefix}/" if self.prefix else ""
        want = base + prefix
        folder, _, rest = want.rpartition("/")
        offset = want[:-1] if rest[:-1] else None  # before every key starting with want

        def listing() -> list[str]:
            out: list[str] = []
            for chunk in obstore.list(self.store, folder or None, offset=offset,
                                      chunk_size=1000):
                for meta in chunk:
                    path = meta["path"]
                    if path.startswith(want):
                        out.append(path[len(base):])
                    elif path > want:
                        return out
            return out

        return sorted(self._ob_call("list", listing))

    def _ob_delete_many(self, batch: list[str]) -> None:
        """One ``DeleteObjects``; when any key fails in it, each key alone (a server
        fault retried, a missing key nothing, anything else one line)."""
        import obstore

        try:
            self._ob_call(f"delete {len(batch)} objects", obstore.delete, self.bulk_store,
                          [self._key(k) for k in batch])
        except (_Answer, ObjectStoreError):
            for key in batch:
                self.delete(key)

    def _ob_replace(self, key: str, data: bytes, version: str | None) -> str:
        import obstore

        mode: Any = "create" if version is None else {"e_tag": version}
        try:
            resp = self._ob_call(f"replace {key}", obstore.put, self.store, self._key(key),
                                 data, mode=mode, use_multipart=False)
        except _Answer as ans:
            if ans.kind == "precondition":
                return self._refused_replace(key, data)
            raise ObjectStoreError(f"cannot replace {key} in {self._where()}: "
                                   f"{ans.code or ans.status}") from None
        return self._etag(resp.get("e_tag"), f"replace {key}")

    def _ob_probe(self) -> None:
        """:meth:`probe` through obstore (the same requests)."""
        import obstore

        key = f".probe/{uuid.uuid4().hex}"
        full = self._key(key)
        st = self.store
        self._ob_call("write a probe object", obstore.put, st, full, b"1", mode="create",
                      use_multipart=False)
        refused = (
            ("create", b"2",
             "create-if-absent (If-None-Match: *): a second create of one key succeeded"),
            ({"e_tag": '"0123456789abcdef0123456789abcdef"'}, b"3",
             "compare-and-swap (If-Match): a replace of a stale version succeeded"),
        )

        def accepted(mode: Any, body: bytes) -> bool:
            try:
                self._ob_call("write a probe object", obstore.put, st, full, body,
                              mode=mode, use_multipart=False)
            except _Answer as ans:
                if ans.kind != "precondition":
                    raise ObjectStoreError(f"cannot write a probe object in "
                                           f"{self._where()}: {ans.code or ans.status}"
                                           ) from None
                return False
            return True

        missing = None
        stale: list[str] = []
        try:
            with ThreadPoolExecutor(3, thread_name_prefix="sealstream-s3probe") as pool:
                tries = [pool.submit(accepted, mode, body) for mode, body, _ in refused]
                sweep = pool.submit(self._stale_probes, full)
                for (_, _, guarantee), got in zip(refused, tries, strict=True):
                    if got.result() and missing is None:
                        missing = guarantee
                if missing is None:
                    stale = sweep.result()
        finally:
            gone = [full, *stale]
            with ThreadPoolExecutor(len(gone), thread_name_prefix="sealstream-s3probe") as pool:
                for done in [pool.submit(self._ob_call, "remove a probe object",
                                         obstore.delete, st, k) for k in gone]:
                    done.result()
        self._refuse_probe(self._shown_endpoint, missing)
