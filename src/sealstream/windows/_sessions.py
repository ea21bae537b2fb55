"""Session windows: merge a batch into the open sessions, on columns.

Moved out of :mod:`sealstream.windows.operator` (its ``_sessions`` method calls
:func:`session_step`). Sessions are merged per key in arrival order with
Flink's rules. The step computes sessions column-wise and checks, per merged
group, that the arrival order could not have changed the outcome (every event
touched the group's earlier span while it was still open). Groups that fail
the check — rare: late or very out-of-order events around a session that
fired — are replayed by :func:`_sequential_sessions`, a literal transcription
of the rules, over that group's rows only.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from sealstream.sources._base import KEY, KEY_IS_INT, TIME
from sealstream.watermark import WATERMARK
from sealstream.windows.aggregates import (
    SEQ,
    WEND,
    WSTART,
    Accumulators,
    stable_argsort,
)

LABEL = "__label"


def session_step(
    state: pl.DataFrame, events: pl.DataFrame, gap: int, lat: int,
    acc: Accumulators, schema: dict[str, pl.DataType],
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Merge a batch (in read order) into the open sessions ``state``: the new
    state and the batch's late events."""
    if not events.height:
        return state, events
    ev = events.with_row_index("__row")
    keys = ev.select(KEY, KEY_IS_INT).unique()
    in_batch = state.join(keys, on=[KEY, KEY_IS_INT], how="semi")
    untouched = state.join(keys, on=[KEY, KEY_IS_INT], how="anti")
    st = in_batch.with_row_index("__row")
    rows = _session_groups(ev, st, gap, lat)
    bad = rows.filter(~pl.col("__gok"))
    rows = rows.with_columns(pl.col("__g").alias(LABEL), pl.lit(False).alias("__late"))
    if bad.height:
        fast = rows.filter(pl.col("__gok"))
        slow = rows.filter(~pl.col("__gok"))
        base = int(rows.select(pl.col("__g").max()).item() or 0) + 1
        rows = pl.concat([fast, _sequential_sessions(slow, gap, lat, base)], how="vertical")
        # put rows back in row-number order (events 0..n-1, then state 0..m-1),
        # where they already are without replayed groups: one gather, no sort
        at = rows["__row"].to_numpy().astype(np.int64) + np.where(
            rows["__st"].to_numpy(), ev.height, 0
        )
        back = np.empty(at.size, np.int64)
        back[at] = np.arange(at.size)
        rows = rows[back]
    rows = rows.drop("__gok")

    n_ev = ev.height
    ev = ev.with_columns(rows[LABEL][:n_ev], rows["__late"][:n_ev])
    st_labels = rows[LABEL][n_ev:]
    late = ev.filter(pl.col("__late")).drop("__row", LABEL, "__late")
    needed = [LABEL, KEY, KEY_IS_INT, TIME, SEQ, *acc.input_columns()]
    live = ev.lazy().filter(~pl.col("__late")).select(needed)
    if acc.needs_order():
        live = live.sort([TIME, SEQ])
    partial = live.group_by(LABEL).agg(
        pl.col(KEY).first(),
        pl.col(KEY_IS_INT).first(),
        pl.col(TIME).min().alias(WSTART),
        (pl.col(TIME).max() + gap).alias(WEND),
        *acc.partial(),
    ).collect()
    labelled_state = st.drop("__row").with_columns(st_labels)
    cols = [LABEL, *schema]
    both = pl.concat(
        [
            labelled_state.select(cols),
            partial.select(cols).cast(schema),  # type: ignore[arg-type]
        ],
        how="vertical",
    )
    merged = both.group_by(LABEL).agg(
        pl.col(KEY).first(),
        pl.col(KEY_IS_INT).first(),
        pl.col(WSTART).min(),
        pl.col(WEND).max(),
        *acc.combine(),
    )
    state = pl.concat(
        [untouched, merged.select(list(schema))], how="vertical"
    )
    return state, late


def _segmented_running(values: np.ndarray, starts: np.ndarray, fn: str) -> np.ndarray:
    """For each element, the running max (or min) of the *earlier* elements of
    its segment; segments begin where ``starts`` is True. The value at a
    segment's first element is meaningless: callers mask it.

    Computed with one global accumulate by lifting each segment above the
    previous ones, so it is a handful of vector operations.
    """
    seg = np.cumsum(starts) - 1
    if fn == "min":
        values = -values
    lo = int(values.min())
    span = int(values.max()) - lo + 1
    if span * (int(seg[-1]) + 1) < 2**62:
        lifted = (values - lo) + seg * span
        run = np.maximum.accumulate(lifted) - seg * span + lo
    else:  # would overflow: fall back to per-segment accumulation
        run = np.empty_like(values)
        bounds = np.flatnonzero(starts).tolist() + [values.size]
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            run[a:b] = np.maximum.accumulate(values[a:b])
    prev = np.empty_like(run)
    prev[1:] = run[:-1]
    prev[0] = 0
    out: np.ndarray = -prev if fn == "min" else prev
    return out


def _order_by(major: np.ndarray, minor: np.ndarray) -> np.ndarray:
    """Stable permutation sorting by (major, minor) int64 columns."""
    lo = int(minor.min())
    span = int(minor.max()) - lo + 1
    top = int(major.max()) + 1
    if int(major.min()) >= 0 and span * top < 2**62:
        return stable_argsort(major * span + (minor - lo))
    return np.lexsort((minor, major))


def _regroup_by_arrival(
    order: np.ndarray, g_sorted: np.ndarray, g: np.ndarray, seq: np.ndarray
) -> np.ndarray:
    """The stable permutation sorting by ``(group, seq)``, reusing ``order``.

    ``order`` lists each group's rows contiguously, groups ascending (``g_sorted``
    is the group along ``order``, ``g`` each row's group). In most groups the
    rows are already in arrival order there (``seq`` strictly increasing): those
    blocks are kept as they are and only the rows of the other groups are
    sorted, by ``(group, seq)``, back into their own positions. Equal to
    ``_order_by(g, seq)``: ties in ``seq`` (state rows) never count as ordered,
    so those groups get the stable sort, from the original row order.
    """
    so = seq[order]
    first = np.ones(order.size, bool)
    first[1:] = g_sorted[1:] != g_sorted[:-1]
    inversion = ~first
    inversion[1:] &= so[1:] <= so[:-1]
    inversion[0] = False
    if not inversion.any():
        return order
    bad = np.zeros(int(g_sorted[-1]) + 1, bool)
    bad[g_sorted[inversion]] = True
    pos = np.flatnonzero(bad[g_sorted])
    sub = np.sort(order[pos])  # original row order, so that ties keep it
    out = order.copy()
    out[pos] = sub[_order_by(g[sub], seq[sub])]
    return out


def _session_groups(ev: pl.DataFrame, st: pl.DataFrame, gap: int, lat: int) -> pl.DataFrame:
    """Merge events and the key's open sessions into groups of touching intervals,
    and flag the groups whose outcome could depend on the arrival order.

    Returns one row per event (``__st`` False) and per state session (True)
    with ``__row``, group ``__g`` and ``__gok`` (the column-wise merge equals
    Flink's sequential rules for this group).
    """
    both = pl.concat(
        [ev.select(KEY, KEY_IS_INT), st.select(KEY, KEY_IS_INT)], how="vertical"
    )
    code = both.select(
        pl.col(KEY).cast(pl.Categorical).to_physical().cast(pl.Int64) * 2
        + pl.col(KEY_IS_INT).cast(pl.Int64)
    ).to_series().to_numpy()
    n_ev = ev.height
    t = ev[TIME].to_numpy()
    s = np.concatenate([t, st[WSTART].to_numpy()])
    e = np.concatenate([t + gap, st[WEND].to_numpy()])
    seq = np.concatenate([ev[SEQ].to_numpy(), np.full(st.height, -1, dtype=np.int64)])
    wm = np.concatenate([ev[WATERMARK].to_numpy(), np.zeros(st.height, dtype=np.int64)])
    is_state = np.concatenate([np.zeros(n_ev, bool), np.ones(st.height, bool)])
    row = np.concatenate([np.arange(n_ev), np.arange(st.height)])

    # 1. connected components of touching intervals per key (order-independent)
    order = _order_by(code, s)
    c, so, eo = code[order], s[order], e[order]
    key_start = np.ones(c.size, bool)
    key_start[1:] = c[1:] != c[:-1]
    prev_end = _segmented_running(eo, key_start, "max")
    new_group = key_start | (so > prev_end)
    g_sorted = np.cumsum(new_group) - 1
    g = np.empty_like(g_sorted)
    g[order] = g_sorted

    # 2. replay each group in arrival order: did every event touch the group's
    #    earlier span while that span was still open?
    order2 = _regroup_by_arrival(order, g_sorted, g, seq)
    g2, s2, e2, w2, st2 = g[order2], s[order2], e[order2], wm[order2], is_state[order2]
    first = np.ones(g2.size, bool)
    first[1:] = g2[1:] != g2[:-1]
    pmin = _segmented_running(s2, first, "min")
    pmax = _segmented_running(e2, first, "max")
    ok_first = (e2 + lat) > w2
    ok_later = (s2 <= pmax) & (e2 >= pmin) & (w2 < pmax + lat)
    ok = st2 | np.where(first, ok_first, ok_later)
    n_groups = int(g.max()) + 1
    bad = np.zeros(n_groups, bool)
    bad[g2[~ok]] = True
    bad |= np.bincount(g, weights=is_state, minlength=n_groups) > 1
    return pl.DataFrame(
        {
            "__row": row.astype(np.uint32),
            "__st": is_state,
            "__g": g.astype(np.int64),
            "__gok": ~bad[g],
            "__s": s,
            "__e": e,
            SEQ: seq,
            WATERMARK: wm,
        }
    )


def _sequential_sessions(rows: pl.DataFrame, gap: int, lat: int, base: int) -> pl.DataFrame:
    """Flink's session rules applied one row at a time, for groups that need it.

    ``rows`` holds, per group ``__g``, state sessions (``__st``) and events with
    their interval ``[__s, __e)``, sequence and watermark. Returns the rows with
    ``__label`` (session id, fresh from ``base``) and ``__late``.
    """
    labels: list[int] = []
    late: list[bool] = []
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    rows = rows.sort(["__g", SEQ])
    cur_group = None
    open_sessions: list[list[int]] = []  # [start, end, label]
    nxt = base
    for g, s, e, wm, is_state in rows.select(
        "__g", "__s", "__e", WATERMARK, "__st"
    ).iter_rows():
        if g != cur_group:
            cur_group, open_sessions = g, []
        if not is_state:
            open_sessions = [o for o in open_sessions if not (o[1] + lat <= wm)]
        touching = [] if is_state else [o for o in open_sessions if o[0] <= e and s <= o[1]]
        if not touching:
            if not is_state and e + lat <= wm:
                labels.append(-1)
                late.append(True)
                continue
            # a state session, or an event that opens a new session
            parent[nxt] = nxt
            open_sessions.append([s, e, nxt])
            labels.append(nxt)
            late.append(False)
            nxt += 1
            continue
        root = find(touching[0][2])
        lo, hi = min(s, *(o[0] for o in touching)), max(e, *(o[1] for o in touching))
        for o in touching[1:]:
            parent[find(o[2])] = root
        open_sessions = [o for o in open_sessions if o not in touching]
        open_sessions.append([lo, hi, root])
        labels.append(root)
        late.append(False)
    resolved = [find(x) if x >= 0 else -1 for x in labels]
    return rows.with_columns(
        pl.Series(LABEL, resolved, dtype=pl.Int64),
        pl.Series("__late", late, dtype=pl.Boolean),
    )
