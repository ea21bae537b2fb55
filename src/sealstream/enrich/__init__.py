"""Enrichment: ``[[enrich]]`` reference tables joined to each event, before the
windows, as of the event's time (a temporal join, docs/enrich.md).

The pieces:

* :class:`Enrich` (``_settings``): the plain settings of one table;
* :func:`load_table` (``_tables``, ``_changelog``): a table read whole, columnar,
  with its version (a content hash; a changelog topic's positions too);
* :class:`EnrichStage` (``_join``): the join of a batch of events with every
  table, a Polars ``join_asof`` by key on the event time.

A checkpoint records each table's version (:func:`versions`); a resumed run
compares them with what it loads (:func:`changed_tables`) and refuses a table
that changed, unless told to accept it.
"""

from __future__ import annotations

from typing import Any

from sealstream.enrich._join import EKEEP, EnrichStage
from sealstream.enrich._settings import KINDS, Enrich, enrich_from_dict
from sealstream.enrich._tables import Table, load_table, snapshot_hash
from sealstream.sources._base import FieldPlan

MANIFEST_FIELD = "enrich"
"""The manifest's entry: table name -> the version the checkpoint's epochs joined."""


def open_stage(settings: tuple[Enrich, ...], plan: FieldPlan,
               pinned: dict[str, Any] | None = None) -> EnrichStage:
    """Load every table and build the stage over ``plan`` (the fields the transform
    and the windows read). ``pinned``: a changelog table's positions to read up to
    (a resumed run re-reads the version its checkpoint bound)."""
    tables = []
    for e in settings:
        if e.kind == "kafka":
            from sealstream.enrich._changelog import load_changelog

            # the checkpoint's entry is signed, but its shape is checked before use
            entry = pinned.get(e.name) if isinstance(pinned, dict) else None
            pos = entry.get("positions") if isinstance(entry, dict) else None
            tables.append(load_changelog(e, pos if isinstance(pos, dict) else None))
        else:
            tables.append(load_table(e))
    stage = EnrichStage(tables, plan, plan.derived_key, plan.derived_time)
    stage.versions = {t.settings.name: t.version for t in tables}
    return stage


def changed_tables(recorded: object, current: dict[str, Any]) -> list[str]:
    """One readable line per table whose version differs from ``recorded`` (a
    checkpoint's ``enrich`` entry; absent or malformed: every table differs)."""
    rec = recorded if isinstance(recorded, dict) else {}
    out = []
    for name, now in current.items():
        then = rec.get(name)
        if not isinstance(then, dict) or then.get("sha256") != now.get("sha256"):
            was = str(then.get("sha256", "?"))[:12] if isinstance(then, dict) else "(none)"
            out.append(f"table {name!r}: version {was} at the checkpoint, "
                       f"{str(now.get('sha256'))[:12]} now")
    return out


__all__ = [
    "EKEEP",
    "Enrich",
    "EnrichStage",
    "KINDS",
    "MANIFEST_FIELD",
    "Table",
    "changed_tables",
    "enrich_from_dict",
    "load_table",
    "open_stage",
    "snapshot_hash",
]
