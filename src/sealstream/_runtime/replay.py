"""``sealstream replay``: re-run an interval into an isolated destination.

``replay SPEC --from ORIGIN --to DIR`` runs the pipeline of SPEC with every
output moved under DIR — results in ``DIR/out``, late events in ``DIR/late``,
bad records in ``DIR/errors`` (each only when the spec has it; a ``stdout``
output stays on stdout; a SQLite or PostgreSQL results table becomes JSONL files
in ``DIR/out``) — and its own checkpoints in ``DIR/ckpt``. The live
outputs and the live checkpoint directory are never written: the live
checkpoint is only read, without taking its lock, so a replay can run next to
the live job.

ORIGIN is one of:

* ``start`` — every partition from its first record, no state (the same
  results as a fresh run of the spec).
* ``ID`` — a checkpoint of the live checkpoint directory: its window state,
  watermark and positions. It must verify ``ATOMIC_CHECKPOINT`` against the
  spec (same key, same definition), else the replay stops (exit 1) naming
  the verdict. The replay then emits exactly what the live run emitted after
  that checkpoint.
* ``p0=OFFSET,p1=OFFSET`` — the named partitions (by name as written in the
  spec, or ``p<index>``) start at those offsets, the others at their start,
  with empty window state and the initial watermark. On a live source the
  partitions are those the source lists now (a Kafka topic's ``topic/N``, whose
  positions are offsets; a NATS source's subjects, whose positions are stream
  sequences; followed files) and the ones not named open where the spec's
  ``start`` says; a named position below the earliest one retained is refused
  (exit 1), never skipped. **Windows spanning the
  start are partial** (they miss the events before it) and lateness is judged
  against a watermark that starts afresh; the summary says so.

The destination is refused (exit 2) when it is, contains, or is inside a live
output or checkpoint directory. A replay is restartable like a run: its
checkpoints live in ``DIR/ckpt`` and running the same command again resumes
(or, when finished, changes nothing). ``DIR/REPLAY.json`` records the origin; a
destination that holds a replay from another origin or another definition is
refused (use a new directory).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from sealstream._runtime.engine import Job, ProgressFn, RunSummary, StartPoint
from sealstream._runtime.merge import SourcePosition
from sealstream.archive import ArchiveSettings
from sealstream.checkpoint import guard
from sealstream.checkpoint.manifest import checkpoint_key
from sealstream.errors import CheckpointError, SpecError
from sealstream.pipeline import Checkpoints, Output, Pipeline
from sealstream.pipeline.kafka import KafkaSourceSpec
from sealstream.sources._base import PartitionPosition
from sealstream.state import incremental
from sealstream.state.codec import WATERMARK_META

MARKER = "REPLAY.json"
SUBDIRS = {"sink": "out", "late": "late", "errors": "errors", "checkpoint": "ckpt"}
PARTIAL_NOTE = (
    "started at explicit offsets with empty window state: windows spanning the start are "
    "partial (they miss the events before it), and lateness is judged against a watermark "
    "that starts afresh"
)


def live_directories(p: Pipeline) -> dict[str, Path]:
    """The live output and checkpoint directories of ``p`` (resolved); for a SQLite
    database (a results table or the checkpoint store), its file. A PostgreSQL
    database or an S3 prefix is no place on disk: the replay never writes to it."""
    from sealstream.checkpoint.stores import is_postgres, is_s3, sqlite_path

    out: dict[str, Path] = {}
    for section, o in (("sink", p.sink), ("late", p.late), ("errors", p.errors)):
        if o is None or o.kind in ("stdout", "postgresql") or is_s3(o.path or ""):
            continue
        if o.kind == "sqlite":
            assert o.url is not None
            out[section] = sqlite_path(o.url, o.base_dir).resolve()
        else:
            out[section] = o.resolved.resolve()
    if p.checkpoint is not None:
        if p.checkpoint.url:
            if not is_postgres(p.checkpoint.url) and not is_s3(p.checkpoint.url):
                # the database file: a destination containing it is refused
                out["checkpoint"] = sqlite_path(p.checkpoint.url,
                                                p.checkpoint.base_dir).resolve()
        else:
            out["checkpoint"] = p.checkpoint.resolved.resolve()
    return out


def check_destination(p: Pipeline, dest: Path) -> Path:
    """``dest`` resolved; SpecError (exit 2) when it overlaps a live directory."""
    d = dest.resolve()
    for section, live in live_directories(p).items():
        if d == live:
            rel = "is"
        elif live.is_relative_to(d):
            rel = "contains"
        elif d.is_relative_to(live):
            rel = "is inside"
        else:
            continue
        raise SpecError(
            f"--to {dest}: the replay destination {rel} the live {section} directory {live}; "
            "choose a separate directory so live output and checkpoints stay untouched"
        )
    for _, path in p.source.partitions(allow_empty=p.source.live):
        if path.resolve().is_relative_to(d):
            raise SpecError(
                f"--to {dest}: the replay destination contains the input file {path}; "
                "choose a separate directory"
            )
    return d


def _redirect(out: Output | None, dest: Path, sub: str) -> Output | None:
    """``out`` moved under ``dest``; a database table becomes JSONL files there (the
    live table is never written)."""
    if out is None or out.kind == "stdout":
        return out
    if out.kind in ("sqlite", "postgresql"):
        return Output(kind="jsonl", path=str(dest / sub), base_dir=dest)
    return replace(out, path=str(dest / sub), base_dir=dest, endpoint_url=None)


def replay_pipeline(p: Pipeline, dest: Path) -> Pipeline:
    """A copy of ``p`` whose outputs and checkpoints all live under ``dest``."""
    sink = _redirect(p.sink, dest, SUBDIRS["sink"])
    assert sink is not None
    live = p.checkpoint
    ckpt = Checkpoints(
        path=str(dest / SUBDIRS["checkpoint"]),
        every_events=live.every_events if live else None,
        every_ms=live.every_ms if live else None,
        keep=live.keep if live else 3,
        base_dir=dest,
    )
    # a live source is replayed as a backfill: to the end positions seen at start
    source = replace(p.source, stop="end") if p.source.live else p.source
    if isinstance(source, KafkaSourceSpec):  # isolated: the job's group is not told
        source = replace(source, group="")
    return replace(
        p,
        source=source,
        sink=sink,
        late=_redirect(p.late, dest, SUBDIRS["late"]),
        errors=_redirect(p.errors, dest, SUBDIRS["errors"]),
        checkpoint=ckpt,
    )


# --------------------------------------------------------------------------- origins
def parse_offsets(text: str, names: list[str]) -> dict[int, int]:
    """``"p0=10,in/p1.jsonl=20"`` -> ``{partition index: offset}``."""
    out: dict[int, int] = {}
    for part in filter(None, (x.strip() for x in text.split(","))):
        name, eq, value = part.rpartition("=")
        if not eq or not name:
            raise SpecError(f"--from {text!r}: expected PARTITION=OFFSET, got {part!r}")
        if name in names:
            q = names.index(name)
        elif name.startswith("p") and name[1:].isdigit() and int(name[1:]) < len(names):
            q = int(name[1:])
        else:
            raise SpecError(
                f"--from {text!r}: unknown partition {name!r}; partitions are "
                + ", ".join(f"p{i}={n!r}" for i, n in enumerate(names))
            )
        if not value.isdigit():
            raise SpecError(f"--from {text!r}: offset of {name!r} must be an integer >= 0, "
                            f"got {value!r}")
        if q in out:
            raise SpecError(f"--from {text!r}: partition {names[q]!r} is given twice")
        out[q] = int(value)
    if not out:
        raise SpecError(f"--from {text!r}: no partition offset given")
    return out


def live_partitions(p: Pipeline) -> list[str]:
    """The partitions a live source lists now (a broker is asked; files are listed)."""
    source: Any
    if p.source.kind == "sources":  # several sources, one of them live (docs/joins.md)
        from sealstream.windows.join_live import open_union

        source = open_union(p, {})
    elif p.source.kind not in ("kafka", "nats"):
        return [n for n, _ in p.source.partitions(allow_empty=True)]
    else:
        source = p.source.open_live(p.field_plan())
    try:
        return list(source.discover())
    finally:
        source.close()


def start_from_offsets(p: Pipeline, text: str) -> StartPoint:
    if p.source.live:
        # only the named partitions get a position: the others open where `start`
        # says (a position 0 would be judged as a saved one against expiry)
        listed = live_partitions(p)
        given = parse_offsets(text, listed)
        named = tuple(listed[q] for q in sorted(given))
        desc = ", ".join(f"{listed[q]}={off}" for q, off in sorted(given.items()))
        return StartPoint(
            tuple(SourcePosition(PartitionPosition(offset=given[q]), given[q])
                  for q in sorted(given)),
            description=f"offsets {desc}", names=named,
        )
    names = [n for n, _ in p.source.partitions()]
    offsets = parse_offsets(text, names)
    positions = tuple(
        SourcePosition(PartitionPosition(), offsets.get(q, 0)) for q in range(len(names))
    )
    desc = ", ".join(f"{names[q]}={off}" for q, off in sorted(offsets.items()))
    return StartPoint(positions, description=f"offsets {desc}")


def start_from_checkpoint(p: Pipeline, cid: int) -> tuple[StartPoint, dict[str, Any]]:
    """The state, watermark and positions of live checkpoint ``cid``, read only."""
    if p.checkpoint is None:
        raise SpecError(f"--from {cid}: the spec has no [checkpoint] section to replay from")
    store = p.checkpoint.open_store(p.name)
    ids = store.ids()
    if cid not in ids:
        have = ", ".join(map(str, ids)) or "none"
        raise SpecError(
            f"--from {cid}: no checkpoint {cid} in {store.location} (present: {have})"
        )
    max_age_s = p.checkpoint.max_age_s  # freshness: --max-age or [checkpoint] max_age_s
    policy = guard.Policy(
        key=checkpoint_key(), pipeline=p.name, fingerprint=p.fingerprint(),
        max_age_ms=None if max_age_s is None else round(max_age_s * 1000),
        now_ms=None if max_age_s is None else int(time.time() * 1000),
        require_receipt_roots=p.checkpoint.require_receipts,
    )
    v = guard.judge(store.evidence(cid, policy.key), store.verified_parent(cid, policy.key), policy)
    if not v.ok or v.manifest is None:
        hint = ("replay with the definition that wrote it, or use --from start"
                if v.reason in ("FINGERPRINT_MISMATCH", "OTHER_PIPELINE")
                else "choose an ATOMIC checkpoint, 'start', or explicit offsets")
        raise CheckpointError(
            f"--from {cid}: checkpoint {cid} in {store.location} is {v.verdict} ({v.reason}): "
            f"{v.message}; {hint}"
        )
    doc = dict(v.manifest)
    try:  # the snapshot, or the base snapshot and deltas of an incremental checkpoint
        state, meta = incremental.load_chain(doc["files"], store.read)
    except OSError as exc:
        raise CheckpointError(
            f"--from {cid}: cannot read a state file of checkpoint {cid} in {store.location} "
            f"({exc.strerror or exc}); "
            "was it deleted by retention meanwhile? choose a newer checkpoint"
        ) from None
    except ValueError as exc:
        raise CheckpointError(
            f"--from {cid}: {exc} (changed while it was read: retention by a running "
            "job?); choose a newer checkpoint"
        ) from None
    by_name = {d["partition"]: SourcePosition.from_json(d) for d in doc["positions"]}
    wm = meta[WATERMARK_META.decode()]
    if p.source.live:  # the checkpoint's partitions, in its order (the watermark's)
        live_names = tuple(d["partition"] for d in doc["positions"])
        return StartPoint(tuple(by_name[n] for n in live_names), state, wm,
                          description=f"checkpoint {cid}", names=live_names), doc
    names = [n for n, _ in p.source.partitions()]
    positions = tuple(by_name.get(n, SourcePosition.start()) for n in names)
    return StartPoint(positions, state, wm, description=f"checkpoint {cid}"), doc


def resolve_origin(p: Pipeline, text: str) -> StartPoint | None:
    """None for ``start``; a :class:`StartPoint` for an id or offsets."""
    t = text.strip()
    if t == "start":
        return None
    if t.isdigit():
        return start_from_checkpoint(p, int(t))[0]
    if "=" in t:
        return start_from_offsets(p, t)
    raise SpecError(
        f"--from {text!r}: expected a checkpoint id, 'start', or PARTITION=OFFSET,... "
        "(e.g. p0=100,p1=250)"
    )


def replay_archive(p: Pipeline, origin: str) -> ArchiveSettings:
    """The live job's ``[archive]`` for a replay from ``origin``: never written nor
    pruned; from a checkpoint id, the live job's step plans recorded after it (they
    bind the segments) let the replay read what the broker no longer holds."""
    assert p.archive is not None
    anchor = None
    if origin.isdigit() and p.checkpoint is not None:
        anchor = start_from_checkpoint(p, int(origin))[1].get("plan")
    ckpt = p.checkpoint
    return replace(p.archive, read_only=True, anchor=anchor,
                   live_store=None if ckpt is None else lambda: ckpt.open_store(p.name))


def _claim(dest: Path, p: Pipeline, origin: str) -> None:
    """Record the replay's origin in ``dest``; refuse a destination of another replay."""
    marker = dest / MARKER
    want = {"origin": origin, "pipeline": p.name, "fingerprint": p.fingerprint()}
    if marker.exists():
        try:
            have = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            have = None
        if have != want:
            raise SpecError(
                f"--to {dest}: it already holds a replay from another origin or definition "
                f"({have}); choose a new directory"
            )
        return
    leftovers = [e.name for e in dest.iterdir()] if dest.is_dir() else []
    if leftovers:
        raise SpecError(
            f"--to {dest}: the directory is not empty and holds no replay; choose a new or "
            "empty directory"
        )
    dest.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(want, indent=1) + "\n", encoding="utf-8")


def replay(
    p: Pipeline, origin: str, dest: Path, *, progress: ProgressFn | None = None
) -> RunSummary:
    """Run ``p`` from ``origin`` into the isolated destination ``dest``."""
    d = check_destination(p, dest)
    start = resolve_origin(p, origin)
    iso = replay_pipeline(p, d)
    if p.archive is not None:  # read only (the live job's), through its recorded plans
        iso = replace(iso, archive=replay_archive(p, origin.strip()))
    _claim(d, p, origin.strip())
    job = Job(iso, start=start, progress=progress)
    summary = job.run()
    notes: list[str] = []
    partial = start is not None and start.state is None and start.watermark is None
    if partial:
        notes.append(PARTIAL_NOTE)
    summary.replay = {
        "from": start.description if start is not None else "start",
        "to": str(d),
        "outputs": {
            sec: str(o.resolved)
            for sec, o in (("sink", iso.sink), ("late", iso.late), ("errors", iso.errors))
            if o is not None and o.kind != "stdout"
        },
        "checkpoints": str(iso.checkpoint.resolved) if iso.checkpoint else None,
        "partial_windows": partial,
        "notes": notes,
    }
    return summary
