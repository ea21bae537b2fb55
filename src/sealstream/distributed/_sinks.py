"""Results staged by the workers themselves: a part file per worker and epoch.

With a JSON Lines or Parquet results directory, each key worker turns its fired
windows into result rows and stages them in a file of its own, under the run token
``<run>w<i>`` (worker ``i``): ``part-<epoch>-<run>w<i>.jsonl``, staged as
``.part-<epoch>-<run>w<i>.jsonl.inprogress``. That is the directory sinks' own naming
scheme (an epoch has one file per run token), so every reader of the directory
(``committed``, ``read_ids``, replay, the de-duplication read-back after a fallback)
sees the workers' files with no change: an epoch's rows are the union of its files.

The two-phase commit is the single-process one, spread over the workers:

1. each worker stages its rows of the epoch (:class:`WorkerResults`);
2. at a checkpoint the coordinator asks every worker to prepare (flush, fsync) and
   gets back only the file names: the manifest records them, with the coordinator's
   own file (rows it staged itself, see below), as the epoch's commit tokens;
3. once the manifest is published, the coordinator tells each worker to commit
   (publish) its own file (:meth:`WorkerPartsSink.commit`);
4. recovery runs on the coordinator, as on one process: it commits every token the
   restored checkpoint names (whichever worker staged it, with whatever worker count)
   and deletes every other staging file of the directory.

The coordinator receives no result row and no result identity: each worker keeps the
identities of its results for the epoch's receipt, built on a worker
(:mod:`._receipts`); per step only their number and largest window end come back.
Under an ``s3://`` prefix (:class:`~sealstream.sinks.objects.StagedObjectSink`) the same
names are objects: staged with ``If-None-Match: *`` at prepare, published at commit;
each worker uses its own node's AWS credentials (none are sent through Ray).
A step whose results meet a suppression list (output already committed
by a run that fell back to an older checkpoint) is staged on the coordinator as before.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import polars as pl

from sealstream.distributed._db_sinks import setup_worker_db, stages_db_on_workers, token_worker
from sealstream.distributed._receipts import EpochIds
from sealstream.pipeline import Pipeline
from sealstream.sinks import open_sink
from sealstream.sinks._base import CommittedFile, Sink
from sealstream.sinks.jsonl import JsonlDirSink
from sealstream.sinks.kafka import KafkaSink
from sealstream.sinks.objects import StagedObjectSink
from sealstream.sinks.parquet import ParquetDirSink
from sealstream.sources._base import KEY, KEY_IS_INT
from sealstream.windows.aggregates import WEND, WSTART
from sealstream.windows.operator import WindowOperator

#: the sinks the workers stage themselves (a part file or part object per epoch)
STAGED_KINDS = (JsonlDirSink, ParquetDirSink, StagedObjectSink)

#: the run token of worker ``i``'s part files
_WORKER_RUN = re.compile(r"part-[0-9]{12,}-[A-Za-z0-9]*w([0-9]+)\.[a-z]+")


def worker_run_token(run_token: str, index: int) -> str:
    return f"{run_token}w{index}"


def stages_on_workers(sink: Sink) -> bool:
    """The outputs whose epochs the workers stage themselves: JSON Lines and Parquet,
    in a directory or as objects under an ``s3://`` prefix; PostgreSQL results
    (:mod:`._db_sinks`)."""
    return isinstance(sink, STAGED_KINDS) or stages_db_on_workers(sink)


class WorkerResults:
    """A worker's own results sink (on the worker). Finalising and writing run on a
    thread of their own, in order, so that the worker goes on with the next step
    meanwhile (as the coordinator's output stage did); :meth:`prepare` waits for them
    and raises what they raised."""

    def __init__(self, pipeline: Pipeline, run_token: str, sort: bool,
                 keep_ids: bool = True, sink: KafkaSink | None = None) -> None:
        """``keep_ids``: keep the results' identities for the receipts (a run with
        checkpoints); ``sink``: the worker's own Kafka producer (:mod:`._kafka_sinks`)
        instead of a part file."""
        funcs = pipeline.result_kinds()  # a decimal field's: "decimal" (database columns)
        self.sink = sink if sink is not None else open_sink(pipeline.sink, "results",
                                                            run_token, funcs)
        if not (stages_on_workers(self.sink) or isinstance(self.sink, KafkaSink)):
            raise RuntimeError(f"{pipeline.sink.kind} results are not staged per worker")
        if isinstance(self.sink, (*STAGED_KINDS, KafkaSink)):
            self.sink.key_fields = pipeline.source.key_fields
        else:  # PostgreSQL
            setup_worker_db(self.sink, pipeline)
        self.sort = sort
        self.op = WindowOperator(pipeline)  # its own: finalising reads no shared state
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="results")
        self.pending: list[Future[None]] = []
        self.ids = EpochIds()
        self.keep_ids = keep_ids

    def stage(self, epoch: int, fired: pl.DataFrame) -> dict[str, int]:
        """Stage ``fired``'s result rows in ``epoch`` (on the writer thread) and keep
        their identities for the epoch's receipt (:mod:`._receipts`); return only
        their number and largest window end."""
        if self.sort:
            fired = fired.sort([KEY, KEY_IS_INT, WSTART, WEND])
        self.pending.append(self.writer.submit(self._write, epoch, fired))
        if self.keep_ids:
            self.ids.add(epoch, fired.select(pl.col(KEY).alias("key"), KEY_IS_INT, WSTART,
                                             WEND))
        return {"results": fired.height, "max_window_end": int(fired[WEND].max())}  # type: ignore[arg-type]

    def _write(self, epoch: int, fired: pl.DataFrame) -> None:
        results = self.op.finalize(fired)
        if results.height:
            self.sink.write(epoch, results)

    def _drain(self) -> None:
        pending, self.pending = self.pending, []
        for f in pending:
            f.result()

    def prepare(self, epoch: int) -> list[str]:
        self._drain()
        return self.sink.prepare(epoch)

    def commit(self, epoch: int, tokens: list[str]) -> None:
        self._drain()
        self.sink.commit(epoch, tokens)

    def close(self) -> None:
        self.writer.shutdown(wait=True)
        self.pending = []
        self.sink.close()


class WorkerPartsSink(Sink):
    """The coordinator's view of a results directory staged by the workers: its own
    sink ``local`` (steps staged here, recovery, read-back) plus the workers' files.
    ``actors`` returns the job's current workers; ``crash`` is the job's crash points
    (``after_commit_worker_part``: after each worker's commit)."""

    def __init__(self, local: Sink, actors: Callable[[], list[Any]],
                 crash: Callable[[str], None], output: str = "results",
                 before: Callable[[], None] | None = None) -> None:
        """``output``: the job's output this sink is (``results``, ``late`` or
        ``errors``, :mod:`._records`; the latter's commits are crash point
        ``after_commit_worker_records``); ``before``: called before a prepare (waits
        for the workers' staging calls)."""
        self.local = local
        self.role = local.role
        self.output = output
        self._actors = actors
        self._crash = crash
        self._before = before

    def write(self, epoch: int, frame: pl.DataFrame) -> None:
        self.local.write(epoch, frame)

    def prepare(self, epoch: int) -> list[str]:
        tokens, done = self.prepare_deferred(epoch)
        done()
        return tokens

    def prepare_deferred(self, epoch: int) -> tuple[list[str], Callable[[], None]]:
        from sealstream.distributed._shard import gather, on_ckpt

        if self._before is not None:
            self._before()
        tokens, done = self.local.prepare_deferred(epoch)
        actors = self._actors()
        # on the workers' checkpoint thread: not behind the next step's reads
        parts = gather([on_ckpt(a.prepare_results).remote(epoch, self.output)
                        for a in actors],
                       f"prepare {self.output}")
        return list(tokens) + [t for ts in parts for t in ts], done

    def commit(self, epoch: int, tokens: list[str]) -> None:
        """The coordinator's own tokens here, then each worker's own file by that
        worker (idempotent, as every commit). A token of a worker index the job no
        longer has (it restarted with fewer) is committed here: same directory."""
        from sealstream.distributed._shard import gather

        actors = self._actors()
        by_worker: dict[int, list[str]] = {}
        here: list[str] = []
        for t in tokens:
            i = self._token_worker(t)
            if 0 <= i < len(actors):
                by_worker.setdefault(i, []).append(t)
            else:
                here.append(t)
        self.local.commit(epoch, here)
        for i in sorted(by_worker):
            gather([actors[i].commit_results.remote(epoch, by_worker[i], self.output)],
                   f"commit {self.output}")
            self._worker_committed()
            self._crash("after_commit_worker_part" if self.output == "results"
                        else "after_commit_worker_records")

    def _token_worker(self, token: str) -> int:
        """The index of the worker that staged ``token`` (-1: none, the coordinator's)."""
        m = _WORKER_RUN.fullmatch(token)
        if m is not None:
            return int(m.group(1))
        w = token_worker(token)  # a database token staged by a worker (:mod:`._db_sinks`)
        return -1 if w is None else w

    def _worker_committed(self) -> None:
        """Called after each worker committed its share of an epoch."""

    def recover(self, prepared: dict[int, list[str]]) -> None:
        self.local.recover(prepared)

    def recover_at(self, staged_at: object, prepared: dict[int, list[str]]) -> None:
        self.local.recover_at(staged_at, prepared)

    def location(self) -> str | None:
        return self.local.location()

    def committed(self) -> list[CommittedFile]:
        return self.local.committed()

    def read_ids(self, files: list[CommittedFile]) -> pl.DataFrame:
        return self.local.read_ids(files)

    def close(self) -> None:
        self.local.close()
