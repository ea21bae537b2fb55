"""Sources: where a pipeline's events come from.

Today: :class:`FileSource` (files read as partitions). Every source names a
``kind``, a ``key`` field and a ``time`` field.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import polars as pl

from sealstream.errors import SpecError

if TYPE_CHECKING:
    from sealstream.pipeline.kafka import KafkaSourceSpec
    from sealstream.pipeline.nats import NatsSourceSpec

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
        for i, written in enumerate(self.paths):
            if written.lower().startswith("s3://"):  # downloaded once (docs/object-storage.md)
                from sealstream.sources.files.s3 import resolve

                out.extend(resolve(f"source.paths[{i}]", written, self.base_dir))
                continue
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



_SOURCE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class SourceTransform:
    """One source's own transform in a several-source job (docs/joins.md): the spec's
    ``[sources.NAME.transform]`` table. ``fields``: derived fields of that source's
    events, name -> SQL (or Polars) expression, in order; ``where``: a filter over
    them. Both read that source's fields only, before the union."""

    where: str | pl.Expr | None = None
    fields: Mapping[str, str | pl.Expr] = field(default_factory=dict)


@dataclass(frozen=True)
class Sources:
    """Several sources in one job (docs/joins.md), keyed by name.

    Each member is a :class:`FileSource` (bounded, or followed), a
    :class:`~sealstream.pipeline.kafka.KafkaSourceSpec` or a
    :class:`~sealstream.pipeline.nats.NatsSourceSpec`, with its own kind, key and
    time fields. The job reads them as **one partition list**: the sources in name
    order, each one's partitions after each other (files in the order
    :meth:`FileSource.partitions` gives, a topic's partitions by number). Partitions
    are partitions (one global watermark over all of them), and this order is the read
    order that decides lateness when partitions interleave.

    With a Kafka or NATS source, or a followed file, the job is a live run (planned,
    recorded steps over every source's partitions, docs/live.md); its bounded file
    sources are then read as files that do not grow. Every source stops the same
    way: ``stop = "end"`` on every live source ends the run when every partition of
    every source has reached the end it had at start.

    The attributes below let the job treat the union as one source; ``key`` and
    ``time`` are the first source's (by name), for display only.

    >>> s = Sources({"views": FileSource("jsonl", ("v.jsonl",), "ad", "ts"),
    ...              "clicks": FileSource("csv", ("c.csv",), "ad_id", "time")})
    >>> s.names
    ('clicks', 'views')
    """

    members: Mapping[str, FileSource | KafkaSourceSpec | NatsSourceSpec]
    #: per source: its own filter and derived fields, applied before the union
    transforms: Mapping[str, SourceTransform] = field(default_factory=dict)
    kind: Literal["sources"] = "sources"
    follow: bool = False
    #: None: the members' common stop mode; "end" forces it (``sealstream replay``)
    stop: str | None = None
    fail_after_ms: int | None = None

    def __post_init__(self) -> None:
        from sealstream.pipeline.kafka import KafkaSourceSpec
        from sealstream.pipeline.nats import NatsSourceSpec

        if not isinstance(self.members, Mapping) or not self.members:
            raise SpecError("sources: expected a table of NAME = source, with at least one")
        for name, src in self.members.items():
            if not isinstance(name, str) or not _SOURCE_NAME.match(name):
                raise SpecError(f"sources.{name}: a source name is a letter then letters, "
                                "digits or _")
            if not isinstance(src, FileSource | KafkaSourceSpec | NatsSourceSpec):
                kind = getattr(src, "kind", type(src).__name__)
                raise SpecError(f"sources.{name}.kind: {kind!r}: not a source (a "
                                "FileSource, KafkaSourceSpec or NatsSourceSpec)")
            if src.key_fields is not None:
                raise SpecError(f"sources.{name}.key: a compound key is not supported yet "
                                "in a several-source job")
        if self.live:
            self._check_live()
        if not isinstance(self.transforms, Mapping):
            raise SpecError("sources: transforms= expects a mapping of source name to "
                            f"SourceTransform, got {self.transforms!r:.60}")
        for name, tf in self.transforms.items():
            if name not in self.members:
                raise SpecError(f"sources.{name}.transform: {name!r} is not a source; the "
                                f"sources are {', '.join(sorted(self.members))}")
            if not isinstance(tf, SourceTransform):
                raise SpecError(f"sources.{name}.transform: expected a SourceTransform, "
                                f"got {tf!r:.60}")

    def _check_live(self) -> None:
        """A live several-source job: files it can read as partitions of a live run,
        and one stop mode for every source."""
        modes: dict[str, list[str]] = {}
        for name in self.names:
            src = self.members[name]
            if isinstance(src, FileSource) and src.kind not in ("jsonl", "csv"):
                raise SpecError(f"sources.{name}.kind: {src.kind!r}: a {src.kind} file "
                                "source is not supported yet in a several-source job with "
                                "a live source (jsonl and csv files are)")
            modes.setdefault(src.stop_mode, []).append(name)
        if len(modes) > 1:
            ends, nevers = ", ".join(modes["end"]), ", ".join(modes["never"])
            raise SpecError(f"sources.{modes['never'][0]}.stop: every source of a "
                            "several-source job stops the same way (for now): "
                            f"{ends} stop(s) at the end they have at start, {nevers} "
                            "never; set stop = \"end\" on every live source (a backfill), "
                            "or follow = true on the file sources and no stop (a job that "
                            "runs until stopped)")

    @property
    def names(self) -> tuple[str, ...]:
        """The sources in read order (by name)."""
        return tuple(sorted(self.members))

    @property
    def first_named(self) -> str:
        """The source named first (the default left side of a left join)."""
        return next(iter(self.members))

    def _first(self) -> FileSource | KafkaSourceSpec | NatsSourceSpec:
        return self.members[self.names[0]]

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(p for n in self.names for p in self.members[n].paths)

    @property
    def poll_ms(self) -> int:
        """How long one poll of a quiet partition waits: the shortest of the sources'."""
        return min(self.members[n].poll_ms for n in self.names)

    @property
    def key(self) -> str:
        key = self._first().key
        assert isinstance(key, str)
        return key

    @property
    def time(self) -> str:
        return self._first().time

    @property
    def base_dir(self) -> Path:
        return self._first().base_dir

    @property
    def live(self) -> bool:
        """A live run when some source is (a Kafka topic, a followed file)."""
        return any(self.members[n].live for n in self.names)

    @property
    def stop_mode(self) -> str:
        """Every source's (they agree: checked), or ``stop`` when given."""
        return self.stop or self.members[self.names[0]].stop_mode

    @property
    def key_fields(self) -> tuple[str, ...] | None:
        return None

    def partitions(self, allow_empty: bool = False) -> list[tuple[str, Path]]:
        """Every source's partitions, sources in name order (the read order). A live
        job (``allow_empty``) lists none here: its run discovers them, in this order."""
        if self.live and allow_empty:
            return []
        if self.live:
            raise SpecError("sources: a several-source job with a live source has no "
                            "files to list; it is read live")
        out: list[tuple[str, Path]] = []
        owner: dict[str, str] = {}
        written_by: dict[str, str] = {}
        for name in self.names:
            member = self.members[name]
            assert isinstance(member, FileSource)  # a job of files only
            try:
                parts = member.partitions(allow_empty)
            except SpecError as exc:
                raise SpecError(f"sources.{name}.{str(exc).removeprefix('source.')}") from None
            for written, path in parts:
                real = os.path.realpath(path)
                if written in written_by:
                    raise SpecError(f"sources.{name}.paths: partition {written!r} is also "
                                    f"named by source {written_by[written]!r}")
                written_by[written] = name
                if real in owner:
                    raise SpecError(f"sources.{name}.paths: {written!r} is also a partition "
                                    f"of source {owner[real]!r}; a file belongs to one source")
                owner[real] = name
                out.append((written, path))
        return out

    def is_topic_partition(self, partition: str) -> bool:
        """Whether ``partition`` is a partition of a Kafka source (``TOPIC/N``: its
        records are named by offset, not by line)."""
        topic, _, n = partition.rpartition("/")
        return n.isdigit() and any(getattr(m, "topic", None) == topic and m.kind == "kafka"
                                   for m in self.members.values())

    def partition_sources(self) -> list[str]:
        """The source of each partition, in :meth:`partitions` order."""
        return [name for name in self.names for _ in self.members[name].partitions()]
