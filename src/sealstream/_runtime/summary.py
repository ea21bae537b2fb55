"""What a run did: its counters, checkpoint figures and summary (``--summary-json``).

Two sets of counters, never mixed: the **job's totals** (since its first run, or
the last ``--start-over``; restored from the checkpoint a run resumes from, and
recorded in every checkpoint) and **this run's** (what the run itself read and
wrote; its rate divides this run's events by this run's time). Results, late
events and bad records are counted apart, and so is the output a resumed run
found already committed and did not repeat.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sealstream.watermark import json_ms


@dataclass
class Counters:
    events: int = 0
    late_events: int = 0
    bad_records: int = 0
    windows_fired: int = 0
    results_written: int = 0
    suppressed: int = 0

    def to_json(self) -> dict[str, int]:
        return dict(self.__dict__)

    def minus(self, base: Counters) -> Counters:
        """These counters less ``base`` (a copy when ``base`` is zero)."""
        return Counters(**{k: v - getattr(base, k) for k, v in self.__dict__.items()})

    def public(self) -> dict[str, int]:
        """The counters a summary shows (``suppressed`` mixes roles: see ``not_repeated``)."""
        return {k: v for k, v in self.__dict__.items() if k != "suppressed"}


@dataclass
class CheckpointStats:
    count: int = 0
    total_ms: float = 0.0
    total_bytes: int = 0
    last_id: int | None = None
    last_at: float | None = None
    last_ms: float = 0.0
    last_bytes: int = 0
    #: (id, ms, bytes) of the checkpoints finished lately, oldest first: a log that
    #: looks after several finished between two batches reports each of them
    recent: deque[tuple[int, float, int]] = field(default_factory=lambda: deque(maxlen=256))
    #: time the processing thread spent on checkpoints (capture and commit), the
    #: rest of ``total_ms`` overlapped with processing
    blocked_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "mean_ms": self.total_ms / self.count if self.count else 0.0,
            "mean_blocking_ms": self.blocked_ms / self.count if self.count else 0.0,
            "mean_bytes": self.total_bytes / self.count if self.count else 0.0,
            "last_id": self.last_id,
        }


@dataclass
class RunSummary:
    """What a run did; printed by the CLI and written by ``--summary-json``.

    ``counters`` are the job's totals, ``run_counters`` this run's share of them;
    ``not_repeated`` counts per output (results, late, errors) what this run found
    already committed and suppressed; ``fields_never_seen`` the aggregated fields
    that none of this run's good events carried (their aggregates are null).
    """

    pipeline: str
    counters: Counters
    checkpoints: CheckpointStats
    seconds: float
    resumed_from: int | None
    rejected: list[dict[str, Any]] = field(default_factory=list)
    open_windows: int = 0
    watermark_ms: int | None = None
    replay: dict[str, Any] | None = None
    stopped_early: bool = False
    run_counters: Counters | None = None  # None: the same as ``counters``
    not_repeated: dict[str, int] = field(default_factory=dict)
    fields_never_seen: list[str] = field(default_factory=list)
    #: a run with ``--workers``: worker count, Ray and worker start and engine seconds
    distributed: dict[str, Any] | None = None

    @property
    def this_run(self) -> Counters:
        return self.run_counters if self.run_counters is not None else self.counters

    @property
    def events_per_second(self) -> float | None:
        """This run's events over this run's time (None when it read no event)."""
        n = self.this_run.events
        return round(n / self.seconds, 1) if n and self.seconds > 0 else None

    def late_warning(self) -> str | None:
        """One line when more than half of this run's events were late (None
        otherwise): the likely cause is a watermark far ahead of the data, most often
        one a checkpoint kept from an earlier run over newer data."""
        c = self.this_run
        if not c.events or 2 * c.late_events <= c.events:
            return None
        where = (f"resumed from checkpoint {self.resumed_from}, whose watermark came "
                 "from an earlier run"
                 if self.resumed_from is not None else "events far older than the rest")
        return (f"warning: {c.late_events:,} of this run's {c.events:,} events "
                f"({100 * c.late_events / c.events:.0f}%) were late: the watermark is far "
                f"ahead of these events' times (likely cause: {where}); they are in the "
                "late output (or only counted without one); to compute them again, "
                "replay into a new destination or run with --start-over")

    def bad_ratio(self) -> float | None:
        """The job's bad records over all its records (None before any record)."""
        c = self.counters
        total = c.events + c.bad_records
        return c.bad_records / total if total else None

    def to_json(self) -> dict[str, Any]:
        total = self.counters.public()
        nr = self.not_repeated
        return {
            "pipeline": self.pipeline,
            **total,  # the same as job_total: kept for scripts that read them
            "this_run": {
                **self.this_run.public(),
                "already_committed": {"results": nr.get("results", 0),
                                      "late_events": nr.get("late", 0),
                                      "bad_records": nr.get("errors", 0)},
                "events_per_second": self.events_per_second,
            },
            "job_total": total,
            "seconds": round(self.seconds, 6),
            "checkpoints": self.checkpoints.to_json(),
            "resumed_from": self.resumed_from,
            "rejected": self.rejected,
            "open_windows": self.open_windows,
            "watermark_ms": json_ms(self.watermark_ms),
            "fields_never_seen": self.fields_never_seen,
            **({"replay": self.replay} if self.replay is not None else {}),
            **({"stopped_early": True} if self.stopped_early else {}),
            **({"distributed": self.distributed} if self.distributed is not None else {}),
        }
