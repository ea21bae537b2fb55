"""A job run by N Ray workers: the single-process job with its keyed state sharded.

The coordinator (this process) is the single-process :class:`~sealstream.Job`:
it reads the source partitions in the documented order, gives every event its
watermark, stages output in the sinks and writes the checkpoints, exactly as on
one process. Only the window operator is replaced: each key's windows live on
one worker actor (see :mod:`._shard`), and each step's events travel to their
workers as Arrow data through Ray's object store. Hence, for a bounded input,
the output with N workers is the single-process output, and every guarantee of
the checkpoint protocol (the guard, fallback, refusal, exactly-once sinks) is
the single-process one.

Checkpoint at a step boundary: the coordinator asks every worker for its shard,
writes the state with the positions and receipts, and publishes one signed
manifest last; the manifest's ``distributed`` entry records the worker count, the
rows each worker held and the key routing.

Failure: a lost worker process or node makes the step fail with
:class:`WorkerLostError`; the job then stops every worker, and restarts all of
them from the newest atomic checkpoint (re-splitting its state), replaying the
input after it with the single-process recovery (output committed after that
checkpoint is suppressed, never written twice).
"""

from __future__ import annotations

import sys
from typing import Any

from sealstream._runtime.engine import Job
from sealstream._runtime.merge import SourcePosition
from sealstream.checkpoint.store import CheckpointStore
from sealstream.distributed._cluster import connect
from sealstream.distributed._shard import ROUTING, ShardedOperator, WorkerLostError
from sealstream.pipeline import Pipeline

#: restarts after a lost worker before the run fails (Flink's fixed-delay default is
#: unbounded; a bounded default keeps a broken cluster from looping for ever)
DEFAULT_MAX_RESTARTS = 3


class DistributedJob(Job):
    """Runs ``pipeline`` as ``workers`` Ray workers, exactly once across restarts.

    >>> # DistributedJob(load_spec("spec.toml"), workers=3).run()
    """

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        workers: int | None = None,
        address: str | None = None,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        **kwargs: Any,
    ) -> None:
        n = workers if workers is not None else pipeline.workers
        if n is None or n < 1:
            raise ValueError(f"workers must be a positive integer, got {n!r}")
        self.workers = n
        self.address = address
        self.max_restarts = max_restarts
        self.restarts = 0
        self._job_args = (pipeline, kwargs)
        super().__init__(pipeline, **kwargs)

    # the operator becomes sharded once recovery has built it (fresh or restored)
    def _fresh_start(self) -> list[SourcePosition]:
        positions = super()._fresh_start()
        self._shard()
        return positions

    def _restore(
        self, store: CheckpointStore, cid: int, doc: dict[str, Any]
    ) -> list[SourcePosition]:
        positions = super()._restore(store, cid, doc)
        self._shard()
        return positions

    def _shard(self) -> None:
        assert self.operator is not None
        if isinstance(self.operator, ShardedOperator):
            return
        self.operator = ShardedOperator(self.p, self.operator.snapshot(), self.workers)

    def _close_shards(self) -> None:
        if isinstance(self.operator, ShardedOperator):
            self.operator.close()

    def manifest_extra(self) -> dict[str, Any]:
        op = self.operator
        rows = op.part_rows if isinstance(op, ShardedOperator) else []
        return {"distributed": {
            "workers": self.workers,
            "routing": dict(ROUTING),
            "parts": [{"worker": i, "state_rows": n} for i, n in enumerate(rows)],
        }}

    @property
    def worker_pids(self) -> list[int]:
        """The process ids of the current workers (empty before they start)."""
        op = self.operator
        return list(op.pids) if isinstance(op, ShardedOperator) else []

    def run(self) -> Any:
        leave = connect(self.address, self.workers)
        try:
            while True:
                try:
                    return super().run()
                except WorkerLostError as exc:
                    if self.restarts >= self.max_restarts:
                        raise WorkerLostError(
                            f"{exc} (after {self.restarts} restart(s); the next run "
                            "resumes from the newest atomic checkpoint)"
                        ) from None
                    restarts = self.restarts + 1
                    print(f"sealstream: {exc}; restarting every worker from the newest "
                          f"atomic checkpoint (restart {restarts})", file=sys.stderr)
                    pipeline, kwargs = self._job_args
                    self._close_shards()
                    Job.__init__(self, pipeline, **kwargs)
                    self.restarts = restarts
                finally:
                    self._close_shards()
        finally:
            leave()
