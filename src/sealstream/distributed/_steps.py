"""The coordinator's side of the data plane (bounded sources): plan steps, pass
object references, gather a few numbers per partition and per worker.

A step is a read-order bound: every partition's records with offset below it. The
coordinator asks each partition's worker to read its slab (:meth:`ShardWorker.read_step`),
which puts the breakpoints of its partition watermark and each worker's rows in
Ray's object store and returns a summary (counts, max time, end of input, the
position to resume from) with the references; then it asks each key's worker to
apply its rows (:meth:`ShardWorker.process_step`), passing the references on
without resolving them. Every worker runs the same watermark arithmetic
(:func:`._plane.prepare`, :func:`._plane.advance`) on the same numbers, so the
coordinator's watermark state, recorded in checkpoints, is the workers'.

What the coordinator receives per step: one summary per partition, one triple per
worker (fired windows, or the number of results the worker staged itself and their
largest window end (:mod:`._sinks`, :mod:`._receipts`); late events; a count) and,
when there are late events, their raw text. No event row:
:attr:`StepPlanner.step_bytes` measures it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from sealstream._runtime.merge import Batch, SourcePosition
from sealstream.distributed._phases import Phases
from sealstream.distributed._plane import Breaks
from sealstream.distributed._shard import gather
from sealstream.distributed._worker import from_ipc
from sealstream.pipeline import Pipeline
from sealstream.sources._base import BAD_SCHEMA, RAW

#: what one object reference is counted as in :attr:`StepPlanner.step_bytes`: its id
REF_BYTES = 28


@dataclass
class StepBatch(Batch):
    """A step of the data plane: the coordinator holds no event (``events`` is
    empty); ``pending`` are the key workers' results to gather."""

    pending: list[Any] = field(default_factory=list)
    bound: int = 0
    read: int = 0
    seen: set[str] = field(default_factory=set)
    failed: pl.DataFrame | None = None
    infos: list[Breaks] = field(default_factory=list)
    planner: StepPlanner | None = None
    #: the workers staged the step's results themselves (:mod:`._sinks`): what they
    #: return in place of fired windows is the results' identities
    staged: bool = False
    #: the data plane's step number; the bad records its readers kept
    #: (:mod:`._records`); the key workers return their late events as a count and a
    #: reference
    plane_step: int = 0
    kept_bad: int = 0
    late_refs: bool = False

    def raw_texts(
        self, partitions: npt.NDArray[np.int32], offsets: npt.NDArray[np.int64]
    ) -> pl.Series:
        """The raw text of some records of the step (late events), from the workers
        that read them."""
        assert self.planner is not None
        return self.planner.raw_texts(partitions, offsets)


def _bytes(value: Any) -> int:
    """The size of a value the coordinator received (Arrow buffers as they are,
    numbers and lists as JSON, a reference as its id)."""
    if value is None:
        return 0
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, dict):
        return sum(len(k) + _bytes(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(_bytes(v) for v in value)
    if isinstance(value, int | float | str | bool):
        return len(json.dumps(value))
    return REF_BYTES


class StepPlanner:
    """Plans the steps of a bounded run over the workers; the engine's loop sees it
    as its merger (``next_batch``, ``batch_size``, ``size_hint``, ``close``)."""

    def __init__(self, job: Any, pipeline: Pipeline, partitions: list[tuple[str, Path]],
                 positions: list[SourcePosition], actors: list[Any], batch_size: int) -> None:
        self.job = job
        self.p = pipeline
        self.actors = actors
        self.n = len(partitions)
        self.owner = [actors[q % len(actors)] for q in range(self.n)]
        self.batch_size = batch_size
        firsts = gather([self.owner[q].open_slab.remote(pipeline, q, name, str(path),
                                                         pos.to_json())
                         for q, ((name, path), pos) in enumerate(zip(partitions, positions,
                                                                     strict=True))],
                        "open partitions")
        self.bound = min(firsts) if firsts else 0
        self.low: int | None = self.bound
        #: the step being planned (numbers the workers' raw text of each step)
        self.step = 0
        #: the next step's reads, already asked for: (bound, references)
        self._ahead: tuple[int, list[Any]] | None = None
        self.done = False
        self._hints: list[tuple[int, int] | None] = [None] * self.n
        #: bytes the coordinator received, per step (summaries, outputs, references)
        self.step_bytes: list[int] = []
        #: of which output rows (fired windows, late events and their text, bad
        #: records), which cross the coordinator while the sinks run there
        self.output_bytes: list[int] = []
        #: where the coordinator's time goes (for the benchmark)
        self.phases = Phases()

    def next_batch(self) -> Batch | None:
        if self.done:
            return None
        if self._ahead is None:
            self._ahead = self._read(self._next_bound())
        bound, refs = self._ahead
        self._ahead = None
        with self.phases("coordinator: wait for the reads"):
            got = gather(refs, "read")
        received = _bytes(got)
        rows = sum(_bytes(s["bad"]) + _bytes(s["failed"]) for s, _, _ in got)
        breaks = [ref for _, ref, _ in got]
        wm = self.job.wm.to_json()
        last = list(self.job.wm.last_offset)
        stage = self.job.results_stage_epoch()
        late_refs = self.job.records_on_workers("late")
        pending = [a.process_step.remote(wm, last, bound, breaks,
                                         [shards[i] for _, _, shards in got], stage,
                                         late_refs)
                   for i, a in enumerate(self.actors)]
        sums = [s for s, _, _ in got]
        self.step += 1
        self._hints = [s["hint"] for s in sums]
        bad = [from_ipc(s["bad"]).with_columns(pl.lit(q, dtype=pl.Int32).alias("_p"))
               for q, s in enumerate(sums) if s["bad"] is not None]
        failed = [from_ipc(s["failed"]).with_columns(pl.lit(q, dtype=pl.Int32).alias("_p"))
                  for q, s in enumerate(sums) if s["failed"] is not None]
        bad_schema = dict(BAD_SCHEMA)
        bad_schema["_p"] = pl.Int32()
        infos = [Breaks(q, np.zeros(0, np.int64), np.zeros(0, np.int64), s["max_time"],
                        s["last_offset"], s["empty_done"], s["drained"])
                 for q, s in enumerate(sums)]
        finished = all(s["drained"] for s in sums)
        lows = [s["next_first"] for s in sums if s["next_first"] is not None]
        self.low = min(lows) if lows else None
        self.bound = bound
        self.done = finished
        if not finished:
            # the next step's reads queue behind this step's on every worker: a
            # worker done with its share reads on while the others and the
            # coordinator finish this step (its bound is known from the summaries)
            self._ahead = self._read(self._next_bound())
        batch = StepBatch(
            events=pl.DataFrame(),
            bad=(pl.concat(bad, how="vertical").sort(["_offset", "_p"]) if bad
                 else pl.DataFrame(schema=bad_schema)),
            end=(bound - 1, self.n - 1),
            positions=[SourcePosition.from_json(s["emitted"]) for s in sums],
            last_offsets=[s["last_offset"] for s in sums],
            finished=finished,
            empty_and_done=[bool(s["empty_done"]) for s in sums],
            pending=pending,
            bound=bound,
            read=sum(int(s["read"]) for s in sums),
            seen={f for s in sums for f in s["seen"]},
            failed=pl.concat(failed, how="vertical") if failed else None,
            infos=infos,
            planner=self,
            staged=stage is not None,
            plane_step=self.step - 1,
            kept_bad=sum(int(s["n_bad"]) for s in sums if s["bad"] is None
                         and s["failed"] is None),
            late_refs=late_refs,
        )
        self.step_bytes.append(received)
        self.output_bytes.append(rows)
        return batch

    def _next_bound(self) -> int:
        start = self.bound if self.low is None else max(self.bound, self.low)
        return start + max(1, self.batch_size)

    def _read(self, bound: int) -> tuple[int, list[Any]]:
        """Ask every partition's worker for its slab below ``bound`` (not waited for)."""
        unseen = list(self.job.unseen_fields)  # a superset of what is still unseen
        keep_bad = self.job.records_on_workers("errors")
        return bound, [self.owner[q].read_step.remote(self.p, q, self.n, bound,
                                                       max(1, self.batch_size),
                                                       len(self.actors), unseen, self.step,
                                                       keep_bad)
                       for q in range(self.n)]

    def gather_outputs(self, batch: StepBatch
                       ) -> list[tuple[bytes | dict[str, int] | None,
                                       bytes | dict[str, Any] | None, int]]:
        """Each key worker's output of the step: fired windows (or, when it staged
        them itself, their number and largest window end), late events, a count."""
        with self.phases("coordinator: wait for the processing"):
            got = gather(batch.pending, "process")
        if self.step_bytes:
            self.step_bytes[-1] += _bytes(got)
            self.output_bytes[-1] += sum((_bytes(f) if isinstance(f, bytes) else 0)
                                         + (_bytes(lt) if isinstance(lt, bytes) else 0)
                                         for f, lt, _ in got)
        return [tuple(g) for g in got]

    def raw_texts(self, partitions: npt.NDArray[np.int32],
                  offsets: npt.NDArray[np.int64]) -> pl.Series:
        n = len(offsets)
        if n == 0:
            return pl.Series(RAW, [], dtype=pl.String)
        qs = sorted({int(q) for q in np.unique(partitions)})
        sel = {q: np.flatnonzero(partitions == q) for q in qs}
        step = self.step - 1  # the step being applied (the next one may be read)
        got = gather([self.owner[q].raw_texts.remote(q, step, offsets[sel[q]].tolist())
                      for q in qs], "raw text")
        if self.step_bytes:
            self.step_bytes[-1] += _bytes(got)
            self.output_bytes[-1] += _bytes(got)
        idx = np.concatenate([sel[q] for q in qs])
        texts = pl.concat([from_ipc(g).to_series() for g in got], how="vertical").rename(RAW)
        return texts.gather(pl.Series(np.argsort(idx, kind="stable"), dtype=pl.Int64))

    def size_hint(self) -> tuple[int, int] | None:
        if any(h is None for h in self._hints):
            return None
        return (sum(h[0] for h in self._hints if h is not None),
                sum(h[1] for h in self._hints if h is not None))

    def close(self) -> None:
        """Nothing to close here: the workers' readers go with the workers (and are
        replaced when a worker opens a partition again)."""
