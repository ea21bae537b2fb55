"""Named crash points for exactly-once tests.

``SEALSTREAM_CRASH_AT="<point>:<n>"`` (comma-separated for several) makes the
process SIGKILL itself the n-th time (1-based) it reaches ``<point>``: no
cleanup, no flush, exactly like a power cut for everything not yet fsynced.

Points, in the order a checkpoint passes them: ``batch`` (after a batch was
applied, before its output is staged), ``after_stage`` (output staged),
``after_sink_prepare``, ``after_write_state``, ``after_write_receipts``,
``after_write_suppress``, ``before_manifest_publish``,
``after_manifest_publish``, ``after_commit_results``, ``after_commit_late``,
``after_commit_errors``, ``after_retention``.

Sinks and the scale-out job have points of their own, not in :data:`POINTS` (a
single-process run with another sink never reaches them): ``kafka_in_transaction``
(the Kafka sink produced an epoch's rows in its transaction and has not committed
it yet) and ``after_write_parts`` (a distributed run: every worker wrote its part of
the state, between ``after_sink_prepare`` and ``after_write_state``).

``SEALSTREAM_PAUSE_AT`` (same syntax, read only from the environment) makes the
process stop itself with SIGSTOP instead, for a test to change something at that
exact step (an input file, say) and let it go on with SIGCONT.
"""

from __future__ import annotations

import os
import signal
import threading

from sealstream.errors import SpecError

ENV = "SEALSTREAM_CRASH_AT"
PAUSE_ENV = "SEALSTREAM_PAUSE_AT"
POINTS = (
    "batch",
    "after_stage",
    "after_sink_prepare",
    "after_write_state",
    "after_write_receipts",
    "after_write_suppress",
    "before_manifest_publish",
    "after_manifest_publish",
    "after_commit_results",
    "after_commit_late",
    "after_commit_errors",
    "after_retention",
)


class CrashPoints:
    """Counts visits to each point and kills the process where asked."""

    def __init__(self, spec: str | None = None) -> None:
        pauses = os.environ.get(PAUSE_ENV, "") if spec is None else ""
        spec = os.environ.get(ENV, "") if spec is None else spec
        self.targets = _parse(ENV, spec)
        self.pauses = _parse(PAUSE_ENV, pauses)
        self.seen: dict[str, int] = {}
        self._lock = threading.Lock()  # the checkpoint writer thread counts too

    def __call__(self, point: str) -> None:
        if not self.targets and not self.pauses:
            return
        with self._lock:
            self.seen[point] = self.seen.get(point, 0) + 1
            hit = self.targets.get(point) == self.seen[point]
            pause = self.pauses.get(point) == self.seen[point]
        if hit:
            os.kill(os.getpid(), signal.SIGKILL)
        if pause:
            os.kill(os.getpid(), signal.SIGSTOP)


def _parse(env: str, spec: str) -> dict[str, int]:
    targets: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, colon, n = part.partition(":")
        if not name or (colon and not (n.isdigit() and int(n) >= 1)):
            raise SpecError(f"{env}: {part!r} is not POINT or POINT:N (N >= 1)")
        targets[name] = int(n) if colon else 1
    return targets
