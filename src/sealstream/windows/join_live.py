"""A live several-source job (docs/joins.md): every source's partitions as one
:class:`~sealstream.sources._live.LiveSource`, which the one-source live runtime
(:mod:`sealstream._runtime.live`) plans, records and replays unchanged.

* :meth:`UnionLiveSource.discover` lists the sources in name order, each one's
  partitions in its own stable order (a topic's by number, files as matched): the
  read order of the union, as for a job of files. Partitions that appear later (a
  topic that grew, a new file) are appended where the runtime finds them.
* Each partition keeps its own name (``clicks/0``, ``in/views.jsonl``) and its
  own integer positions; a name belongs to one source (two sources reading the same
  topic or file are refused). Checkpoints and recorded steps therefore bind the
  position of every partition of every source, with nothing special for the union.
* A partition's chunks go through its source's
  :class:`~sealstream.windows.join.Tagger` (its transform, its fields renamed, its
  condition columns) as they are polled: one column operation per chunk.
* A bounded file source of a live job is read as a file that may grow
  (:class:`~sealstream.sources.files.follow.FollowedFiles`); with ``stop = "end"``
  its end is its length at start, as a topic's is its end offset at start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from fnmatch import fnmatch
from typing import Any

from sealstream.errors import SourceError
from sealstream.pipeline import Pipeline
from sealstream.pipeline.join import source_plan
from sealstream.pipeline.kafka import KafkaSourceSpec
from sealstream.pipeline.nats import NatsSourceSpec
from sealstream.pipeline.source import Sources
from sealstream.sources._base import Chunk, PartitionPosition
from sealstream.sources._live import LivePartition, LiveSource
from sealstream.sources.files.follow import FollowedFiles
from sealstream.windows.join import Tagger, tagger

__all__ = ["TaggedPartition", "UnionLiveSource", "open_union"]


class TaggedPartition:
    """A live partition of one source whose chunks carry the union's columns; every
    other attribute (``first_file``, ``position``, ``connected``...) is the
    partition's own."""

    def __init__(self, part: LivePartition, tag: Tagger, end_once: bool = False) -> None:
        """``end_once``: a file's end is measured once (``stop = "end"`` reads it when
        the partition opens), then unknown: the lag of a file is not measured (a
        whole-file count every few seconds would cost more than it tells)."""
        self.part = part
        self.name = part.name
        self._tag = tag
        self._end_once = end_once
        self._ended = False

    def poll(self, max_records: int, timeout_ms: int) -> Chunk | None:
        chunk = self.part.poll(max_records, timeout_ms)
        return None if chunk is None else self._tag.tag(chunk)

    def seek(self, position: int) -> None:
        self.part.seek(position)

    def tell(self) -> int:
        return self.part.tell()

    def earliest(self) -> int | None:
        return self.part.earliest()

    def end(self) -> int | None:
        if self._end_once and self._ended:
            return None
        self._ended = True
        return self.part.end()

    def close(self) -> None:
        self.part.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.part, name)


class UnionLiveSource:
    """Several live sources as one; see the module docstring."""

    def __init__(self, members: Mapping[str, LiveSource], taggers: Mapping[str, Tagger]
                 ) -> None:
        self.members = dict(members)
        self.taggers = dict(taggers)
        #: partition name -> the source that reads it
        self.owner: dict[str, str] = {}
        #: the sources of files (their lag is not measured)
        self.files = {src for src, m in self.members.items()
                      if isinstance(m, FollowedFiles)}

    def discover(self) -> list[str]:
        out: list[str] = []
        for src in sorted(self.members):
            try:
                names = self.members[src].discover()
            except SourceError as exc:
                raise _named(exc, src) from None
            for n in names:
                if self.owner.setdefault(n, src) != src:
                    raise SourceError(f"sources.{src}: partition {n!r} is also read by "
                                      f"source {self.owner[n]!r}; a partition belongs to "
                                      "one source (give each its own topic or files)")
                out.append(n)
        return out

    def _member(self, name: str) -> str:
        if name not in self.owner:
            self.discover()
        if name not in self.owner:
            raise SourceError(f"partition {name!r} belongs to none of the sources "
                              f"{', '.join(sorted(self.members))}")
        return self.owner[name]

    def open(self, name: str, position: int | None, from_start: bool = False
             ) -> TaggedPartition:
        src = self._member(name)
        try:
            part = self.members[src].open(name, position, from_start)
        except SourceError as exc:
            raise _named(exc, src) from None
        return TaggedPartition(part, self.taggers[src], src in self.files)

    def open_at(self, name: str, position: PartitionPosition) -> TaggedPartition:
        """A followed file's partition at a full file position."""
        src = self._member(name)
        open_at = getattr(self.members[src], "open_at", None)
        if open_at is None:  # an integer position: the source seeks to it
            return self.open(name, position.offset)
        return TaggedPartition(open_at(name, position), self.taggers[src], src in self.files)

    def commit_group(self, positions: dict[str, int]) -> None:
        for src, member in self.members.items():
            own = {n: at for n, at in positions.items() if self.owner.get(n) == src}
            if own:
                member.commit_group(own)

    @property
    def connected(self) -> bool | None:
        """Whether every broker answers (None: no source has a broker)."""
        flags = [f for m in self.members.values()
                 if isinstance(f := getattr(m, "connected", None), bool)]
        return all(flags) if flags else None

    def close(self) -> None:
        for member in self.members.values():
            member.close()


def _named(exc: SourceError, src: str) -> SourceError:
    """The error with the source's name in front (its class kept: its exit code)."""
    try:
        out = type(exc)(f"sources.{src}: {exc}")
    except TypeError:
        out = SourceError(f"sources.{src}: {exc}")
    return out


def open_union(p: Pipeline, known: Mapping[str, PartitionPosition]) -> UnionLiveSource:
    """The live source of the several-source pipeline ``p``; ``known``: a restored
    checkpoint's positions by partition name (followed files know their files)."""
    assert isinstance(p.source, Sources)
    aggs = p.parsed_aggregates
    members: dict[str, LiveSource] = {}
    for src in p.source.names:
        spec = p.source.members[src]
        plan = source_plan(aggs, p.source, src)
        if isinstance(spec, KafkaSourceSpec):
            if spec.group is None:  # the consumer group told the positions: the job's name
                spec = replace(spec, group=p.name)
            members[src] = spec.open_live(plan)
        elif isinstance(spec, NatsSourceSpec):
            members[src] = spec.open_live(plan)
        else:
            own = {n: pos for n, pos in known.items()
                   if any(n == pat or fnmatch(n, pat) for pat in spec.paths)}
            members[src] = FollowedFiles(spec.kind, spec, plan, known=own)
    return UnionLiveSource(members, {src: tagger(p, src) for src in p.source.names})
