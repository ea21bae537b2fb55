"""What a run did: its counters, checkpoint figures and summary (``--summary-json``)."""

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
    """What a run did; printed by the CLI and written by ``--summary-json``."""

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

    def to_json(self) -> dict[str, Any]:
        c = self.counters.to_json()
        return {
            "pipeline": self.pipeline,
            **c,
            "seconds": round(self.seconds, 6),
            "events_per_second": round(c["events"] / self.seconds, 1) if self.seconds else None,
            "checkpoints": self.checkpoints.to_json(),
            "resumed_from": self.resumed_from,
            "rejected": self.rejected,
            "open_windows": self.open_windows,
            "watermark_ms": json_ms(self.watermark_ms),
            **({"replay": self.replay} if self.replay is not None else {}),
            **({"stopped_early": True} if self.stopped_early else {}),
        }
