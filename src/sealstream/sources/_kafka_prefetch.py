"""Reading ahead: a Kafka partition's next chunks fetched and parsed on a thread.

A live run alternates between the source (``consume``: librdkafka hands over its
messages, one Python object each; then the columnar parse of the values) and the
engine (windows, sinks, checkpoints). Both spend much of their time outside the
GIL (librdkafka, Polars), so on two cores they can overlap: a :class:`Prefetcher`
calls the partition's fetch on a thread of its own and keeps what it returns in a
bounded queue, while the engine works on the previous chunk. The caller's
:meth:`Prefetcher.take` hands out the queued chunks in order.

What it does not change:

* **What a step contains.** The runtime still takes one chunk per poll and plans
  its steps from the chunks it was handed, as before; reading ahead changes only
  *when* the bytes were fetched. A replay re-reads the recorded ranges.
* **Positions.** Records fetched ahead but not handed out are nobody's: the
  partition's ``position`` is the one after the last chunk handed out, and only
  what a step took reaches a plan, a checkpoint or the consumer group. A crash
  loses the queue; recovery re-reads from the checkpoint.
* **Faults.** An exception of the fetch (the broker gone for ``fail_after_ms``, an
  expired position, a deleted topic) is raised by :meth:`take` once the chunks
  fetched before it were handed out: the same error, at the same point of the
  stream, as without reading ahead.

Bound: at most ``depth`` chunks wait in the queue, each at most ``max_records``
of the last :meth:`take`; the thread waits while the queue is full.

**Off by default** (``SEALSTREAM_KAFKA_PREFETCH`` = the queue's depth in chunks,
default 0). Measured on the shared 2-core machine (``bench/results/speed.md``), a
``stop = "end"`` backfill ran slower with it: such a run is one or two steps of up
to ``batch_size`` records per partition, so there is little engine work to overlap,
and the parse of the values holds the GIL for much of its time, so three partitions
parsing on three threads contend with each other and the run's thread instead of
running side by side.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

#: the queue's depth when reading ahead is on (each chunk <= batch_size records).
#: One: the thread fetches the next chunk as soon as the run takes the previous one,
#: so a chunk holds what arrived while the run worked on a step, as without reading
#: ahead (a deeper queue fills with the small chunks of a fast thread, and each step
#: takes one: more, smaller steps, each with its plan record)
PREFETCH_DEPTH = 1
#: how long a stop (seek, close) waits for the thread: its longest call is a
#: watermark query (5 s) on a gap; a consume waits at most the fetch's own wait
_JOIN_S = 10.0

T = TypeVar("T")

#: the environment variable that turns reading ahead on (chunks per partition)
PREFETCH_ENV = "SEALSTREAM_KAFKA_PREFETCH"


def prefetch_depth() -> int:
    """Chunks each Kafka partition reads ahead: ``SEALSTREAM_KAFKA_PREFETCH``
    (an integer >= 0), 0 when unset or empty; anything else is a SpecError."""
    from sealstream.errors import SpecError

    text = os.environ.get(PREFETCH_ENV, "").strip()
    if not text:
        return 0
    if not text.isdigit():
        raise SpecError(f"{PREFETCH_ENV}: {text!r} is not a number of chunks >= 0")
    return int(text)


class Prefetcher(Generic[T]):
    """Calls ``fetch(max_records)`` on a thread of its own, keeping at most ``depth``
    results it returned (None: nothing new, not kept) until :meth:`take` hands them
    out. Started by the first :meth:`take`; :meth:`stop` ends it for good."""

    def __init__(self, fetch: Callable[[int], T | None], depth: int, name: str) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth {depth} must be >= 1")
        self._fetch = fetch
        self.depth = depth
        self._name = name
        self._cond = threading.Condition()
        self._queue: deque[T] = deque()
        self._error: BaseException | None = None
        self._want = 1
        self._stopped = False
        self._thread: threading.Thread | None = None
        #: the most chunks the queue ever held (<= depth)
        self.peak = 0
        #: the thread waits because the queue is full (it holds ``depth`` chunks)
        self.waiting_full = False

    # -- the caller's side ----------------------------------------------------
    def take(self, max_records: int, timeout_s: float) -> T | None:
        """The oldest chunk fetched ahead, waiting at most ``timeout_s`` for one
        (None: nothing yet). Raises the fetch's exception once the chunks fetched
        before it were taken."""
        with self._cond:
            if self._stopped:
                raise RuntimeError(f"the reader of {self._name} was closed")
            self._want = max(1, max_records)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, daemon=True, name=f"sealstream-prefetch {self._name}")
                self._thread.start()
            deadline = time.monotonic() + max(0.0, timeout_s)
            while not self._queue and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if self._queue:
                item = self._queue.popleft()
                self.waiting_full = False
                self._cond.notify_all()
                return item
            if self._error is not None:
                raise self._error
            return None

    def queued(self) -> int:
        with self._cond:
            return len(self._queue)

    def stop(self) -> bool:
        """End the thread and drop what it fetched ahead; False when it did not end
        within its bound (it is a daemon: it cannot hold the process)."""
        with self._cond:
            self._stopped = True
            self._queue.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(_JOIN_S)
        return not thread.is_alive()

    # -- the thread -----------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and len(self._queue) >= self.depth:
                    self.waiting_full = True
                    self._cond.wait()
                self.waiting_full = False
                if self._stopped:
                    return
                want = self._want
            try:
                item = self._fetch(want)
            except BaseException as exc:  # handed to the caller, raised there
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                return
            if item is None:
                continue
            with self._cond:
                if self._stopped:
                    return
                self._queue.append(item)
                self.peak = max(self.peak, len(self._queue))
                self._cond.notify_all()


__all__ = ["PREFETCH_DEPTH", "PREFETCH_ENV", "Prefetcher", "prefetch_depth"]
