"""Sources: where a pipeline's events come from.

Today: :class:`FileSource` (files read as partitions). Every source names a
``kind``, a ``key`` field and a ``time`` field.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sealstream.errors import SpecError

SourceKind = Literal["jsonl", "csv", "parquet"]


@dataclass(frozen=True)
class FileSource:
    """Files read as partitions, one partition per file, in the order given.

    ``paths`` are as written by the user (globs allowed); ``base_dir`` is what
    they are relative to. :meth:`partitions` expands globs (sorted) and checks
    that every file exists.
    """

    kind: SourceKind
    paths: tuple[str, ...]
    #: the key field, or several (a compound key, each shown under its own name)
    key: str | tuple[str, ...]
    time: str
    base_dir: Path = Path(".")
    #: keep reading lines appended to the files, and open files that start to match
    #: a glob as new partitions (a live run; docs/live.md)
    follow: bool = False
    #: "end": stop at the end positions seen at start (then W = +inf, everything
    #: fires); "never": run until SIGTERM/SIGINT. Default: "never" when following,
    #: else "end" (a bounded run)
    stop: str | None = None
    #: brokers only: a file source refuses it (a file has no connection to retry)
    fail_after_ms: int | None = None
    #: how long one poll of a quiet partition waits for records
    poll_ms: int = 200

    def __post_init__(self) -> None:
        if self.stop not in (None, "end", "never"):
            raise SpecError(f"source.stop: expected \"end\" or \"never\", got {self.stop!r}")
        if self.poll_ms < 0:
            raise SpecError(f"source.poll_ms: expected an integer >= 0, got {self.poll_ms}")
        if self.fail_after_ms is not None:
            # files are never "unreachable for a while": the setting would mean nothing
            raise SpecError(
                f"source.fail_after_ms: only broker sources (kind = \"kafka\" or \"nats\") "
                f"retry a lost connection; a {self.kind} file source has none to retry "
                "(remove the setting)")

    @property
    def live(self) -> bool:
        """Whether runs of this source are live (planned steps, stop modes, signals)."""
        return self.follow

    @property
    def stop_mode(self) -> str:
        return self.stop or ("never" if self.live else "end")

    @property
    def key_fields(self) -> tuple[str, ...] | None:
        """The fields of a key written as a list (results show each under its own
        name); None for a key written as one name (results show it as ``key``)."""
        return None if isinstance(self.key, str) else tuple(self.key)

    def partitions(self, allow_empty: bool = False) -> list[tuple[str, Path]]:
        """``(name as written, resolved path)`` for every partition, in read order.
        ``allow_empty``: a glob matching nothing (yet) is not an error (following)."""
        out: list[tuple[str, Path]] = []
        for written in self.paths:
            if glob.has_magic(written):
                matches = sorted(glob.glob(written, root_dir=self.base_dir))
                if not matches and allow_empty:
                    continue
                if not matches:
                    raise SpecError(f"source.paths: {written!r} matches no file in {self.base_dir}")
                for m in matches:
                    path = self.base_dir / m
                    if not path.is_file():
                        raise SpecError(f"source.paths: {written!r} matches {m!r}, which is "
                                        f"{_not_a_file(path)}")
                    out.append((m, path))
            else:
                path = self.base_dir / written
                if not path.is_file():
                    what = ("does not exist" if not path.exists()
                            else f"is {_not_a_file(path)}")
                    raise SpecError(f"source.paths: input file {written!r} {what} ({path})")
                out.append((written, path))
        seen: dict[str, str] = {}
        for name, path in out:
            real = os.path.realpath(path)
            if real in seen:
                same = ("is listed twice" if seen[real] == name
                        else f"and {seen[real]!r} are the same file")
                raise SpecError(f"source.paths: partition {name!r} {same}")
            seen[real] = name
        return out


def _not_a_file(path: Path) -> str:
    return "a directory, not a file" if path.is_dir() else "not a regular file"

