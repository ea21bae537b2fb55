"""The coordinator's view of the sharded window state: a WindowOperator whose
keys live on N worker actors.

Routing: a key belongs to worker ``hash(key) mod N`` where ``hash`` is Polars'
column hash with a fixed seed (or, when the workers read unequal shares of a
bounded input, to the worker of its bucket ``hash(key) mod B``: :mod:`._routing`;
:data:`ROUTING`, recorded in each checkpoint's manifest). The hash need not be
stable across Polars versions: a checkpoint stores the whole state, and every
restore re-splits it with the running version's hash and worker count (that is
also how N workers restore with M).

Every step sends each worker its share of the batch (possibly empty) with the
step's global watermark, so that every worker fires the windows it closes;
the coordinator merges what they fired (ordered by key and window) and their
late events (in read order), so that the output does not depend on N.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import polars as pl

from sealstream.distributed._plane import I64
from sealstream.distributed._routing import Table
from sealstream.distributed._worker import ShardWorker, from_ipc, to_ipc
from sealstream.errors import SealstreamError
from sealstream.pipeline import Pipeline
from sealstream.sources._base import KEY, KEY_IS_INT, OFFSET, PARTITION
from sealstream.windows.aggregates import WEND, WSTART
from sealstream.windows.operator import Output, WindowOperator

SEED = 0x5EA157
SHARD = "__shard"
#: the workers' checkpoint calls run on a thread of their own (a Ray concurrency group),
#: beside the data plane's: a checkpoint does not wait behind the next step's read,
#: already queued on the worker (see :meth:`ShardedOperator.snapshot`)
CKPT = "ckpt"
#: how keys are routed, as recorded in the manifest (``distributed.routing``)
ROUTING = {"hash": "polars.Expr.hash", "seed": SEED, "column": KEY, "rule": "hash mod workers"}


class WorkerLostError(SealstreamError):
    """A worker process or its node was lost. The job restarts every worker from
    the newest atomic checkpoint (``max_restarts`` times); then the run fails
    with exit 1 and the next run resumes exactly once."""


#: up to this many workers a split filters the frame once per worker (one pass over a
#: boolean mask each, about 8x less CPU than ``partition_by`` at 2-8 workers)
FILTER_MAX = 16


def shard_ids(frame: pl.DataFrame, workers: int, table: Table | None = None) -> I64:
    """The worker each row's key belongs to: ``hash mod workers``, or with a weighted
    routing (:mod:`._routing`) the worker of the key's bucket ``hash mod len(table)``."""
    mod = workers if table is None else len(table)
    ids = frame.select((pl.col(KEY).hash(seed=SEED) % mod).cast(pl.Int64).alias(SHARD))[
        SHARD].to_numpy()
    return ids if table is None else np.asarray(table, dtype=np.int64)[ids]


def split(frame: pl.DataFrame, workers: int, table: Table | None = None
          ) -> list[pl.DataFrame]:
    """``frame``'s rows by worker, order kept within each part (``table``: a
    weighted routing, :mod:`._routing`)."""
    if workers == 1:
        return [frame]
    empty = frame.clear()
    if table is not None and min(table) == max(table):  # every key on one worker
        return [frame if i == table[0] else empty for i in range(workers)]
    ids = shard_ids(frame, workers, table)
    if workers <= FILTER_MAX:
        return [frame.filter(pl.Series(ids == i)) for i in range(workers)]
    tagged = frame.with_columns(pl.Series(SHARD, ids))
    parts = tagged.partition_by(SHARD, as_dict=True, maintain_order=True)
    return [parts[(i,)].drop(SHARD) if (i,) in parts else empty for i in range(workers)]


def on_ckpt(method: Any) -> Any:
    """``actor.method`` run on the worker's checkpoint thread (:data:`CKPT`)."""
    return method.options(concurrency_group=CKPT)


def _ray_failure(exc: BaseException, what: str) -> SealstreamError:
    import ray.exceptions as rx

    if isinstance(exc, rx.RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, SealstreamError):
            return cause  # raised by the worker's engine pieces: its own message
        return SealstreamError(f"{what}: {type(cause).__name__}: {cause}")
    return WorkerLostError(f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0]}")


def gather(refs: list[Any], what: str) -> list[Any]:
    """``ray.get(refs)``: a lost worker is :class:`WorkerLostError`, an error raised
    in a worker is raised here as itself."""
    import ray
    import ray.exceptions as rx

    try:
        return list(ray.get(refs))
    except rx.RayError as exc:
        raise _ray_failure(exc, f"scale-out worker ({what})") from None


class ShardedOperator(WindowOperator):
    """:class:`WindowOperator` over ``workers`` Ray actors (one key shard each).

    Built from the whole state (a checkpoint's, or empty), which it splits by
    key hash; :meth:`snapshot` gathers the shards back into one table.
    """

    def __init__(self, pipeline: Pipeline, state: pl.DataFrame | None,
                 actors: list[Any], table: Table | None = None) -> None:
        import ray

        super().__init__(pipeline)  # local and empty: thresholds, finalize, schema
        self.workers = workers = len(actors)
        whole = self._state if state is None else WindowOperator(pipeline, state).snapshot()
        self.actors: list[Any] = list(actors)
        #: the key routing (None: hash mod workers; else weighted, :mod:`._routing`)
        self.table = table
        self._open_count = 0
        #: the open windows the workers counted at the checkpoint being taken
        self._staged_open: int | None = None
        self.part_rows = [0] * workers
        #: set by the job before a checkpoint's snapshot (the state files' metadata)
        self.part_metadata: dict[str, Any] | None = None
        self.pids: list[int] = self._get(
            [a.load.remote(pipeline, i, ray.put(to_ipc(part)), table)
             for i, (a, part) in enumerate(zip(self.actors, split(whole, workers, table),
                                               strict=True))],
            "start")

    def _get(self, refs: list[Any], what: str) -> list[Any]:
        return gather(refs, what)

    def route(self, table: Table | None) -> None:
        """Route keys by ``table`` from now on; only before the first step of a fresh
        run (every worker's state still empty: no key has a worker yet)."""
        self._get([a.route.remote(table) for a in self.actors], "routing")
        self.table = table

    def process(self, events: pl.DataFrame, w_end: int) -> Output:
        import ray

        refs = [
            actor.process.remote(ray.put(to_ipc(part)), w_end)
            for actor, part in zip(self.actors, split(events, self.workers, self.table),
                                   strict=True)
        ]
        got = self._get(refs, "process")
        fired = pl.concat([from_ipc(f) for f, _, _ in got], how="vertical")
        late = pl.concat([from_ipc(lt) for _, lt, _ in got], how="vertical")
        if self.workers > 1:
            fired = fired.sort([KEY, KEY_IS_INT, WSTART, WEND])
            if late.height:
                late = late.sort([OFFSET, PARTITION])
        return Output(fired=fired, late=late)

    def snapshot(self) -> pl.DataFrame:
        """The whole state; but with :attr:`part_metadata` set (a checkpoint is being
        taken), each worker keeps its part of the state as it is now (an immutable
        frame) for :meth:`write_parts` or :meth:`take_parts`, which encode it later,
        on the worker's checkpoint thread while it goes on with the next steps; what
        is returned is the state's schema only (no rows): the state does not cross
        the coordinator.

        The step's processing is done on every worker (its outputs were gathered), and
        the next step's reads, already queued on the workers, do not touch the window
        state: so the call runs on the workers' checkpoint thread (:data:`CKPT`), and
        the coordinator waits only for the workers to take their frames, not for
        those reads (which is what a checkpoint blocked on before)."""
        meta = self.part_metadata
        if meta is None:
            parts = self._get([a.snapshot.remote() for a in self.actors], "snapshot")
            frames = [from_ipc(p) for p in parts]
            self.part_rows = [f.height for f in frames]
            return pl.concat(frames, how="vertical").cast(self.schema)  # type: ignore[arg-type]
        self.part_metadata = None
        got = self._get([on_ckpt(a.stage_part).remote(meta) for a in self.actors],
                        "checkpoint")
        self.part_rows = [int(rows) for rows, _ in got]
        self._staged_open = sum(int(n) for _, n in got)
        return pl.DataFrame(schema=self.schema)

    def write_parts(self, cid: int, fence: Any, encryption_key: bytes | None
                    ) -> list[tuple[str, str, int]]:
        """Each worker encodes its staged part and writes it into checkpoint ``cid`` of
        the job's store itself (on its checkpoint thread, beside its next steps);
        (name, SHA-256, size) per worker, in worker order, once every part is durable."""
        return [tuple(r) for r in self._get(
            [on_ckpt(a.write_part).remote(cid, fence, encryption_key) for a in self.actors],
            "checkpoint part")]

    def take_parts(self) -> list[bytes]:
        """The staged parts' bytes, in worker order (stores without direct parts)."""
        return self._get([on_ckpt(a.take_part).remote() for a in self.actors],
                         "checkpoint part")

    @property
    def state(self) -> pl.DataFrame:
        return self.snapshot()

    @state.setter
    def state(self, value: pl.DataFrame) -> None:
        self._state = value
        self._pending = []

    @property
    def open_windows(self) -> int:
        """The open windows of every worker; right after a checkpoint's
        :meth:`snapshot`, those the workers counted at its point (no call: a call now
        would wait behind the next step's reads)."""
        staged, self._staged_open = self._staged_open, None
        if staged is not None:
            self._open_count = staged
            return staged
        if self.actors:
            counts = self._get([a.open_windows.remote() for a in self.actors], "open_windows")
            self._open_count = sum(counts)
        return self._open_count

    def close(self) -> None:
        """Forget the workers (the job releases them)."""
        self.actors = []


#: idle workers of this driver process: the next job reuses them (starting a worker
#: process costs about a second); emptied when the driver leaves Ray
_POOL: list[Any] = []


#: the size of Polars' thread pool in a worker process (read once, when Polars is
#: imported there: so Ray starts the process with it, see :func:`thread_share`)
THREADS_ENV = "POLARS_MAX_THREADS"


def thread_share(workers: int) -> int:
    """Polars threads for each of a job's ``workers`` new worker processes: its
    node's cores divided among the job's workers on that node (``workers`` spread
    over the alive nodes), at least 1; as Ray sets ``OMP_NUM_THREADS`` from an
    actor's CPUs. Each process would otherwise size its pool to every core of the
    node, and the workers' pools would fight for the same cores (docs/scale-out.md,
    "Sharing the cores")."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
    cpus = [int(n.get("Resources", {}).get("CPU", 0)) for n in nodes]
    cores = min((c for c in cpus if c > 0), default=os.cpu_count() or 1)
    per_node = -(-workers // max(1, len(nodes)))
    return max(1, cores // per_node)


def acquire(workers: int) -> list[Any]:
    """``workers`` worker actors: idle ones first, new ones spread over the nodes,
    each with its share of its node's cores for Polars (:func:`thread_share`; an
    idle worker keeps the pool it was started with; ``POLARS_MAX_THREADS`` set by
    the user wins)."""
    import ray

    taken = [_POOL.pop() for _ in range(min(workers, len(_POOL)))]
    if len(taken) == workers:
        return taken
    # (Ray's stubs do not list concurrency_groups, which only the decorator takes)
    actor = ray.remote(num_cpus=0, max_restarts=0,  # type: ignore[call-overload]
                       concurrency_groups={CKPT: 1})(ShardWorker)
    options: dict[str, Any] = {"scheduling_strategy": "SPREAD"}
    if THREADS_ENV not in os.environ:
        options["runtime_env"] = {"env_vars": {THREADS_ENV: str(thread_share(workers))}}
    fresh = [actor.options(**options).remote() for _ in range(workers - len(taken))]
    return taken + fresh


def release(actors: list[Any], healthy: bool) -> None:
    import ray

    if healthy:
        _POOL.extend(actors)
        return
    for a in actors:
        try:
            ray.kill(a)
        except Exception:  # noqa: BLE001,S110 - already gone
            pass


def drain_pool() -> None:
    """Stop every idle worker (before leaving Ray, or to place workers anew)."""
    actors = list(_POOL)
    _POOL.clear()
    release(actors, healthy=False)
