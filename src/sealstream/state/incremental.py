"""Incremental checkpoints: a full window-state snapshot now and then, and in
between a *delta* per checkpoint holding only the keys whose windows changed.

Why by key: a key's open windows change only when an event of that key arrives,
except that the watermark can remove (fire) them. So between two checkpoints the
changed keys are

* the keys of the events processed since the previous checkpoint (tracked
  column-wise per batch, :func:`batch_keys`), and
* among the other keys, those that lost windows: found by comparing per-key row
  counts, only when the untouched part of the state shrank at all.

A delta (:func:`encode_delta`) is an Arrow IPC table with the state's schema plus
a ``__tombstone`` column: every current row of every changed key, and one
tombstone row (nulls but the key) for a changed key that has no window left.
Applying it (:func:`apply_delta`) drops every row of the delta's keys from the
state and adds the delta's rows: exact, whatever the window kind.

A checkpoint's manifest names its delta as its ``state`` file (it carries the
watermark like a snapshot does) and every file of its chain: ``base`` (the last
full snapshot, in an earlier checkpoint's directory) and ``delta:<id>`` for each
delta in between. The guard checks all of them like any file of the checkpoint
(missing: partial; altered: inconsistent), so a checkpoint whose chain is broken
is never restored; retention keeps the checkpoints a kept checkpoint depends on.
:func:`load_chain` materialises the state from the chain.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import polars as pl

from sealstream.sources._base import KEY, KEY_IS_INT
from sealstream.state.codec import decode_table, encode_table, sha256_hex

TOMBSTONE = "__tombstone"
KEYS = [KEY, KEY_IS_INT]
#: manifest ``state.incremental`` fields
BASE_ROLE = "base"
DELTA_ROLE = "delta:"
#: the parts of a state split by key (one per worker of a distributed run)
PART_ROLE = "part:"


def key_ordered(state: pl.DataFrame) -> pl.DataFrame:
    """The state rows in key order, as a checkpoint stores them: the file compresses
    better (neighbouring keys share prefixes) and holds the same bytes whatever the
    processing history."""
    return state.sort([*KEYS, "window_start", "window_end"])


def batch_keys(events: pl.DataFrame) -> pl.DataFrame:
    """The distinct ``(key, key-is-int)`` pairs of a batch of events."""
    return events.select(KEYS).unique()


def changed_keys(prev: pl.DataFrame, cur: pl.DataFrame, touched: pl.DataFrame
                 ) -> pl.DataFrame:
    """The keys whose rows may differ between state ``prev`` and ``cur``, given the
    keys ``touched`` by events in between: those, plus untouched keys that lost rows."""
    touched = touched.select(KEYS).unique()
    prev_u = prev.select(KEYS).join(touched, on=KEYS, how="anti")
    cur_u = cur.select(KEYS).join(touched, on=KEYS, how="anti")
    if prev_u.height == cur_u.height:
        return touched  # untouched keys can only lose rows: none did
    before = prev_u.group_by(KEYS).len("n_prev")
    after = cur_u.group_by(KEYS).len("n_cur")
    lost = (before.join(after, on=KEYS, how="left")
            .filter(pl.col("n_cur").is_null() | (pl.col("n_cur") != pl.col("n_prev")))
            .select(KEYS))
    return pl.concat([touched, lost]).unique()


def delta_frame(cur: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """The rows of ``cur`` for ``keys``, plus a tombstone for each key without rows."""
    rows = cur.join(keys, on=KEYS, how="semi").with_columns(
        pl.lit(False).alias(TOMBSTONE))
    gone = keys.join(rows.select(KEYS), on=KEYS, how="anti")
    tombs = gone.with_columns(pl.lit(True).alias(TOMBSTONE))
    return pl.concat([rows, tombs], how="diagonal_relaxed").select(
        [*cur.columns, TOMBSTONE])


def encode_delta(cur: pl.DataFrame, keys: pl.DataFrame, metadata: Mapping[str, Any]) -> bytes:
    return encode_table(delta_frame(cur, keys), dict(metadata))


def apply_delta(state: pl.DataFrame, delta: pl.DataFrame) -> pl.DataFrame:
    """``state`` with every row of the delta's keys replaced by the delta's rows."""
    if TOMBSTONE not in delta.columns:
        raise ValueError(f"a state delta has a {TOMBSTONE!r} column")
    keys = delta.select(KEYS).unique()
    kept = state.join(keys, on=KEYS, how="anti")
    added = delta.filter(~pl.col(TOMBSTONE)).drop(TOMBSTONE)
    if list(added.columns) != list(state.columns):
        raise ValueError(f"state delta columns {added.columns} do not match {state.columns}")
    return pl.concat([kept, added.cast(state.schema)])


def chain_roles(files: Mapping[str, Any]) -> tuple[str | None, list[str]]:
    """The base role and the intermediate delta roles (oldest first) of a manifest's
    ``files``; (None, []) for a full snapshot."""
    if BASE_ROLE not in files:
        return None, []
    deltas = sorted((r for r in files if r.startswith(DELTA_ROLE)),
                    key=lambda r: int(r[len(DELTA_ROLE):]))
    return BASE_ROLE, deltas


def part_roles(files: Mapping[str, Any]) -> list[str]:
    """The roles of the state's parts in a manifest's ``files``, in order."""
    return sorted((r for r in files if r.startswith(PART_ROLE)),
                  key=lambda r: int(r[len(PART_ROLE):]))


def concat_parts(head: pl.DataFrame, parts: list[pl.DataFrame]) -> pl.DataFrame:
    """The whole state: the ``state`` file's rows (none when there are parts) and
    every part's; the parts must have its columns."""
    for part in parts:
        if list(part.columns) != list(head.columns):
            raise ValueError(f"state part columns {part.columns} do not match {head.columns}")
    return pl.concat([head, *(p.cast(head.schema) for p in parts)], how="vertical")


def load_chain(files: Mapping[str, Any], read: Callable[[str], bytes]
               ) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Materialise the window state a manifest's ``files`` describe: the snapshot, or
    the base snapshot with every delta applied in order. Each file's SHA-256 must
    match its manifest entry (ValueError otherwise); ``read(path)`` gives the
    plaintext. Returns the state and the metadata of the checkpoint's own file."""
    def verified(role: str) -> bytes:
        entry = files[role]
        data = read(str(entry["path"]))
        if sha256_hex(data) != entry.get("sha256"):
            raise ValueError(f"{entry['path']} does not match its SHA-256 in the manifest")
        return data

    own, meta = decode_table(verified("state"))
    parts = part_roles(files)
    if parts:
        own = concat_parts(own, [decode_table(verified(r))[0] for r in parts])
    base, deltas = chain_roles(files)
    if base is None:
        return own, meta
    state, _ = decode_table(verified(base))
    for role in deltas:
        delta, _ = decode_table(verified(role))
        state = apply_delta(state, delta)
    return apply_delta(state, own), meta
