"""``sealstream checkpoints prune``: apply a :class:`~sealstream.inspect.PrunePlan`.

Safety rules (see :func:`sealstream.inspect.plan_prune` for what is planned):

Works on every store (a directory, SQLite, PostgreSQL); in a database a deletion or
a move aside is one transaction.

* When no job holds the directory, prune takes the directory lock itself for its whole
  duration, so a job cannot start in the middle.
* When a job holds it, prune still runs but never touches the newest ATOMIC checkpoint
  nor anything newer, and tolerates checkpoints that the job's own retention deletes or
  moves aside concurrently (reported as ``vanished``).
* A checkpoint is deleted by first renaming its directory to a hidden name in the same
  directory (atomic), then removing it: a prune that stops half-way never leaves a
  half-deleted checkpoint under its own name. Leftover hidden directories are removed
  by the next prune that holds the lock.
* Non-ATOMIC checkpoints are moved under ``rejected/`` (evidence), never deleted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

from sealstream.checkpoint.stores import (
    REJECTED,
    CheckpointStore,
    LocalCheckpointStore,
    checkpoint_dirname,
)
from sealstream.errors import CheckpointError, LockHeldError
from sealstream.inspect import PrunePlan, plan_prune
from sealstream.sinks._files import fsync_dir, os_reason

HIDDEN = ".pruning-"


def prune(store: CheckpointStore, keep: int, *, dry_run: bool) -> dict[str, Any]:
    """Prune ``store`` to ``keep`` ATOMIC checkpoints; return what was (or would be) done."""
    if dry_run:
        running = store.is_locked()
        plan = plan_prune(store, keep, job_running=running is not None)
        return _report(store, plan, keep, dry_run=True, holder=running)
    with contextlib.ExitStack() as stack:
        holder: str | None = None
        try:
            stack.enter_context(store.locked())
        except LockHeldError:
            holder = store.is_locked() or "another run"
        if holder is None:
            _clear_leftovers(store)
        plan = plan_prune(store, keep, job_running=holder is not None)
        return _apply(store, plan, keep, holder)
    raise AssertionError("unreachable")  # pragma: no cover


def _clear_leftovers(store: CheckpointStore) -> None:
    store.clear_trash()
    if isinstance(store, LocalCheckpointStore):
        for entry in store.root.iterdir():
            if entry.name.startswith(HIDDEN) and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)


def _report(store: CheckpointStore, plan: PrunePlan, keep: int, *, dry_run: bool,
            holder: str | None) -> dict[str, Any]:
    return {
        "directory": store.location,
        "keep": keep,
        "dry_run": dry_run,
        "job_running": holder,
        "newest_atomic": plan.newest_atomic,
        "kept": sorted(plan.keep),
        "deleted": sorted(plan.delete),
        "moved": [{"id": cid, "verdict": v, "reason": r, "to": None}
                  for cid, v, r in sorted(plan.move)],
        "untouched": [{"id": cid, "why": why} for cid, why in sorted(plan.untouched)],
        "vanished": [],
    }


def _apply(store: CheckpointStore, plan: PrunePlan, keep: int,
           holder: str | None) -> dict[str, Any]:
    out = _report(store, plan, keep, dry_run=False, holder=holder)
    vanished: list[int] = []
    deleted: list[int] = []
    for cid in sorted(plan.delete):
        if _delete(store, cid):
            deleted.append(cid)
        else:
            vanished.append(cid)
    moved: list[dict[str, Any]] = []
    for cid, verdict, reason in sorted(plan.move):
        try:
            dest = store.move_aside(cid, reason)
        except OSError as exc:
            raise CheckpointError(
                f"cannot move checkpoint {cid} to {store.root / REJECTED}: {os_reason(exc)}"
            ) from None
        if dest is None:
            vanished.append(cid)  # the job's retention moved or deleted it first
            continue
        to = str(dest.relative_to(store.root)) if isinstance(dest, Path) else str(dest)
        moved.append({"id": cid, "verdict": verdict, "reason": reason, "to": to})
    out.update(deleted=deleted, moved=moved, vanished=sorted(vanished))
    return out


def _delete(store: CheckpointStore, cid: int) -> bool:
    """Remove checkpoint ``cid``; False when it was already gone."""
    if not isinstance(store, LocalCheckpointStore):
        if cid not in store.ids():
            return False
        store.delete(cid)  # one transaction
        return True
    src = store.path_of(cid)
    hidden = store.root / f"{HIDDEN}{checkpoint_dirname(cid)}-{os.getpid()}"
    try:
        os.rename(src, hidden)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise CheckpointError(f"cannot delete checkpoint {cid}: {os_reason(exc)}") from None
    fsync_dir(store.root)
    try:
        shutil.rmtree(hidden)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise CheckpointError(
            f"checkpoint {cid} was retired to {hidden.name} but cannot be removed: "
            f"{os_reason(exc)}"
        ) from None
    return True
