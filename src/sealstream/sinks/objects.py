"""JSON Lines and Parquet outputs in object storage (``path = "s3://bucket/prefix"``).

The same files, names and two-phase protocol as the directory sinks
(:class:`~sealstream.sinks.jsonl.JsonlDirSink`,
:class:`~sealstream.sinks.parquet.ParquetDirSink`), on an
:class:`~sealstream._objects.Objects` instead of a directory (S3 has no rename)::

    PREFIX/part-000000000007-a1b2c3.jsonl              committed: readers list part-*
    PREFIX/.part-000000000008-a1b2c3.jsonl.inprogress  staged: under the ``.part-``
                                                        staging prefix, ignored by readers

1. ``write`` keeps the epoch's rows in memory (the JSON Lines bytes, or the frames
   of a Parquet file), as the Parquet directory sink does.
2. ``prepare`` encodes the epoch's file and creates its staging object with
   ``If-None-Match: *`` (a multipart upload completed only when whole above 16 MiB):
   it is durable before any checkpoint names it, and never half visible.
3. ``commit``, after the manifest, creates the final object with the same bytes,
   also only if absent, then deletes the staging object. A final object already
   holding those bytes is an idempotent retry (a commit whose answer, or whose
   process, was lost); other bytes under the final key are a conflict (one line,
   nothing overwritten). A commit whose staging object and final object are both
   gone raises: prepared output was deleted.
4. ``recover`` commits what the restored checkpoint prepared and deletes every
   other staging object of the scheme; ``committed`` lists the final objects and
   ``read_ids`` reads them back (the de-duplication after a fallback), exactly as
   the directory sinks do.

Objects of other names under the prefix are never listed or touched. Every
:class:`~sealstream._objects.ObjectStoreError` becomes a one-line
:class:`~sealstream.errors.SinkError` naming the object (never a credential).
Assumed: one job writes the prefix (the checkpoint store's lease ensures one run).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import polars as pl

from sealstream._objects import ObjectExistsError, Objects, ObjectStoreError, open_objects
from sealstream.errors import SinkError
from sealstream.sinks._base import JSON_LINE, RESULT_ID_COLUMNS, CommittedFile, Sink, SinkRole
from sealstream.sinks._files import (
    PartNames,
    check_epoch,
    check_role,
    check_run_token,
    id_schema,
)

__all__ = ["JsonlObjectSink", "ParquetObjectSink", "StagedObjectSink"]


class StagedObjectSink(PartNames, Sink):
    """The protocol of the module docstring; subclasses say how rows are kept and
    encoded (:meth:`_keep`, :meth:`_encode`) and read back (:meth:`_ids`)."""

    ext: str = ""
    _part_kind = "object"

    def __init__(self, objects: Objects, role: SinkRole, run_token: str) -> None:
        if not self.ext:
            raise TypeError("StagedObjectSink subclasses must set ext")
        self.role = check_role(role)
        self.run_token = check_run_token(run_token)
        self.objects = objects
        #: a compound key's fields (see the directory sinks)
        self.key_fields: tuple[str, ...] | None = None
        self._earlier: Objects | None = None
        self._staged: set[int] = set()
        self._prepared: dict[int, list[str]] = {}
        self._bytes: dict[int, bytes] = {}
        self._failed: dict[int, str] = {}
        self._init_names()

    # ---------------------------------------------------------------- subclass hooks
    def _keep(self, epoch: int, frame: pl.DataFrame) -> None:
        raise NotImplementedError

    def _encode(self, epoch: int) -> bytes | None:
        """The epoch's file, None when it has no rows; forgets the kept rows."""
        raise NotImplementedError

    def _drop(self) -> None:
        """Forget every kept row."""

    def _ids(self, data: bytes, where: str) -> pl.DataFrame:
        raise NotImplementedError

    # ---------------------------------------------------------------- naming
    def _part_where(self) -> str:
        return self.objects.location

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """An :class:`ObjectStoreError` inside becomes a one-line :class:`SinkError`."""
        try:
            yield
        except ObjectStoreError as exc:
            raise SinkError(f"cannot {what} {self.role}: {exc}") from None

    def location(self) -> str:
        """The ``s3://bucket/prefix`` (recorded by checkpoints; see :meth:`recover_at`)."""
        return self.objects.location

    # ---------------------------------------------------------------- protocol
    def write(self, epoch: int, frame: pl.DataFrame) -> None:
        """Keep ``frame``'s rows for ``epoch`` (no request to the store but, for a new
        epoch, whether this run's file of it is already published)."""
        check_epoch(epoch)
        if epoch in self._prepared:
            raise ValueError(f"epoch {epoch} is already prepared; it cannot take more rows")
        if epoch in self._failed:
            raise SinkError(self._failed[epoch])
        if frame.height == 0:
            return
        if epoch not in self._staged:
            final = self.final_name(epoch)
            with self._errors("read"):
                there = self.objects.head(final)
            if there is not None:
                raise ValueError(f"epoch {epoch} is already committed as "
                                 f"{self.objects.location}/{final}")
            self._staged.add(epoch)
        self._keep(epoch, frame)

    def prepare(self, epoch: int) -> list[str]:
        """Create the epoch's staging object; ``[final name]``, or ``[]`` without rows."""
        tokens, durable = self.prepare_deferred(epoch)
        try:
            durable()
        except SinkError as err:
            self._prepared.pop(epoch, None)
            self._bytes.pop(epoch, None)
            self._failed[epoch] = str(err)
            raise
        return tokens

    def prepare_deferred(self, epoch: int) -> tuple[list[str], Callable[[], None]]:
        """The file is encoded now; the callable uploads its staging object."""
        check_epoch(epoch)
        if epoch in self._prepared:
            return list(self._prepared[epoch]), lambda: None
        if epoch in self._failed:
            raise SinkError(self._failed[epoch])
        self._staged.discard(epoch)
        try:
            data = self._encode(epoch)
        except SinkError as err:
            self._failed[epoch] = str(err)
            raise
        if data is None:
            return [], lambda: None
        token = self.final_name(epoch)
        self._prepared[epoch] = [token]
        self._bytes[epoch] = data
        staging = self.staging_name(token)

        def durable() -> None:
            try:
                self.objects.create(staging, data)
            except ObjectExistsError:
                raise SinkError(f"cannot stage {self.role}: {self.objects.location}/{staging} "
                                "exists with other bytes (another run writes this prefix)"
                                ) from None
            except ObjectStoreError as exc:
                raise SinkError(f"cannot stage {self.role}: {exc}") from None

        return [token], durable

    def commit(self, epoch: int, tokens: list[str]) -> None:
        """Publish each token's staged bytes under its final key (create-if-absent,
        idempotent), then delete the staging object."""
        check_epoch(epoch)
        for token in tokens:
            self._check_token(token, epoch)
        self._commit_in(self.objects, epoch, tokens)
        self._prepared.pop(epoch, None)
        self._bytes.pop(epoch, None)

    def _commit_in(self, objects: Objects, epoch: int, tokens: list[str]) -> None:
        for token in tokens:
            staging = self.staging_name(token)
            mine = self._bytes.get(epoch) if token == self.final_name(epoch) else None
            data: bytes | None
            with self._errors("read"):
                if mine is not None and objects is self.objects:
                    data = mine if objects.head(staging) is not None else None
                else:
                    data = objects.get(staging)
                final = objects.head(token) if data is None else None
            if data is None:
                if final is not None:
                    continue  # committed before (its staging object already removed)
                raise SinkError(f"cannot commit {self.role} epoch {epoch}: neither "
                                f"{objects.location}/{staging} nor {token} exists; prepared "
                                "output was deleted")
            try:
                objects.create(token, data)
            except ObjectExistsError:
                raise SinkError(f"cannot commit {self.role} epoch {epoch}: "
                                f"{objects.location}/{token} exists with other bytes than the "
                                "staged ones (another job writes this prefix); nothing was "
                                "overwritten") from None
            except ObjectStoreError as exc:
                raise SinkError(f"cannot commit {self.role} epoch {epoch}: {exc}") from None
            with self._errors("remove the staging object of"):
                objects.delete(staging)

    def recover(self, prepared: dict[int, list[str]]) -> None:
        """Commit ``prepared``, then delete every other staging object of the scheme."""
        self._discard_pending()
        for epoch in sorted(prepared):
            self.commit(epoch, list(prepared[epoch]))
        self._sweep(self.objects, None)

    def _sweep(self, objects: Objects, runs: set[str] | None) -> None:
        with self._errors("remove the staging objects of"):
            for name in objects.keys(".part-"):
                parsed = self._parse(self._staging_re, name)
                if parsed is None or (runs is not None and parsed[1] not in runs):
                    continue
                objects.delete(name)

    def recover_at(self, staged_at: object, prepared: dict[int, list[str]]) -> None:
        """:meth:`recover`; when the checkpoint staged at another ``s3://`` prefix, its
        tokens are committed there and that prefix's files are listed too (as the
        directory sinks do for a moved directory). A checkpoint staged in a local
        directory is refused in one line: moving an output between a directory and
        object storage across a restart is not supported."""
        if staged_at is None or staged_at == self.location():
            self.recover(prepared)
            return
        if not isinstance(staged_at, str) or not staged_at.lower().startswith("s3://"):
            raise SinkError(
                f"{self.location()}: the checkpoint staged its {self.role} in {staged_at!r}; "
                "moving an output between a local directory and S3 across a restart is not "
                "supported; set the output's path back, or start the job afresh")
        with self._errors("open"):
            earlier = open_objects(staged_at, getattr(self.objects, "endpoint_url", None))
        self._discard_pending()
        here: dict[int, list[str]] = {}
        for epoch in sorted(prepared):
            tokens = list(prepared[epoch])
            for token in tokens:
                self._check_token(token, epoch)
            there = [t for t in tokens if self._holds(earlier, t)]
            self._commit_in(earlier, epoch, there)
            here[epoch] = [t for t in tokens if t not in there]
        self._earlier = earlier
        self._sweep(earlier, {self._run_of(t) for ts in prepared.values() for t in ts})
        self.recover(here)

    def _holds(self, objects: Objects, token: str) -> bool:
        with self._errors("read"):
            return any(objects.head(k) is not None for k in (token, self.staging_name(token)))

    def committed(self) -> list[CommittedFile]:
        """Every final object of the scheme (any run token), by epoch then name."""
        out = [CommittedFile(e, n) for e, n in self._finals(self.objects)]
        if self._earlier is not None:
            where = self._earlier.location
            out.extend(CommittedFile(e, n, where) for e, n in self._finals(self._earlier))
        out.sort(key=lambda c: (c.epoch, c.token, c.location or ""))
        return out

    def _finals(self, objects: Objects) -> list[tuple[int, str]]:
        with self._errors("list"):
            names = objects.keys("part-")
        found = []
        for name in names:
            parsed = self._parse(self._final_re, name)
            if parsed is not None:
                found.append((parsed[0], name))
        return found

    def read_ids(self, files: list[CommittedFile]) -> pl.DataFrame:
        parts = [pl.DataFrame(schema=id_schema(self.role))]
        for f in files:
            self._check_token(f.token, f.epoch)
            objects = self._earlier if f.location and self._earlier is not None \
                else self.objects
            with self._errors("read"):
                data = objects.get(f.token)
            where = f"{objects.location}/{f.token}"
            if data is None:
                raise SinkError(f"cannot read {self.role} from {where}: it is gone (deleted "
                                "while the job runs?)")
            parts.append(self._ids(data, where))
        return pl.concat(parts, how="vertical")

    def _discard_pending(self) -> None:
        self._drop()
        self._staged.clear()
        self._prepared.clear()
        self._bytes.clear()
        self._failed.clear()

    def close(self) -> None:
        """Drop rows not yet prepared (no checkpoint can refer to them)."""
        self._drop()
        self._staged.clear()


class JsonlObjectSink(StagedObjectSink):
    """JSON Lines results, late events or bad records in object storage: each
    committed object holds exactly the lines the directory sink's file would."""

    ext = "jsonl"

    def __init__(self, objects: Objects, role: SinkRole, run_token: str) -> None:
        super().__init__(objects, role, run_token)
        self._chunks: dict[int, list[bytes]] = {}

    def _keep(self, epoch: int, frame: pl.DataFrame) -> None:
        from sealstream.sinks.jsonl import json_lines_bytes

        self._chunks.setdefault(epoch, []).append(json_lines_bytes(frame))

    def _encode(self, epoch: int) -> bytes | None:
        chunks = self._chunks.pop(epoch, None)
        return b"".join(chunks) if chunks else None

    def _drop(self) -> None:
        self._chunks.clear()

    def _ids(self, data: bytes, where: str) -> pl.DataFrame:
        from sealstream.sinks.jsonl import json_file_ids

        return json_file_ids(data, where, self.role, self.key_fields)


class ParquetObjectSink(StagedObjectSink):
    """Parquet results in object storage: each committed object is the file the
    Parquet directory sink would write (see :mod:`sealstream.sinks.parquet`)."""

    ext = "parquet"

    def __init__(self, objects: Objects, role: SinkRole = "results",
                 run_token: str | None = None) -> None:
        if role != "results":
            raise ValueError(
                f"a parquet output can only hold results, not {role!r}; use jsonl for it")
        if run_token is None:
            raise TypeError("ParquetObjectSink needs a run_token")
        super().__init__(objects, role, run_token)
        self._frames: dict[int, list[pl.DataFrame]] = {}

    def write(self, epoch: int, frame: pl.DataFrame) -> None:
        missing = [c for c in RESULT_ID_COLUMNS if c not in frame.columns]
        if missing:
            raise ValueError(f"the results frame lacks {', '.join(missing)}")
        super().write(epoch, frame)

    def _keep(self, epoch: int, frame: pl.DataFrame) -> None:
        self._frames.setdefault(epoch, []).append(frame.drop(JSON_LINE, strict=False))

    def _encode(self, epoch: int) -> bytes | None:
        from sealstream.sinks.parquet import encode_results

        frames = self._frames.pop(epoch, None)
        if not frames:
            return None
        where = f"{self.objects.location}/{self.staging_name(self.final_name(epoch))}"
        return encode_results(frames, self.key_fields, where)

    def _drop(self) -> None:
        self._frames.clear()

    def _ids(self, data: bytes, where: str) -> pl.DataFrame:
        from sealstream.sinks.parquet import results_file_ids

        return results_file_ids(where, data, self.key_fields)
