"""The refusal to resume state written by a different pipeline definition."""

from __future__ import annotations

from typing import Any

from sealstream.errors import NoValidCheckpointError
from sealstream.pipeline import ABSENT, Pipeline, definition_changes, definition_diff


class DefinitionMismatchError(NoValidCheckpointError):
    """The newest checkpoints were written by a different pipeline definition.

    ``changes`` lists ``"setting: old -> new"`` lines (checkpoint -> spec).
    """

    def __init__(self, message: str, checkpoint_id: int, changes: list[str]) -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id
        self.changes = changes


def definition_mismatch(
    root: object, cid: int, recorded: Any, pipeline: Pipeline
) -> DefinitionMismatchError:
    """The refusal for checkpoint ``cid`` whose manifest recorded ``recorded``
    (its ``definition``; None when absent) for a job running ``pipeline``."""
    new = pipeline.fingerprint_fields()
    if isinstance(recorded, dict):
        changes = definition_diff(recorded, new)
        added = [
            k.split(".", 1)[1]
            for k, old, _ in definition_changes(recorded, new)
            if k.startswith("aggregates.") and old is ABSENT
        ]
    else:
        changes = ["(the checkpoint does not record its definition; only its fingerprint "
                   "differs)"]
        added = []
    lines = [
        f"{root}: checkpoint {cid} was written by a different pipeline definition; its saved "
        "state does not fit this spec. Changed (checkpoint -> spec):",
        *(f"  {c}" for c in changes),
    ]
    if added:
        lines.append(
            f"Added aggregate(s) {', '.join(repr(a) for a in added)}: windows already open "
            "have not kept them for the events they have seen, so resuming would emit wrong "
            "values; they cannot be added to saved state."
        )
    lines += [
        "Nothing was deleted. Ways forward:",
        "  - recompute with the new definition into a new destination: "
        "sealstream replay SPEC --from start --to NEW_DIR",
        "  - or start over explicitly: sealstream run SPEC --start-over (moves the "
        "checkpoints aside; output already committed is not repeated, so point the outputs "
        "at new directories to get results of the new definition only)",
    ]
    return DefinitionMismatchError("\n".join(lines), cid, changes)


class TableChangedError(NoValidCheckpointError):
    """An ``[[enrich]]`` table is not the version the checkpoint to resume joined."""


def table_mismatch(root: object, cid: int, changes: list[str]) -> TableChangedError:
    """The one-line refusal to resume checkpoint ``cid`` of a job whose reference
    tables changed (``changes``: one description per table; docs/enrich.md)."""
    return TableChangedError(
        f"{root}: checkpoint {cid} joined other versions of the reference tables "
        f"({'; '.join(changes)}); resuming would join the rest of the input with other "
        "values than the run that wrote it. Nothing was deleted. Restore the table to "
        "resume exactly, or run with --accept-table-change (later events join the table "
        "as it is now), or --start-over")
