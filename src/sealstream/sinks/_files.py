"""Durable-file helpers shared by the directory sinks (and usable elsewhere).

Guarantees, on a POSIX filesystem that honours ``fsync``:

* :func:`fsync_file` / :func:`fsync_dir` (from :mod:`sealstream._fs`, re-exported
  here) return only once the file's data, or the directory's entries, are on
  stable storage.
* :func:`atomic_rename` makes ``dst`` appear with the complete contents of
  ``src`` in one step (readers see the old state or the new one, never a mix)
  and fsyncs the directory, so the rename survives a crash once it returns.
* :func:`write_new` creates a file only if it is absent, with all its bytes:
  the data goes to a hidden temporary name first, is fsynced, and is then
  hard-linked to its final name (``link`` fails when the name exists, so a file
  already there is never overwritten). Readers never see a partial file.

Assumed: both names of a rename or link are in the same directory (same
filesystem); a single writer per directory (the checkpoint lock ensures it).

These helpers raise :class:`OSError` unchanged; callers turn it into their own
error with :func:`os_reason` (``"[Errno 28] No space left on device"``).

Also here, because every sink needs them: :func:`id_schema`, the schema of
``Sink.read_ids`` frames, :class:`PartNames`, the part naming of the directory
sinks and the object-storage ones, and :class:`StagedDirSink`, the
commit/recover protocol shared by the JSON Lines and Parquet directory sinks,
and :func:`read_own_file`, how they read their committed files back: without
following a symbolic link, regular files only, never quoting a file's content.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
from pathlib import Path

import polars as pl

from sealstream._fs import fsync_dir, fsync_file, os_reason
from sealstream.errors import SinkError
from sealstream.sinks._base import CommittedFile, Sink, SinkRole

__all__ = [
    "STAGING_SUFFIX",
    "PartNames",
    "StagedDirSink",
    "atomic_rename",
    "check_epoch",
    "check_role",
    "check_run_token",
    "ensure_dir",
    "fsync_dir",
    "fsync_file",
    "id_schema",
    "is_regular_file",
    "json_value_text",
    "os_reason",
    "read_own_file",
    "remove_if_exists",
    "split_compound_key",
    "split_json_fields",
    "symlink_refusal",
    "write_new",
]


def ensure_dir(path: str | os.PathLike[str]) -> None:
    """Create directory ``path`` with its parents if missing, durably.

    Raises :class:`NotADirectoryError` when ``path`` exists and is not a
    directory, and whatever ``mkdir`` raises (e.g. a parent is a regular file).
    """
    p = Path(path)
    if p.is_dir():
        return
    if p.exists():
        raise NotADirectoryError(20, os.strerror(20), str(p))
    missing = [p]
    while not missing[-1].parent.exists() and missing[-1].parent != missing[-1]:
        missing.append(missing[-1].parent)
    p.mkdir(parents=True, exist_ok=True)
    # make every newly created name durable in its parent
    for created in reversed(missing):
        fsync_dir(created.parent)


def atomic_rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Rename ``src`` to ``dst`` (replacing ``dst`` if it is a file) and fsync the directory."""
    os.replace(src, dst)
    fsync_dir(Path(dst).parent)
    src_dir = Path(src).parent
    if src_dir != Path(dst).parent:
        fsync_dir(src_dir)


def remove_if_exists(path: str | os.PathLike[str]) -> bool:
    """Unlink ``path``; return whether it existed. Does not fsync the directory."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def write_new(path: str | os.PathLike[str], data: bytes) -> None:
    """Create ``path`` holding exactly ``data``, only if no file of that name exists.

    Raises :class:`FileExistsError` (and leaves the existing file untouched)
    when ``path`` exists. On any error no file is left under ``path`` or under
    the temporary name. On return the file and its directory entry are durable.
    """
    final = Path(path)
    tmp = final.with_name(f".{final.name}.{secrets.token_hex(6)}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            fsync_file(f)
        os.link(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.unlink(tmp)
    fsync_dir(final.parent)


_RESULT_IDS: dict[str, pl.DataType] = {
    "key": pl.String(),
    "__kint": pl.Boolean(),
    "window_start": pl.Int64(),
    "window_end": pl.Int64(),
}
_RECORD_IDS: dict[str, pl.DataType] = {"_partition": pl.String(), "_offset": pl.Int64()}


def id_schema(role: SinkRole) -> dict[str, pl.DataType]:
    """Column name -> dtype of the frame ``Sink.read_ids`` returns for ``role``.

    results: ``key`` String (JSON strings unquoted, integers as decimal text),
    ``__kint`` Boolean (the key is an integer), ``window_start``/``window_end``
    Int64. records: ``_partition`` String, ``_offset`` Int64.
    """
    return dict(_RESULT_IDS if role == "results" else _RECORD_IDS)


# --------------------------------------------------------------------------- compound keys
# A compound key's identity is the text the transform stage builds
# (``"tenant":"acme","user":7``: each field's JSON after its quoted name, see
# ``sealstream.transforms._stage._compound_key``). Sinks that store each field in a
# column of its own split that text into typed values, and rebuild it when they
# read their identities back. The engine writes a field's value as: an integer in
# decimal (always within Int64), a float as Polars formats a Float64 (always with
# a ``.`` or an exponent), ``true``/``false``, or a JSON string.

#: a field's kind in a compound key: string, integer, float, boolean
KEY_KINDS = "sifb"


def split_compound_key(key: pl.Series, fields: tuple[str, ...]) -> list[pl.DataFrame]:
    """For each field of the compound key texts ``key``, a frame of ``kind`` (one
    letter of :data:`KEY_KINDS`), ``text`` (the value as text: a string unescaped,
    a number or boolean as its JSON text) and the typed values ``s`` (String), ``i``
    (Int64), ``f`` (Float64), ``b`` (Boolean), each null where the value is of
    another kind. Columnar; raises :class:`ValueError` when a text is not a compound
    key of ``fields``."""
    if not key.len():
        return [_EMPTY_SPLIT for _ in fields]
    # one JSON object a line: "{" + key + "}" (the key's strings are JSON-escaped)
    blob = ("{" + key.cast(pl.String) + "}\n").str.join("").item().encode()
    bad = ValueError(f"the results' key is not a compound key of {list(fields)}")
    try:
        out = split_json_fields(blob, fields)
    except pl.exceptions.PolarsError:
        raise bad from None
    if out[0].height != key.len():
        raise bad
    for f, part in zip(fields, out, strict=True):
        if part.get_column("text").null_count():
            raise ValueError(f"a result's compound key lacks field {f!r}")
    return out


_EMPTY_SPLIT = pl.DataFrame(schema={"kind": pl.String, "text": pl.String, "s": pl.String,
                                    "i": pl.Int64, "f": pl.Float64, "b": pl.Boolean})


def split_json_fields(blob: bytes, fields: tuple[str, ...]) -> list[pl.DataFrame]:
    """:func:`split_compound_key` of the top-level ``fields`` of JSON Lines ``blob``
    (a missing or null field: null ``kind`` and ``text``). Raises Polars' error when
    a line is not a JSON object."""
    s = pl.read_ndjson(blob, schema={f: pl.String for f in fields})
    i, x, b = (pl.read_ndjson(blob, schema={f: dtype for f in fields}, ignore_errors=True)
               for dtype in (pl.Int64, pl.Float64, pl.Boolean))
    out = []
    for f in fields:
        frame = pl.DataFrame({"s": s.get_column(f), "i": i.get_column(f),
                              "f": x.get_column(f), "b": b.get_column(f)})
        is_b, is_i = pl.col("b").is_not_null(), pl.col("i").is_not_null()
        is_f = pl.col("f").is_not_null() & ~is_i
        kind = (pl.when(is_b).then(pl.lit("b")).when(is_i).then(pl.lit("i"))
                .when(is_f).then(pl.lit("f")).when(pl.col("s").is_not_null())
                .then(pl.lit("s")))
        text = (pl.when(is_i).then(pl.col("i").cast(pl.String))
                .when(is_f).then(pl.col("f").cast(pl.String))
                .otherwise(pl.col("s")))
        out.append(frame.select(
            kind.alias("kind"), text.alias("text"),
            pl.when(~is_b & ~is_i & ~is_f).then(pl.col("s")).alias("s"),
            "i", pl.when(is_f).then(pl.col("f")).alias("f"), "b"))
    return out


def json_value_text(kind: pl.Expr, text: pl.Expr) -> pl.Expr:
    """A field's JSON text from its kind letter and text (see :func:`split_compound_key`)."""
    from sealstream.sources._parse import json_str

    return pl.when(kind == "s").then(json_str(text)).otherwise(text)


# --------------------------------------------------------------------------- staged directory
# The naming scheme and the commit/recover protocol shared by the directory
# sinks (JSONL, Parquet). Subclasses supply how rows are staged and prepared.

_RUN_TOKEN_RE = re.compile(r"[A-Za-z0-9]{1,64}")
STAGING_SUFFIX = ".inprogress"


def check_epoch(epoch: int) -> int:
    """Return ``epoch`` if it is a non-negative int, else raise :class:`ValueError`."""
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"epoch must be a non-negative integer, got {epoch!r}")
    return epoch


def check_run_token(run_token: str) -> str:
    """Return ``run_token`` if it is 1-64 ASCII letters/digits, else raise :class:`ValueError`."""
    if not isinstance(run_token, str) or not _RUN_TOKEN_RE.fullmatch(run_token):
        raise ValueError(f"run_token must be 1-64 ASCII letters or digits, got {run_token!r}")
    return run_token


def check_role(role: str) -> SinkRole:
    if role == "results":
        return "results"
    if role == "records":
        return "records"
    raise ValueError(f"role must be 'results' or 'records', got {role!r}")


class PartNames:
    """The part naming shared by the directory sinks (:class:`StagedDirSink`) and the
    object-storage ones (:class:`~sealstream.sinks.objects.StagedObjectSink`):
    ``part-{epoch:012d}-{run_token}.{ext}``, staged as
    ``.part-{epoch:012d}-{run_token}.{ext}.inprogress``; a name whose epoch is not
    written canonically (12 digits at least, zero-padded) is not one of ours.
    A subclass sets ``ext``, ``role`` and ``run_token``, calls :meth:`_init_names`,
    and says where its parts are (:meth:`_part_where`) and what they are called
    (``_part_kind``) for error lines."""

    ext: str = ""
    _part_kind: str = "file"
    role: SinkRole
    run_token: str

    def _init_names(self) -> None:
        ext = re.escape(self.ext)
        self._final_re = re.compile(rf"part-([0-9]{{12,}})-([A-Za-z0-9]+)\.{ext}")
        self._staging_re = re.compile(rf"\.part-([0-9]{{12,}})-([A-Za-z0-9]+)\.{ext}\.inprogress")

    def _part_where(self) -> str:
        raise NotImplementedError

    def final_name(self, epoch: int) -> str:
        return f"part-{check_epoch(epoch):012d}-{self.run_token}.{self.ext}"

    @staticmethod
    def staging_name(final_name: str) -> str:
        return f".{final_name}{STAGING_SUFFIX}"

    def _parse(self, pattern: re.Pattern[str], name: str) -> tuple[int, str] | None:
        m = pattern.fullmatch(name)
        if m is None:
            return None
        digits, run = m.group(1), m.group(2)
        epoch = int(digits)
        if f"{epoch:012d}" != digits:  # not canonical: not one of ours
            return None
        return epoch, run

    def _check_token(self, token: str, epoch: int | None = None) -> int:
        parsed = self._parse(self._final_re, token) if isinstance(token, str) else None
        where = self._part_where()
        if parsed is None:
            raise SinkError(
                f"{where}: {token!r} is not a {self.role} {self._part_kind} name of this "
                f"sink (expected part-<epoch>-<run>.{self.ext})"
            )
        if epoch is not None and parsed[0] != epoch:
            raise SinkError(f"{where}: token {token!r} does not belong to epoch {epoch}")
        return parsed[0]

    def _run_of(self, token: str) -> str:
        """The run token in a checked final name."""
        parsed = self._parse(self._final_re, token)
        assert parsed is not None, token
        return parsed[1]


class StagedDirSink(PartNames, Sink):
    """A directory of ``part-{epoch:012d}-{run_token}.{ext}`` files, staged as
    ``.part-{epoch:012d}-{run_token}.{ext}.inprogress``.

    Commit tokens are the final file names. An epoch has at most one file per
    run token; epochs have at least 12 digits (zero-padded, more when the epoch
    is 10**12 or larger) and :meth:`committed` orders by the number, not the
    text. Files that do not match the scheme are never touched or listed.

    Subclasses implement ``write``/``prepare``/``read_ids`` and
    :meth:`_discard_pending`; this class implements ``commit``, ``recover``,
    ``committed`` and the error translation (every :class:`OSError` becomes a
    one-line :class:`SinkError` naming the path and the OS reason).
    """

    ext: str = ""

    def __init__(self, path: str | os.PathLike[str], role: SinkRole, run_token: str) -> None:
        if not self.ext:
            raise TypeError("StagedDirSink subclasses must set ext")
        self.role = check_role(role)
        self.run_token = check_run_token(run_token)
        self.path = Path(path)
        #: the directory the restored checkpoint staged in, when not ``path``
        self._earlier: Path | None = None
        self._init_names()
        try:
            ensure_dir(self.path)
        except OSError as exc:
            raise SinkError(
                f"cannot create the {self.role} directory {self.path}: {os_reason(exc)}"
            ) from None

    # ---------------------------------------------------------------- naming
    def _part_where(self) -> str:
        return str(self.path)

    def _sink_error(self, action: str, path: Path, exc: OSError) -> SinkError:
        return SinkError(f"cannot {action} {self.role} to {path}: {os_reason(exc)}")

    # ---------------------------------------------------------------- hooks
    def _discard_pending(self) -> None:
        """Forget all unprepared in-memory state and close open staging handles."""

    def _forget(self, epoch: int) -> None:
        """Drop bookkeeping of ``epoch`` after it was committed."""

    def _check_not_committed(self, epoch: int) -> None:
        """Refuse to stage a new epoch whose file of this run is already published
        (its new rows would be dropped silently by the idempotent commit)."""
        final = self.path / self.final_name(epoch)
        if os.path.lexists(final):
            raise ValueError(f"epoch {epoch} is already committed as {final}")

    # ---------------------------------------------------------------- protocol
    def location(self) -> str:
        """The directory as an absolute path, symbolic links resolved (recorded by
        checkpoints; see :meth:`recover_at`)."""
        return str(self.path.resolve())

    def commit(self, epoch: int, tokens: list[str]) -> None:
        """Rename each token's staging file to its final name, then fsync the directory.

        Idempotent: a token whose final file exists is already committed (a
        leftover staging copy of it is removed). Raises :class:`SinkError` if
        neither the staging nor the final file exists (prepared data was lost)
        or a rename fails. A symbolic link under the final name is not a
        committed file: the rename replaces the link (never its target).
        """
        check_epoch(epoch)
        for token in tokens:
            self._check_token(token, epoch)
        self._commit_in(self.path, epoch, tokens)
        self._forget(epoch)

    def _commit_in(self, directory: Path, epoch: int, tokens: list[str]) -> None:
        changed = False
        for token in tokens:
            final = directory / token
            staging = directory / self.staging_name(token)
            if is_regular_file(final):
                try:
                    changed |= remove_if_exists(staging)
                except OSError as exc:
                    raise SinkError(
                        f"cannot remove {self.role} staging file {staging}: {os_reason(exc)}"
                    ) from None
                continue
            try:
                os.replace(staging, final)
            except FileNotFoundError:
                if is_regular_file(final):  # committed concurrently; nothing lost
                    continue
                raise SinkError(
                    f"cannot commit {self.role} epoch {epoch}: neither {staging} nor {final} "
                    "exists; prepared output was deleted"
                ) from None
            except OSError as exc:
                raise SinkError(
                    f"cannot commit {self.role} {staging} to {final}: {os_reason(exc)}"
                ) from None
            changed = True
        if changed:
            self._fsync_dir(directory)

    def _holds(self, directory: Path, token: str) -> bool:
        """``token`` is staged or committed in ``directory``."""
        return is_regular_file(directory / token) or os.path.lexists(
            directory / self.staging_name(token)
        )

    def recover(self, prepared: dict[int, list[str]]) -> None:
        """Commit ``prepared`` (see :meth:`commit`), then delete every other staging
        file of this naming scheme in the directory, whatever its epoch or run
        token: no checkpoint refers to it, the replay will produce its rows again.
        """
        self._discard_pending()
        for epoch in sorted(prepared):
            self.commit(epoch, list(prepared[epoch]))
        removed = False
        for name in self._names():
            if self._parse(self._staging_re, name) is None:
                continue
            try:
                removed |= remove_if_exists(self.path / name)
            except OSError as exc:
                raise SinkError(
                    f"cannot remove {self.role} staging file {self.path / name}: {os_reason(exc)}"
                ) from None
        if removed:
            self._fsync_dir()

    def recover_at(self, staged_at: object, prepared: dict[int, list[str]]) -> None:
        """:meth:`recover`, where ``staged_at`` is the directory the checkpoint's epoch
        was staged in (:meth:`location` then; None when the checkpoint did not
        record it, as older checkpoints do not: plain :meth:`recover`).

        When ``staged_at`` is another directory (the output's path changed between
        runs), each prepared token is committed where it is: in ``staged_at`` when
        its staging or final file is there, else in this sink's directory (the
        whole directory was moved). ``staged_at`` is never created; the only other
        files removed there are staging files of the run that staged the tokens
        (its later epochs: no valid checkpoint refers to them), so a directory now
        used by another job loses nothing. From then on :meth:`committed` also lists the final
        files in ``staged_at``, so that output committed there after the restored
        checkpoint is not produced again here.

        Raises :class:`SinkError` when ``staged_at`` is not an absolute path, or a
        prepared token is in neither directory (prepared output was deleted).
        """
        if staged_at is None:
            self.recover(prepared)
            return
        if not isinstance(staged_at, str) or not os.path.isabs(staged_at) or "\0" in staged_at:
            raise SinkError(
                f"{self.path}: the checkpoint records {staged_at!r} as the {self.role} "
                "directory of its epoch; expected an absolute path"
            )
        earlier = Path(staged_at)
        if earlier == Path(self.location()):
            self.recover(prepared)
            return
        self._discard_pending()
        here: dict[int, list[str]] = {}
        for epoch in sorted(prepared):
            tokens = list(prepared[epoch])
            for token in tokens:
                self._check_token(token, epoch)
            there = [t for t in tokens if self._holds(earlier, t)]
            self._commit_in(earlier, epoch, there)
            here[epoch] = [t for t in tokens if t not in there]
            for token in here[epoch]:
                if not self._holds(self.path, token):
                    raise SinkError(
                        f"cannot commit {self.role} epoch {epoch}: {token} is staged neither "
                        f"in {earlier} (where the checkpoint staged it) nor in {self.path}; "
                        "prepared output was deleted"
                    )
        self._earlier = earlier
        self._sweep_runs(earlier, {self._run_of(t) for ts in prepared.values() for t in ts})
        self.recover(here)

    def _sweep_runs(self, directory: Path, runs: set[str]) -> None:
        """Delete the staging files of run tokens ``runs`` in ``directory``."""
        removed = False
        for name in self._names(directory) if runs else []:
            parsed = self._parse(self._staging_re, name)
            if parsed is None or parsed[1] not in runs:
                continue
            try:
                removed |= remove_if_exists(directory / name)
            except OSError as exc:
                raise SinkError(
                    f"cannot remove {self.role} staging file {directory / name}: {os_reason(exc)}"
                ) from None
        if removed:
            self._fsync_dir(directory)

    def committed(self) -> list[CommittedFile]:
        """Every final file of the scheme (any run token), ordered by epoch then name;
        also those in the directory the restored checkpoint staged in, when it was
        another one (see :meth:`recover_at`). Raises :class:`SinkError` for a
        symbolic link under a final name: it is not followed."""
        out = [CommittedFile(e, name) for e, name in self._finals(self.path)]
        if self._earlier is not None:
            where = str(self._earlier)
            out.extend(CommittedFile(e, name, where) for e, name in self._finals(self._earlier))
        out.sort(key=lambda c: (c.epoch, c.token, c.location or ""))
        return out

    def _finals(self, directory: Path) -> list[tuple[int, str]]:
        found = []
        for name in self._names(directory):
            parsed = self._parse(self._final_re, name)
            if parsed is None:
                continue
            try:
                mode = os.lstat(directory / name).st_mode
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise SinkError(
                    f"cannot read {self.role} file {directory / name}: {os_reason(exc)}"
                ) from None
            if stat.S_ISLNK(mode):
                raise SinkError(symlink_refusal(self.role, directory / name))
            if stat.S_ISREG(mode):
                found.append((parsed[0], name))
        return found

    def _files_of(self, files: list[CommittedFile]) -> list[Path]:
        paths = []
        for f in files:
            self._check_token(f.token, f.epoch)
            paths.append((Path(f.location) if f.location else self.path) / f.token)
        return paths

    def _names(self, directory: Path | None = None) -> list[str]:
        where = self.path if directory is None else directory
        try:
            return os.listdir(where)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise SinkError(
                f"cannot list the {self.role} directory {where}: {os_reason(exc)}"
            ) from None

    def _fsync_dir(self, directory: Path | None = None) -> None:
        where = self.path if directory is None else directory
        try:
            fsync_dir(where)
        except OSError as exc:
            raise SinkError(
                f"cannot sync the {self.role} directory {where}: {os_reason(exc)}"
            ) from None


# --------------------------------------------------------------------------- reading back
def is_regular_file(path: Path) -> bool:
    """``path`` is a regular file itself (a symbolic link is not, whatever it points to)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def symlink_refusal(role: str, path: Path) -> str:
    return (
        f"{path} is a symbolic link, not a {role} file written by sealstream (which writes "
        "regular files only); it is not followed and nothing of its target was read: "
        "replace the link with the file itself, or remove it"
    )


def read_own_file(path: Path, role: str) -> bytes:
    """The bytes of a committed output file, opened without following a symbolic link
    (``O_NOFOLLOW``) and without blocking on a FIFO; anything but a regular file is
    refused. Raises :class:`SinkError` naming ``path``; the message never quotes the
    file's content."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise SinkError(symlink_refusal(role, path)) from None
        raise SinkError(f"cannot read {role} from {path}: {os_reason(exc)}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SinkError(f"cannot read {role} from {path}: it is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    except OSError as exc:
        raise SinkError(f"cannot read {role} from {path}: {os_reason(exc)}") from None
    finally:
        os.close(fd)
