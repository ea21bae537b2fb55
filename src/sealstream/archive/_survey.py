"""``sealstream archive list|verify``: the segments of an archive and their bindings.

The bindings are the step plans kept in the job's checkpoint store: each plan that
verifies (signed with ``SEALSTREAM_CHECKPOINT_KEY`` when set; each one chained to the
one before it from the first kept) names its segment's name, size and SHA-256.

Per segment, a verdict:

* ``OK``: bound by a plan, present, and (``verify``) its bytes hash as recorded;
* ``DAMAGED``: bound, present, but its size or hash differs (``verify`` only);
* ``MISSING``: bound by a plan, absent from the archive;
* ``UNBOUND``: in the archive, named by no kept plan (a crash between the segment and
  its plan, or a step whose plan retention removed): no recovery reads it, retention
  removes it; not a failure.

Segments are never parsed here, only hashed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sealstream._objects import Objects, ObjectStoreError, open_objects
from sealstream.archive import ArchiveSettings
from sealstream.archive._segments import SegmentEntry, segment_step
from sealstream.errors import SourceError


def _bindings(store: Any, key: bytes | None) -> tuple[dict[str, tuple[int, SegmentEntry]],
                                                       list[dict[str, Any]]]:
    """Segment name -> (step, entry) from the kept plans that verify; and the plans
    that do not (step, reason)."""
    from sealstream.checkpoint.plans import judge_plan

    out: dict[str, tuple[int, SegmentEntry]] = {}
    bad: list[dict[str, Any]] = []
    prev: str | None = None
    last: int | None = None
    for step in store.plan_steps():
        data = store.read_plan(step)
        if prev is None or last is None or step != last + 1:
            try:  # the first kept plan: its own claim of its predecessor
                prev = str(json.loads(data or b"{}").get("prev", ""))
            except ValueError:
                prev = ""
        v = judge_plan(data, step, prev, key)
        if not v.ok or v.plan is None:
            bad.append({"step": step, "reason": v.reason})
            prev, last = None, None
            continue
        prev, last = v.plan.digest(), step
        if v.plan.archive is not None:
            entry = SegmentEntry.from_json(v.plan.archive)
            out[entry.name] = (step, entry)
    return out, bad


def survey(settings: ArchiveSettings, store: Any, key: bytes | None, *, verify: bool
           ) -> dict[str, Any]:
    """What ``archive list`` (``verify=False``) or ``archive verify`` prints."""
    try:
        objects: Objects = open_objects(settings.location(), settings.endpoint_url)
        listed = set(objects.keys("seg-"))
    except ObjectStoreError as exc:
        raise SourceError(f"[archive] {exc}") from None
    bound, bad_plans = _bindings(store, key)
    rows: list[dict[str, Any]] = []
    for name in sorted(set(bound) | {k for k in listed if segment_step(k) is not None}):
        step, entry = bound.get(name, (segment_step(name), None))
        row: dict[str, Any] = {"name": name, "step": step}
        if entry is None:
            row["verdict"] = "UNBOUND"
        elif name not in listed:
            row |= {"bytes": entry.bytes, "sha256": entry.sha256, "verdict": "MISSING"}
        else:
            row |= {"bytes": entry.bytes, "sha256": entry.sha256, "verdict": "OK"}
            if verify:
                try:
                    data = objects.get(name)
                except ObjectStoreError as exc:
                    raise SourceError(f"[archive] {exc}") from None
                if data is None:
                    row["verdict"] = "MISSING"
                elif len(data) != entry.bytes or \
                        hashlib.sha256(data).hexdigest() != entry.sha256:
                    row["verdict"] = "DAMAGED"
        rows.append(row)
    return {"archive": objects.location, "segments": rows, "rejected_plans": bad_plans,
            "ok": all(r["verdict"] in ("OK", "UNBOUND") for r in rows)}


__all__ = ["survey"]
