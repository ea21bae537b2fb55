"""Session windows: merge a batch into the open sessions, on columns.

:class:`~sealstream.windows.operator.WindowOperator` calls :func:`session_step`.
Sessions are merged per key in arrival order with Flink's rules, in two paths:

* :func:`_arrival_sessions` (almost every key): one sort of the batch's events
  and the touched keys' open sessions by (key, arrival), a running max cuts each
  key's rows into sessions, and a check per row that this equals the rules
  (every row touched its session's span while it was open, and no earlier one).
* the keys that fail the check — late events, events before their key's latest
  session, sessions closed for an event that touches them — go through the
  general merge (:func:`_replayed_labels`): connected groups of touching
  intervals, an order check per group, and :func:`_sequential_sessions`, a
  literal transcription of the rules, over the groups that need it.

Then one group-by of the events by session label (the key text is attached
afterwards, from one row of each label) and one of the partials with the open
sessions they merge into.
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
    lex_order,
    stable_argsort,
)

LABEL = "__label"
RUNS_MAX = 64  # ascending runs of the sequence that a merge-based sort still takes fast


def session_step(
    state: pl.DataFrame, events: pl.DataFrame, gap: int, lat: int,
    acc: Accumulators, schema: dict[str, pl.DataType],
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Merge a batch (in read order) into the open sessions ``state``: the new
    state and the batch's late events."""
    if not events.height:
        return state, events
    m = state.height
    code = _key_codes(pl.concat([state.select(KEY, KEY_IS_INT),
                                 events.select(KEY, KEY_IS_INT)], how="vertical"))
    seen = np.zeros(int(code.max()) + 1, bool)
    seen[code[m:]] = True
    touched = seen[code[:m]]
    mask = pl.Series(touched)
    in_batch, untouched = state.filter(mask), state.filter(~mask)
    # the touched keys' open sessions, by key and start, then the events
    st_code = code[:m][touched]
    st_s = in_batch.get_column(WSTART).to_numpy()
    st_order = lex_order([st_code, st_s]) if st_s.size else np.zeros(0, np.intp)
    t = events.get_column(TIME).to_numpy()
    n_st = st_order.size
    rows_code = np.concatenate([st_code[st_order], code[m:]])
    s = np.concatenate([st_s[st_order], t])
    e = np.concatenate([in_batch.get_column(WEND).to_numpy()[st_order], t + gap])
    seq = np.concatenate([np.full(n_st, -1, np.int64), events.get_column(SEQ).to_numpy()])
    wm = np.concatenate([np.zeros(n_st, np.int64), events.get_column(WATERMARK).to_numpy()])
    labels, replay = _arrival_sessions(rows_code, s, e, seq, wm, n_st, lat)
    ev_label, st_label = labels[n_st:], np.empty(n_st, np.int64)
    st_label[st_order] = labels[:n_st]
    ev_late = np.zeros(events.height, bool)
    if replay.any():
        # keys whose outcome may depend on the arrival order: the general merge
        ev_r, st_r = replay[n_st:], np.zeros(n_st, bool)
        st_r[st_order] = replay[:n_st]
        base = int(labels.max()) + 1
        ev_l, late_l, st_l = _replayed_labels(
            events.filter(pl.Series(ev_r)), in_batch.filter(pl.Series(st_r)), gap, lat, base
        )
        ev_label[ev_r], ev_late[ev_r], st_label[st_r] = ev_l, late_l, st_l

    late = events.filter(pl.Series(ev_late)) if ev_late.any() else events.clear()
    # group by label without the key text (gathering strings per group costs
    # more than the rest of the group-by): each label's key is set afterwards
    # from one of its rows
    live = events.lazy().select(TIME, SEQ, *acc.input_columns())
    live = live.with_columns(pl.Series(LABEL, ev_label))
    if late.height:
        live = live.filter(pl.Series(~ev_late))
    if acc.needs_order():
        live = live.sort([TIME, SEQ])
    partial = live.group_by(LABEL).agg(
        pl.col(TIME).min().alias(WSTART),
        (pl.col(TIME).max() + gap).alias(WEND),
        *acc.partial(),
    ).collect()
    cols = [LABEL, *list(schema)[2:]]  # the schema less the key's two columns
    types = {c: schema[c] for c in cols[1:]}
    both = pl.concat(
        [
            in_batch.with_columns(pl.Series(LABEL, st_label)).select(cols),
            partial.select(cols).cast(types),  # type: ignore[arg-type]
        ],
        how="vertical",
    )
    merged = both.group_by(LABEL).agg(
        pl.col(WSTART).min(),
        pl.col(WEND).max(),
        *acc.combine(),
    )
    # a row of each label (state rows, then events; late events have none)
    row_label = np.concatenate([st_label, ev_label])
    has = np.flatnonzero(row_label >= 0)
    some_row = np.zeros(int(row_label.max()) + 1, np.int64)
    some_row[row_label[has]] = has
    keys = pl.concat(
        [in_batch.select(KEY, KEY_IS_INT), events.select(KEY, KEY_IS_INT)], how="vertical"
    )[some_row[merged.get_column(LABEL).to_numpy()]]
    state = pl.concat(
        [untouched, pl.concat([keys, merged], how="horizontal").select(list(schema))],
        how="vertical",
    )
    return state, late


def _key_codes(keys: pl.DataFrame) -> np.ndarray:
    """One small integer per distinct ``(key, is-int)`` of ``keys``."""
    codes: np.ndarray = keys.select(
        pl.col(KEY).cast(pl.Categorical).to_physical().cast(pl.Int64) * 2
        + pl.col(KEY_IS_INT).cast(pl.Int64)
    ).to_series().to_numpy()
    return codes


def _arrival_sessions(
    code: np.ndarray, s: np.ndarray, e: np.ndarray, seq: np.ndarray, wm: np.ndarray,
    n_st: int, lat: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Sessions of each key in arrival order, with one sort, where that is exact.

    Rows are the touched keys' open sessions first (``n_st`` of them, by key
    and start; sequence -1), then the batch's events (interval ``[s, e)``,
    sequence, watermark before the event). Sorted by (key, sequence), a key's
    rows are its sessions in start order, then its events as they arrived. A
    row that starts after every earlier row of its key ended starts a new
    *segment*. The segments are the sessions Flink's rules make when every other
    row touched its segment's span while that span was still open and touches
    no earlier segment, and no segment's first event is late: then each row
    merges into exactly its segment's one session. Returns each row's segment
    (the label) and which rows belong to a key where that does not hold (to be
    replayed by :func:`_replayed_labels`).
    """
    order = _arrival_order(code, seq)
    c, so, eo, wo = code[order], s[order], e[order], wm[order]
    is_state = order < n_st
    key_start = np.ones(c.size, bool)
    key_start[1:] = c[1:] != c[:-1]
    # the end of the key's span before each row (meaningless at a key's first row)
    prev_end = _segmented_running(eo, key_start, "max")
    new_seg = key_start | (so > prev_end)
    seg = np.cumsum(new_seg) - 1
    prev_start = _segmented_running(so, new_seg, "min")
    # the end of the key's earlier segments, per segment (none at a key's first)
    firsts = np.flatnonzero(new_seg)
    earlier = prev_end[firsts]
    earlier[key_start[firsts]] = np.iinfo(np.int64).min
    ok = np.where(
        new_seg,
        is_state | (eo + lat > wo),
        ~is_state & (so > earlier[seg]) & (eo >= prev_start) & (wo < prev_end + lat),
    )
    labels = np.empty(c.size, np.int64)
    labels[order] = seg
    if ok.all():
        return labels, np.zeros(c.size, bool)
    bad = np.zeros(int(c.max()) + 1, bool)
    bad[c[~ok]] = True
    return labels, bad[code]


def _arrival_order(code: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """The stable permutation sorting by ``(code, seq)``.

    A batch's sequence is one ascending run per partition (state rows, -1,
    before them): NumPy's stable sort of it (timsort) merges those runs in about
    linear time, far faster than a general sort; then a stable (radix, when
    the codes are few) sort by code keeps the arrival order within each key.
    """
    runs = int(np.count_nonzero(seq[1:] < seq[:-1])) + 1
    by_seq = np.argsort(seq, kind="stable") if runs <= RUNS_MAX else stable_argsort(seq)
    out: np.ndarray = by_seq[lex_order([code[by_seq]])]
    return out


def _replayed_labels(
    events: pl.DataFrame, state: pl.DataFrame, gap: int, lat: int, base: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The general merge of ``events`` into the open sessions ``state`` (whole
    keys): connected groups, those whose outcome could depend on the arrival
    order replayed by :func:`_sequential_sessions`. Returns the events' labels
    (-1 when late) and late flags, and the state rows' labels, from ``base``."""
    ev = events.with_row_index("__row")
    st = state.with_row_index("__row")
    rows = _session_groups(ev, st, gap, lat)
    rows = rows.with_columns(
        (pl.col("__g") + base).alias(LABEL), pl.lit(False).alias("__late")
    )
    if not rows.get_column("__gok").all():
        fast = rows.filter(pl.col("__gok"))
        slow = rows.filter(~pl.col("__gok"))
        top = int(rows.select(pl.col(LABEL).max()).item()) + 1
        rows = pl.concat([fast, _sequential_sessions(slow, gap, lat, top)], how="vertical")
        # put rows back in row-number order (events 0..n-1, then state 0..m-1),
        # where they already are without replayed groups: one gather, no sort
        at = rows["__row"].to_numpy().astype(np.int64) + np.where(
            rows["__st"].to_numpy(), ev.height, 0
        )
        back = np.empty(at.size, np.int64)
        back[at] = np.arange(at.size)
        rows = rows[back]
    n_ev = ev.height
    label = rows.get_column(LABEL).to_numpy()
    late = rows.get_column("__late").to_numpy()
    return label[:n_ev], late[:n_ev], label[n_ev:]


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
