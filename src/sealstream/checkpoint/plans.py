"""Step plans of live runs: a write-ahead log of what each step reads and decides.

Like Spark's offsets log, the plan of step ``n`` is made durable *before* the
step's output is staged: per partition the range ``[from, to)`` of positions the
step reads, and every decision taken on processing time (which partitions are
idle, how far ``W`` advances by the wall clock). A run that crashes is replayed
from its restored checkpoint by re-reading exactly the recorded ranges and
re-applying exactly the recorded decisions, so its output is the output of one
uninterrupted run of the same plan.

Unlike Spark's log, the records are *chained and signed* into the checkpoint
chain: each record holds the digest of the record before it, it is signed like a
manifest (HMAC with ``SEALSTREAM_CHECKPOINT_KEY``, else a SHA-256 digest), and
each checkpoint's manifest names the last step it includes and that step's
digest (``plan``). On recovery the records after the restored checkpoint's step
are accepted only while each verifies and links to the one before; the first
that does not (damaged, forged, out of chain) is moved aside with everything
after it, exactly like checkpoint damage, and the run continues live from there.

Records are stored beside the checkpoints, in every store (``plans/step-N.json``
in a directory; rows named so in the databases) and pruned with the
checkpoints they belong to: retention deletes the records of steps at or before
the oldest checkpoint it keeps.

This module is pure: encoding, signing and the verdict on a chain. Storage is the
store's (:meth:`~sealstream.checkpoint.stores.CheckpointStore.write_plan`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from sealstream.archive._segments import SegmentEntry
from sealstream.checkpoint.manifest import canonical, sign, signature_ok

PLAN_FORMAT = 1
PLANS_DIR = "plans"


def plan_name(step: int) -> str:
    """The blob name of step ``step``'s record."""
    return f"{PLANS_DIR}/step-{step:012d}.json"


def parse_plan_name(name: str) -> int | None:
    base = name.rsplit("/", 1)[-1]
    if not (base.startswith("step-") and base.endswith(".json")):
        return None
    digits = base[5:-5]
    return int(digits) if digits.isdigit() else None


@dataclass(frozen=True)
class StepPlan:
    """What one step of a live run reads and decides.

    ``ranges``: partition name -> ``(from, to)`` positions (``to`` excluded); a
    partition absent from it reads nothing in the step. ``idle``: the partitions
    that are idle during the step (docs/live.md). ``advance_ms``: the wall-clock
    advance of ``W`` applied after the step's events (None: none). ``now_ms``: the
    wall clock when the step was planned (informative). ``partitions``: every
    partition known at the step, in index order (new names are growth).
    """

    step: int
    prev: str
    partitions: tuple[str, ...]
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    idle: tuple[str, ...] = ()
    advance_ms: int | None = None
    now_ms: int = 0
    end: bool = False
    """The step after which the run ends (``stop = "end"``: every window fires)."""
    files: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Followed files: the identity (device, inode) of the file a partition listed for
    the first time starts in, so a replay reads that file even when it was rotated
    away since (docs/live.md, "Rotation and truncation"). Absent when empty."""
    archive: dict[str, Any] | None = None
    """``[archive]``: the segment holding the raw records the step read (``name``,
    ``bytes``, ``sha256``; :mod:`sealstream.archive`), created before this record.
    Absent without an archive, or when the step read no position."""

    def body(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "step": self.step,
            "prev": self.prev,
            "partitions": list(self.partitions),
            "ranges": {k: [a, b] for k, (a, b) in sorted(self.ranges.items())},
            "idle": list(self.idle),
            "advance_ms": self.advance_ms,
            "now_ms": self.now_ms,
            "end": self.end,
        } | ({"files": {k: [d, i] for k, (d, i) in sorted(self.files.items())}}
             if self.files else {}) | ({"archive": dict(self.archive)} if self.archive else {})

    def digest(self) -> str:
        return hashlib.sha256(canonical(self.body())).hexdigest()

    def encode(self, key: bytes | None) -> bytes:
        doc = self.body()
        doc["signature"] = sign(self.body(), key)
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def from_body(cls, doc: dict[str, Any]) -> StepPlan:
        return cls(
            step=int(doc["step"]),
            prev=str(doc["prev"]),
            partitions=tuple(str(p) for p in doc["partitions"]),
            ranges={str(k): (int(v[0]), int(v[1])) for k, v in doc["ranges"].items()},
            idle=tuple(str(p) for p in doc["idle"]),
            advance_ms=None if doc.get("advance_ms") is None else int(doc["advance_ms"]),
            now_ms=int(doc.get("now_ms", 0)),
            end=bool(doc.get("end", False)),
            files={str(k): (int(v[0]), int(v[1])) for k, v in doc.get("files", {}).items()},
            archive=(SegmentEntry.from_json(doc["archive"]).to_json()
                     if doc.get("archive") is not None else None),
        )


@dataclass(frozen=True)
class PlanVerdict:
    step: int
    ok: bool
    reason: str
    plan: StepPlan | None = None


def judge_plan(data: bytes | None, step: int, prev: str, key: bytes | None) -> PlanVerdict:
    """Whether ``data`` is a valid record of ``step`` that follows the record whose
    digest is ``prev``: readable, signed (with ``key``), of that step, chained."""
    if data is None:
        return PlanVerdict(step, False, "MISSING")
    try:
        doc = json.loads(data)
    except ValueError:
        return PlanVerdict(step, False, "UNREADABLE")
    if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT:
        return PlanVerdict(step, False, "UNREADABLE")
    ok, code = signature_ok(doc, key)
    if not ok:
        return PlanVerdict(step, False, code)
    body = {k: v for k, v in doc.items() if k != "signature"}
    try:
        plan = StepPlan.from_body(body)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        return PlanVerdict(step, False, "MALFORMED")
    if plan.body() != body:
        return PlanVerdict(step, False, "MALFORMED")
    if plan.step != step:
        return PlanVerdict(step, False, "WRONG_STEP")
    if plan.prev != prev:
        return PlanVerdict(step, False, "CHAIN_BROKEN")
    for a, b in plan.ranges.values():
        if b < a:
            return PlanVerdict(step, False, "MALFORMED")
    return PlanVerdict(step, True, "OK", plan)


__all__ = [
    "PLANS_DIR",
    "PLAN_FORMAT",
    "PlanVerdict",
    "StepPlan",
    "judge_plan",
    "parse_plan_name",
    "plan_name",
]
