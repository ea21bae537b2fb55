"""Kafka output per worker: a transactional producer of each worker's own.

With ``kind = "kafka"`` results and a bounded source (or a Kafka or NATS source read
by the workers), each key worker finalises the windows it fires and produces them
itself, through a :class:`~sealstream.sinks.kafka.KafkaSink` of its own whose
``transactional.id`` is the job's (``sealstream-<pipeline>-<output>``, or the one the
settings name) followed by ``-w<i>`` for worker ``i``, and whose run token is
``<run>w<i>``. Late events and bad records into Kafka (``[late]``, ``[errors]``) are
produced the same way by the worker that reads their partition (:mod:`._records`),
with ids ``...-late-w<i>`` and ``...-errors-w<i>``. The two-phase commit is the
single-process Kafka sink's, spread over the workers as the part files are
(:mod:`._sinks`):

1. **stage**: every step, a worker keeps its result rows of the epoch in memory (and
   their identities for the epoch's receipt, :mod:`._receipts`); only their number and
   largest window end go back to the coordinator;
2. **prepare**: at a checkpoint each worker writes its rows of the epoch into the
   job's Kafka staging folder (``.part-<epoch>-<run>w<i>.arrow``, fsynced) and returns
   the token ``<epoch>-<run>w<i>``; the manifest records every worker's token (and the
   coordinator's, for a step it staged), and the topic's end offsets (``path``);
3. **commit**: once the manifest is published, the coordinator tells each worker, one
   after the other, to commit: the worker begins a transaction, produces its staged
   rows, commits the transaction and deletes its staged file;
4. **recover** (on the coordinator, with any worker count): first every worker
   producer that may hold a transaction is **fenced** (``init_transactions`` under its
   ``transactional.id``: the broker aborts its open transaction and refuses its later
   commits), for every index below the new worker count and every index named by a
   staged file or a prepared token; then the single-process recovery reads the topic
   back ``read_committed`` from the recorded offsets, produces (under the
   coordinator's own id) each prepared token the topic does not hold, and deletes
   every other staged file.

A worker's producer is created at its first commit, after the coordinator's recovery
(so recovery never fences it), and it reads nothing back at its start: the topic's
ends at that moment are where its retries look for its own epoch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sealstream.distributed._sinks import WorkerPartsSink, WorkerResults
from sealstream.pipeline import Pipeline
from sealstream.sinks.kafka import KafkaSink

#: a token staged by worker ``i``: ``<epoch>-<run>w<i>``
WORKER_TOKEN = re.compile(r"[0-9]{12,}-[A-Za-z0-9]*w([0-9]+)")


def worker_transactional_id(base: str, index: int) -> str:
    """The ``transactional.id`` of worker ``index``'s producer."""
    return f"{base}-w{index}"


@dataclass(frozen=True)
class WorkerProducer:
    """What a worker needs to open its producer (sent through Ray: no secret in it;
    librdkafka settings come from the pipeline each worker holds)."""

    transactional_id: str
    staging: str
    #: the run's base token (the worker's is ``<family>w<i>``)
    family: str


def open_worker_kafka(pipeline: Pipeline, role: str, run_token: str,
                      producer: WorkerProducer) -> KafkaSink:
    """A worker's own Kafka sink for ``role`` (``results``, ``late``, ``errors``)."""
    config = {"results": pipeline.sink, "late": pipeline.late,
              "errors": pipeline.errors}[role]
    assert config is not None and config.bootstrap is not None and config.topic is not None
    settings = {k: v for k, v in config.settings if k != "transactional.id"}
    sink = KafkaSink(config.bootstrap, config.topic,
                     "results" if role == "results" else "records", run_token,
                     producer.staging, settings,
                     transactional_id=producer.transactional_id)
    sink.family = producer.family
    sink.from_end = True
    if role == "results":
        sink.key_fields = pipeline.source.key_fields
    return sink


def open_on_worker(pipeline: Pipeline, run_token: str, sort: bool, keep_ids: bool,
                   producer: WorkerProducer) -> WorkerResults:
    """A worker's results stage producing into Kafka."""
    sink = open_worker_kafka(pipeline, "results", run_token, producer)
    return WorkerResults(pipeline, run_token, sort, keep_ids, sink=sink)


class KafkaWorkersSink(WorkerPartsSink):
    """The coordinator's view of a Kafka output produced by the workers: its own sink
    ``local`` (recovery, read-back, the offsets the manifest records, steps it staged
    itself) plus one transactional producer per worker (see the module docstring)."""

    local: KafkaSink

    def __init__(self, local: KafkaSink, actors: Callable[[], list[Any]],
                 crash: Callable[[str], None], run_token: str, workers: int,
                 output: str = "results", before: Callable[[], None] | None = None) -> None:
        super().__init__(local, actors, crash, output, before)
        self.workers = workers
        self.run_token = run_token
        local.family = run_token
        local.fence_below = workers  # its recovery fences every worker's producer

    def producer(self, index: int) -> WorkerProducer:
        return WorkerProducer(worker_transactional_id(self.local.transactional_id, index),
                              os.path.abspath(self.local.path), self.run_token)

    # commit: the coordinator's own tokens here, then each worker's by that worker (its
    # transaction), one after the other; a token of an index the job no longer has is
    # produced here (WorkerPartsSink.commit)
    def _token_worker(self, token: str) -> int:
        m = WORKER_TOKEN.fullmatch(token)
        i = int(m.group(1)) if m else -1
        return i if i >= 0 and token.endswith(f"{self.run_token}w{i}") else -1

    def _worker_committed(self) -> None:
        self.local.moved()  # the topic's end offsets the next manifest records

