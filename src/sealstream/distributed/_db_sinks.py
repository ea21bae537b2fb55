"""Results in PostgreSQL staged and committed by the workers themselves.

With ``[sink] kind = "postgresql"``, each key worker opens its own connection to the
results database and runs the single-process :class:`~sealstream.sinks.database.DatabaseSink`
on its share of every epoch, under the run token ``<run>w<i>`` (worker ``i``):

1. **stage**: every step the worker finalises its fired windows and keeps them for the
   epoch (:class:`~sealstream.distributed._sinks.WorkerResults`, as for a results
   directory); only their number and largest window end go to the coordinator;
2. **prepare**: at a checkpoint the worker writes its rows of the epoch into
   ``sealstream_sink_staging`` (one Arrow IPC row, token ``<epoch>-<run>w<i>``, its
   pipeline's name: exactly the single-process staging row, one per worker) and
   returns only the token; the manifest records every worker's token among the
   results' commit tokens, and the epoch's receipt (count, digest, root over every
   result id) is built by a worker (:mod:`._receipts`);
3. **commit**: once the manifest is published the coordinator tells each worker to
   commit its token: in one transaction of the worker's connection, upsert the staged
   rows, record the token in ``sealstream_sink_commits`` and delete the staging row
   (the single-process commit, recorded once, so a repeat does nothing);
4. **recover**: the next run (any worker count) commits on the coordinator every token
   the restored checkpoint names that ``sealstream_sink_commits`` does not hold yet
   (whoever staged it) and deletes every other staging row of its pipeline's table,
   exactly as one process does.

The results never cross the coordinator in a run; only the recovery after a crash
between the manifest and a worker's commit reads that worker's staged rows there.

**Choice: each worker commits its own share** (Flink's two-phase commit: every sink
subtask commits its own transaction on ``notifyCheckpointComplete``), not one
transaction of the coordinator over every worker's rows: the latter would move every
result through the coordinator at each checkpoint. Exactly-once holds across a crash
between the workers' commits because each worker's commit records its token in the
same transaction as its upsert: a share is either committed and recorded, or still
staged and named by the published manifest, and recovery commits precisely the
latter. What a reader of the table may see in between is one worker's share of an
epoch without the other's (until the recovery commits it), as with Flink's sinks.

With the checkpoint store in the same PostgreSQL database, one process upserts the
results inside the transaction that publishes the manifest; with workers the rows
are staged and committed per worker as above (still exactly once, by the recorded
commits), since that transaction is the coordinator's.

**SQLite stays on the coordinator.** An SQLite file belongs to one host and is not safe
on a network file system, while Ray places workers on any node; so results in SQLite
are staged and committed by the coordinator as on one process (the fired windows
cross it), as the checkpoints of an SQLite store do.
"""

from __future__ import annotations

import re

from sealstream.pipeline import Pipeline
from sealstream.sinks._base import Sink
from sealstream.sinks.database import DatabaseSink

#: a worker's commit token: ``<epoch>-<run>w<i>`` (run tokens are hex: no ``w``)
_WORKER_TOKEN = re.compile(r"[0-9]{12,}-[A-Za-z0-9]*w([0-9]+)")


def stages_db_on_workers(sink: Sink) -> bool:
    """Whether the workers stage and commit this database output themselves:
    PostgreSQL results (SQLite stays on the coordinator)."""
    return isinstance(sink, DatabaseSink) and sink.dialect == "postgresql" \
        and sink.role == "results"


def token_worker(token: str) -> int | None:
    """The worker index of a database commit token staged by a worker, else None."""
    m = _WORKER_TOKEN.fullmatch(token)
    return int(m.group(1)) if m else None


def setup_worker_db(sink: Sink, pipeline: Pipeline) -> None:
    """A worker's own database sink: the key's columns, its staged rows and its claim on
    the table are the pipeline's (as on the coordinator); it stages and commits on its
    own (never inside the coordinator's checkpoint transaction)."""
    if isinstance(sink, DatabaseSink):
        sink.key_fields = pipeline.source.key_fields
        sink.pipeline = pipeline.name
        sink.transactional = False
