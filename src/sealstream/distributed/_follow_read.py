"""Followed files (``follow = true``) on the data plane: each partition's owner worker
opens and follows its file; the coordinator plans, records and replays the steps.

It is the Kafka/NATS design of :mod:`.live` and :mod:`._live_read` with a file's
positions. Partition ``q`` (a file, in order of discovery) is read by worker
``q mod N`` through the single-process classes of
:mod:`sealstream.sources.files.follow` (:class:`FollowedFile`): the same rotation
and truncation detection, the same one-line errors, raised on the worker and re-raised
by the coordinator as themselves (so the exit codes are one process's). The owner
reports three numbers per step (the position after the lines it holds, its first and
last line held); the coordinator decides the ranges exactly as the single-process
planner decides from what it polled, records the plan (with the file each new
partition starts in, its device and inode, as one process records it), and each owner
takes exactly its range, parses it and publishes it to the key workers through Ray's
object store. Its summary carries the partition's *full* position (the line offset,
the byte offset, the file's identity and the files rotated away), from which the
reader resumes: the checkpoint records it exactly as one process records it.

Discovery stays on the coordinator (a glob, metadata only): it learns from the reported
positions which files the partitions read or have read to their end, so that a rotated
file still matching the glob is not taken for a new partition, and a copy of a file's
first bytes is refused, as on one process.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from sealstream._runtime.live import _Cursor
from sealstream._runtime.merge import SourcePosition
from sealstream.checkpoint.plans import StepPlan
from sealstream.distributed._live_read import LiveReader
from sealstream.distributed._shard import gather
from sealstream.distributed.live import FOLLOWED_ON_WORKERS, LivePlanner, _Remote
from sealstream.errors import SourceError
from sealstream.pipeline import Pipeline
from sealstream.sources._base import Chunk, PartitionPosition
from sealstream.sources.files._rotation import HEAD_BYTES, own_identity
from sealstream.sources.files.follow import FollowedFile, FollowedFiles

#: what the owner of a followed partition answers when it opens it: the line offset it
#: starts at, the full position to resume from there, the file it starts in
Opened = tuple[int, dict[str, Any], tuple[int, int]]


def following(pipeline: Pipeline) -> bool:
    """Whether the job follows files (``follow = true`` on a file source)."""
    src = pipeline.source
    return bool(getattr(src, "follow", False)) and src.kind in FOLLOWED_ON_WORKERS


class _Tracked:
    """A :class:`FollowedFile` that remembers its full positions after each poll, so
    that its owner can say where a restart resumes to find a line offset: the last
    position at or before it (the reader skips the lines below it, as one process
    does from a checkpoint whose resume position lies before ``next``)."""

    def __init__(self, part: FollowedFile) -> None:
        self.part = part
        self.first_file = part.first_file
        self.marks: list[PartitionPosition] = [part.position]

    def poll(self, max_records: int, timeout_ms: int) -> Chunk | None:
        got = self.part.poll(max_records, timeout_ms)
        now = self.part.position
        if now != self.marks[-1]:  # (a quiet file's polls add nothing)
            self.marks.append(now)
        return got

    def seek(self, position: int) -> None:
        self.part.seek(position)
        self.marks = [self.part.position]

    def resume(self, nxt: int) -> PartitionPosition:
        """The full position to resume from to read on at line ``nxt`` (older marks
        dropped)."""
        keep = 0
        for i, m in enumerate(self.marks):
            if m.offset <= nxt:
                keep = i
        del self.marks[:keep]
        return self.marks[0]

    def tell(self) -> int:
        return self.part.tell()

    def earliest(self) -> int | None:
        return self.part.earliest()

    def end(self) -> int | None:
        return self.part.end()

    def close(self) -> None:
        self.part.close()


class FollowReader(LiveReader):
    """The followed files a worker owns (see the module docstring)."""

    def __init__(self, pipeline: Pipeline) -> None:
        super().__init__(pipeline)
        self.read_ahead = False  # a file's lines are at hand: nothing to fetch ahead

    def _files(self) -> FollowedFiles:
        if self.source is None:
            src = self.p.source
            self.source = FollowedFiles(src.kind, src, self.plan)
        assert isinstance(self.source, FollowedFiles)
        return self.source

    def _listed(self, name: str) -> None:
        """``name``'s path known to the worker's listing (a glob's match)."""
        files = self._files()
        if name not in files._paths:
            files.discover()
        if name not in files._paths:
            raise SourceError(_not_here(self.p, name))

    def open_follow(self, q: int, name: str, resume: dict[str, Any] | None,
                    nxt: int | None, file: tuple[int, int] | None, from_start: bool
                    ) -> Opened:
        """Partition ``q`` (``name``), opened as one process opens it
        (:meth:`sealstream._runtime.live.LiveMerger._open`): at a checkpoint's full
        position (``resume``, reading on at line ``nxt``), at a recorded plan's first
        file (``file``), or at its beginning."""
        self.drop(q)
        if not Path(self.p.source.base_dir).is_dir():  # a node that does not see the files
            raise SourceError(_not_here(self.p, name))
        files = self._files()
        if resume is None:
            if file is not None:
                part = files.open_at(name, PartitionPosition(identity={
                    "dev": file[0], "ino": file[1], "plan": True}))
            else:
                self._listed(name)
                part = files.open(name, None, from_start)
            at = part.tell()
            full = part.position
            start = full if full.offset == at else PartitionPosition(offset=at)
        else:
            assert nxt is not None
            pos = PartitionPosition.from_json(resume)
            if pos.byte_offset or pos.identity:
                part = files.open_at(name, pos)
                start = pos
            else:  # an integer position (replay --from p=OFFSET)
                self._listed(name)
                part = files.open(name, nxt)
                start = PartitionPosition(offset=nxt)
            at = nxt
        tracked = _Tracked(part)
        from sealstream.distributed._live_read import _Held

        self.held[q] = _Held(tracked, at, at)  # type: ignore[arg-type]
        return at, start.to_json(), (int(part.first_file[0]), int(part.first_file[1]))

    def position(self, q: int) -> dict[str, Any] | None:
        """Partition ``q``'s full position to resume from after its last range."""
        h = self.held[q]
        assert isinstance(h.part, _Tracked)
        return h.part.resume(h.next).to_json()

    def reading(self, q: int) -> dict[str, Any] | None:
        """Partition ``q``'s position after all it polled, when it is in another file
        than the one to resume from (a rotation read past: the coordinator's discovery
        must know the new file and the retired one now); else None."""
        h = self.held[q]
        assert isinstance(h.part, _Tracked)
        first, last = h.part.marks[0], h.part.marks[-1]
        same = all(first.identity.get(k) == last.identity.get(k) for k in ("dev", "ino"))
        return None if same else last.to_json()


def _not_here(pipeline: Pipeline, name: str) -> str:
    return (f"followed file {name!r} is not readable on node {socket.gethostname()} "
            f"(pid {os.getpid()}), whose worker owns its partition: "
            f"{str(Path(pipeline.source.base_dir) / name)!r} is missing there; with workers "
            "on several machines, every followed file must be readable at the same path "
            "on the node of the worker that owns its partition (docs/scale-out.md, "
            "\"Followed files on workers\")")


class FollowPlanner(LivePlanner):
    """The live planner of a followed-file job with workers: the owners open their
    files by identity and report full positions (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: partition index -> the file it started in (device, inode)
        self._first: dict[int, tuple[int, int]] = {}
        super().__init__(*args, **kwargs)

    def _open(self, name: str, pos: SourcePosition | None, now: float,
              from_start: bool = False, file: tuple[int, int] | None = None) -> None:
        q = len(self.names)
        owner = self._owner(q)
        at, start, first = gather([owner.follow_open.remote(
            self.p, q, name, None if pos is None else pos.resume.to_json(),
            None if pos is None else pos.next_offset, file, from_start)],
            "open partitions")[0]
        begin = PartitionPosition.from_json(start)
        self.names.append(name)
        self.outputs.owner.append(owner)
        self.cursors.append(_Cursor(_Remote(owner, q, name), int(at), begin, after=begin,
                                    last_delivery=now, listed=pos is not None))
        self.wm.grow(len(self.names))
        self._first[q] = (int(first[0]), int(first[1]))
        self._note(q, begin, opened=pos is not None or file is not None)

    def _record(self, plan: StepPlan) -> None:
        """The plan with the file each partition listed for the first time starts in
        (as one process records it: a replay opens that file by its identity)."""
        from dataclasses import replace

        files = {self.names[q]: first for q, first in self._first.items()
                 if q < len(self.cursors) and (not self.cursors[q].listed or self.step == 0)}
        super()._record(replace(plan, files=files))

    def _step_batch(self, plan: StepPlan | None, got: list[Any], refs: list[Any]) -> Any:
        for q, (summary, _, _) in enumerate(got):
            pos = summary.get("position")
            if pos is not None:
                full = PartitionPosition.from_json(pos)
                c = self.cursors[q]
                c.resume = c.after = full
                self._note(q, full)
            ahead = summary.get("reading")
            if ahead is not None:  # its owner reads a newer file (after a rotation)
                self._note(q, PartitionPosition.from_json(ahead))
        return super()._step_batch(plan, got, refs)

    def _note(self, q: int, pos: PartitionPosition, opened: bool = False) -> None:
        """What the coordinator's discovery must know of partition ``q``'s files (the
        single-process source learns it by reading them): the file it reads, the files
        it read to their end, its first bytes (a copy of them is refused)."""
        files = self.source
        if not isinstance(files, FollowedFiles):
            return
        name = self.names[q]
        _, fid, base, retired = own_identity(name, pos.identity)
        registry = files._files
        if fid is not None:
            registry.read_by(fid, name)
        for r in retired:
            registry.retire(r)
        sha = pos.identity.get("head_sha256")
        n = min(HEAD_BYTES, pos.byte_offset)
        if isinstance(sha, str) and n > 0 and pos.offset > base:
            path = files._paths.get(name, Path(files._listing.base_dir) / name)  # type: ignore[attr-defined]
            registry.heads[name] = (path, n, sha)
        if opened:
            files._opened.add(name)


__all__ = ["FollowPlanner", "FollowReader", "following"]
