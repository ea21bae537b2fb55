"""The output stage: turning fired windows into result lines and staging them,
on one background thread, one batch behind the processing thread.

Building the result text and writing it (tens of thousands to millions of
lines for sliding windows) would otherwise stop the processing thread while
the second core idles. The stage keeps the protocol's order:

* jobs run one at a time, in submission order (one worker thread);
* at most one job is in flight: :meth:`OutputStage.submit` first waits for the
  previous one, so memory stays bounded and a failed write surfaces at the
  next batch at the latest;
* the engine calls :meth:`OutputStage.drain` before every step that needs the
  staged output complete: preparing a checkpoint (sink tokens, receipts,
  counters), committing an epoch, ending the run, and any crash point that is
  armed. No sink method other than ``write`` ever runs while a job is in
  flight.

A job's exception is raised again by the next ``submit`` or ``drain``: the run
fails before any checkpoint could include the lost output.

Database sinks write through a connection that belongs to the processing
thread, so with one the stage runs jobs inline (``concurrent=False``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


class OutputStage:
    """One-deep, ordered background execution of output jobs."""

    def __init__(self, concurrent: bool) -> None:
        self._pool = (
            ThreadPoolExecutor(1, thread_name_prefix="sealstream-output") if concurrent else None
        )
        self._job: Future[None] | None = None

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` after the previous one (in the background when concurrent)."""
        self.drain()
        if self._pool is None:
            job()
        else:
            self._job = self._pool.submit(job)

    def drain(self) -> None:
        """Wait for the job in flight; raise its exception if it failed."""
        job, self._job = self._job, None
        if job is not None:
            job.result()

    def close(self) -> None:
        """Stop the worker after its job (its failure, if any, was or will be
        reported by the run that is ending)."""
        job, self._job = self._job, None
        if job is not None:
            with contextlib.suppress(BaseException):
                job.result()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
