"""The window operator: assign, judge lateness, aggregate, fire — on columns.

Input batches are events in read order with their watermark ``__w`` (the
global watermark before each event) and arrival sequence ``__seq``. The open
state is a Polars frame keyed by ``(__key, __kint, window_start,
window_end)`` holding accumulator columns (see :mod:`.aggregates`); it is
exactly what a checkpoint stores.

For sessions and tumbling windows a state row is one open window. For sliding
windows a row is a *fragment* ``[a, b)`` (``a`` in ``window_start``, ``b`` in
``window_end``) that belongs to every window ``[s, s + size)`` with ``s`` a
multiple of ``slide`` and ``b - size <= s <= a``: a pane ``[p, p + slide)``
(when ``size % slide == 0``) collects the events all of whose windows were open
for them, and belongs to the ``size / slide`` windows that contain it; a window
``[s, s + size)`` collects the events of the pairs judged one by one (an event
late for some of its windows and not others, or every event when
``size % slide != 0``). A window's result combines its fragments when it fires
(:meth:`WindowOperator._fire_fixed`); a plain window row is the fragment of one
window, so tumbling state and older sliding state read the same way. When the
fragments are panes (the usual case), a firing sorts them by key and pane and
combines each window's contiguous range of panes, oldest first, without a row
per (pane, window) (:meth:`WindowOperator._fire_panes`); otherwise it explodes
the fragments into their windows and groups them.

Off-by-one rules (semantics sections 3-4): windows are half-open
``[start, end)``; a pair (event, window) is late when ``end + lateness <= W``;
a window fires when ``W >= end + lateness``.

Sessions are merged per key in arrival order with Flink's rules. The
operator computes sessions column-wise and checks, per merged group, that the
arrival order could not have changed the outcome (every event touched the
group's earlier span while it was still open). Groups that fail the check —
rare: late or very out-of-order events around a session that fired — are
replayed by :func:`_sequential_sessions`, a literal transcription of the
rules, over that group's rows only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from sealstream.pipeline import Pipeline, Session, Sliding, Tumbling
from sealstream.sources._base import KEY, KEY_IS_INT, TIME
from sealstream.watermark import POS_INF, WATERMARK
from sealstream.windows.aggregates import (
    GROUP,
    SEQ,
    WEND,
    WSTART,
    Accumulators,
    key_words,
    lex_order,
    stable_argsort,
)
from sealstream.windows.join import JoinRule

LABEL = "__label"
MAX_PENDING = 8  # tumbling batch partials kept apart before they are merged


@dataclass
class Output:
    """What one batch produced: fired windows (accumulator rows) and late events."""

    fired: pl.DataFrame
    late: pl.DataFrame
    stats: dict[str, int] = field(default_factory=dict)


class WindowOperator:
    """Keyed event-time windows over columnar batches.

    ``state`` is the open-window table from a checkpoint (or None to start
    empty): restoring is construction. :meth:`snapshot` returns the table to
    persist.
    """

    def __init__(self, pipeline: Pipeline, state: pl.DataFrame | None = None) -> None:
        self.window = pipeline.window
        self.lateness = pipeline.window.allowed_lateness_ms
        self.acc = Accumulators(tuple(pipeline.parsed_aggregates), pipeline.event_plan(),
                                named_key=pipeline.source.key_fields is not None)
        self.join = JoinRule.of(pipeline)  # several sources (docs/joins.md), else None
        self.schema: dict[str, pl.DataType] = {
            KEY: pl.String(),
            KEY_IS_INT: pl.Boolean(),
            WSTART: pl.Int64(),
            WEND: pl.Int64(),
            **self.acc.schema(),
        }
        if state is None:
            state = pl.DataFrame(schema=self.schema)
        else:
            if list(state.schema) != list(self.schema):
                raise ValueError(
                    f"window state columns {list(state.schema)} do not match {list(self.schema)}"
                )
            state = state.cast(self.schema)  # type: ignore[arg-type]  # Decimal -> Int128
        self._state = state
        # tumbling windows: batch partials not merged into ``_state`` yet (see _stash)
        self._pending: list[pl.DataFrame] = []
        w = self.window
        self.size_ms = w.size_ms if isinstance(w, Tumbling | Sliding) else 0
        self.slide_ms = w.slide_ms if isinstance(w, Sliding) else self.size_ms
        # the most windows a fragment (or an event) belongs to
        self.copies = -(-self.size_ms // self.slide_ms) if self.slide_ms else 1
        self._open: tuple[pl.DataFrame, int] | None = None

    @property
    def state(self) -> pl.DataFrame:
        """The open-window table: one row per fragment (merging pending partials)."""
        if self._pending:
            self._compact()
        return self._state

    @state.setter
    def state(self, value: pl.DataFrame) -> None:
        self._state = value
        self._pending = []

    def _stash(self, partial: pl.DataFrame) -> None:
        """Keep a tumbling batch's partial aside instead of merging it into the
        state now: most of its windows fire before another batch touches them,
        and a firing combines the pieces of just the windows it fires. Pending
        pieces are merged when the state is read (checkpoints, open-window
        counts) or when there are :data:`MAX_PENDING` of them."""
        if not partial.height:
            return
        partial = partial.select(list(self.schema))
        if partial.schema != self.schema:
            partial = partial.cast(self.schema)  # type: ignore[arg-type]
        self._pending.append(partial)
        if len(self._pending) >= MAX_PENDING:
            self._compact()

    def _compact(self) -> None:
        pieces = [f for f in (self._state, *self._pending) if f.height]
        self._pending = []
        if len(pieces) == 1:
            self._state = pieces[0]
        elif pieces:
            self._state = self._combined(pieces)

    def _combined(self, pieces: list[pl.DataFrame]) -> pl.DataFrame:
        """One row per window of ``pieces`` (oldest first), combining its rows."""
        return (
            pl.concat(pieces, how="vertical")
            .group_by(GROUP)
            .agg(self.acc.combine())
            .select(list(self.schema))
        )

    def snapshot(self) -> pl.DataFrame:
        return self.state

    @property
    def open_windows(self) -> int:
        """How many windows hold state (not fragments: a pane counts once per window)."""
        if self.size_ms == self.slide_ms or not self.state.height:
            return self.state.height
        if self._open is None or self._open[0] is not self.state:
            slide, a = self.slide_ms, pl.col(WSTART)
            oldest = -((self.size_ms - pl.col(WEND)) // slide) * slide
            windows = (
                self.state.lazy()
                .select(KEY, KEY_IS_INT, pl.int_ranges(oldest, a + slide, slide).alias("__s"))
                .explode("__s")
                .unique()
                .select(pl.len())
                .collect()
                .item()
            )
            self._open = (self.state, int(windows))
        return self._open[1]

    def open_window_table(self) -> pl.DataFrame:
        """The open windows as rows of the window schema, each combining its fragments
        (what would fire if the watermark jumped to +inf now; the state is unchanged)."""
        if self.size_ms == self.slide_ms:
            return self.state
        saved = self.state
        try:
            return self._fire_fixed(POS_INF)
        finally:
            self.state = saved

    # ------------------------------------------------------------------ batch
    def watermark_threshold(self, events: pl.DataFrame) -> np.ndarray[Any, Any] | None:
        """Per event, the lowest watermark at which :meth:`process` could judge it
        differently: below it every window of the event is open for it (for
        :func:`~sealstream.watermark.assign_watermarks`). None for sessions,
        which always take the exact watermark.

        An event at ``t`` belongs to windows starting at ``base - k * slide``
        (``base = t // slide * slide``, ``k < copies``); every judgement
        (late, pane or not, each window's pair) compares ``start + size +
        lateness`` with the watermark, the smallest being the oldest window's.
        """
        if isinstance(self.window, Session):
            return None
        size, slide = self.size_ms, self.slide_ms
        base = events.get_column(TIME).to_numpy() // slide * slide
        threshold: np.ndarray[Any, Any] = base + (
            size - (self.copies - 1) * slide + self.lateness
        )
        return threshold

    def process(self, events: pl.DataFrame, w_end: int) -> Output:
        """Apply a batch (sorted in read order), then fire windows closed by ``w_end``."""
        if isinstance(self.window, Session):
            late = self._sessions(events, self.window)
            closed = (pl.col(WEND) + self.lateness) <= w_end
            fired = self.state.filter(closed)
            if fired.height:
                self.state = self.state.filter(~closed)
        else:
            late = self._fixed(events)
            fired = self._fire_fixed(w_end)
        return Output(fired=fired, late=late)

    def finalize(self, fired: pl.DataFrame) -> pl.DataFrame:
        if self.join is not None:  # several sources: the join rule (windows/join.py)
            return self.join.finalize(self.acc, fired)
        return self.acc.finalize(fired)

    # ----------------------------------------------------- tumbling / sliding
    def _fixed(self, events: pl.DataFrame) -> pl.DataFrame:
        """Add a batch to the fragment state; return its late events.

        Every live event goes to one fragment: its pane ``[base, base + slide)``
        when all its windows are open for it (``size % slide == 0``; tumbling
        windows are their own panes), else — some of its older windows are
        closed for it, or ``size % slide != 0`` — to each of its open windows
        ``[s, s + size)``, judged pair by pair as the contract says.
        """
        if not events.height:
            return events
        size, slide, lat = self.size_ms, self.slide_ms, self.lateness
        t, wm = pl.col(TIME), pl.col(WATERMARK)
        needed = [KEY, KEY_IS_INT, TIME, SEQ, WATERMARK, *self.acc.input_columns()]
        base = (t // slide) * slide
        # an event is late when even its newest window is closed
        late_event = (base + size + lat) <= wm
        any_late = events.select(late_event.any()).item()
        late = events.filter(late_event) if any_late else events.clear()
        live = events.lazy().select(needed).filter(~late_event).with_columns(base.alias(WSTART))
        if slide == size:
            pairs = live.with_columns((pl.col(WSTART) + size).alias(WEND))
        elif size % slide == 0:
            # the oldest window of an event in pane p ends at p + slide
            on_time = (pl.col(WSTART) + (slide + lat)) > wm
            panes = live.filter(on_time).with_columns((pl.col(WSTART) + slide).alias(WEND))
            pairs = pl.concat([panes, self._explode(live.filter(~on_time))], how="vertical")
        else:
            pairs = self._explode(live)
        if self.acc.needs_order():
            pairs = pairs.sort([TIME, SEQ])
        partial = pairs.group_by(GROUP).agg(self.acc.partial()).collect()
        if slide == size:
            self._stash(partial)
        else:
            self._merge(partial)
        return late

    def _explode(self, live: pl.LazyFrame) -> pl.LazyFrame:
        """One row per (event, open window of the event), ``WSTART`` holding its pane start."""
        size, slide, lat = self.size_ms, self.slide_ms, self.lateness
        t = pl.col(TIME)
        frames = []
        for k in range(self.copies):
            s = pl.col(WSTART) - k * slide
            frames.append(
                live.with_columns(s.alias("__s")).filter(
                    ((pl.col("__s") + size) > t)
                    & ((pl.col("__s") + (size + lat)) > pl.col(WATERMARK))
                )
            )
        return (
            pl.concat(frames, how="vertical")
            .drop(WSTART)
            .rename({"__s": WSTART})
            .with_columns((pl.col(WSTART) + size).alias(WEND))
        )

    def _merge(self, partial: pl.DataFrame) -> None:
        """Merge fragment partials into the state, combining equal fragments.

        Only the state rows that meet a partial row (same key and span) are
        combined with it, row beside row (:meth:`Accumulators.combine_pair`); a
        cheap filter on ``window_start`` first narrows the state to the rows
        that can. A state that holds a fragment twice (never written by this
        operator) is regrouped instead.
        """
        if not partial.height:
            return
        partial = partial.select(list(self.schema))
        if partial.schema != self.schema:
            partial = partial.cast(self.schema)  # type: ignore[arg-type]
        if not self.state.height:
            self.state = partial
            return
        hit = pl.col(WSTART).is_in(partial.get_column(WSTART).unique().implode())
        touched = self.state.filter(hit)
        if not touched.height:
            self.state = pl.concat([self.state, partial], how="vertical")
            return
        # the state rows that meet a partial row (same fragment): one hash lookup
        ids = partial.select(pl.struct(GROUP)).to_series()
        hit_rows = touched.select(pl.struct(GROUP).is_in(ids.implode())).to_series()
        if not hit_rows.any():
            self.state = pl.concat([self.state, partial], how="vertical")
            return
        meet = touched.filter(hit_rows)
        # each of them next to its partial row
        sfx = "__early"
        pairs = (
            partial.select(GROUP)
            .with_row_index("__p")
            .join(meet.select(GROUP).with_row_index("__i"), on=GROUP, how="inner")
        )
        p_met = pairs.get_column("__p").to_numpy()
        p_apart = np.ones(partial.height, dtype=bool)
        p_apart[p_met] = False
        if pairs.height != meet.height or partial.height - p_apart.sum() != pairs.height:
            self._merge_grouped(touched, partial)  # the state repeats a fragment: regroup
            return
        accs = list(self.acc.schema())
        met = meet.select(accs)[pairs.get_column("__i").to_numpy()]
        both = partial[p_met].hstack(met.rename(lambda c: c + sfx))
        merged = both.select(*GROUP, *self.acc.combine_pair(sfx)).select(list(self.schema))
        self.state = pl.concat(
            [
                self.state.filter(~hit),
                touched.filter(~hit_rows),
                merged,
                partial.filter(p_apart),
            ],
            how="vertical",
        )

    def _merge_grouped(self, touched: pl.DataFrame, partial: pl.DataFrame) -> None:
        hit = pl.col(WSTART).is_in(partial.get_column(WSTART).unique().implode())
        ids = partial.select(GROUP)
        meet = touched.join(ids, on=GROUP, how="semi")
        apart = touched.join(ids, on=GROUP, how="anti")
        merged = self._combined([meet, partial])
        self.state = pl.concat([self.state.filter(~hit), apart, merged], how="vertical")

    def _fire_fixed(self, w_end: int) -> pl.DataFrame:
        """Fire every window closed by ``w_end`` that has not fired yet.

        A fragment ``[a, b)`` belongs to the windows ``s`` (multiples of
        ``slide``) with ``b - size <= s <= a``. A window fires once the watermark
        reaches ``s + size + lateness``: its result combines every fragment that
        belongs to it. Afterwards a fragment whose newest window (``s = a``) fired
        is dropped, and the others are narrowed (``b`` raised) so that they no
        longer belong to the windows that fired: the state alone says which
        windows are still to fire, so nothing fires twice, across restores too.
        """
        size, slide, lat = self.size_ms, self.slide_ms, self.lateness
        if slide == size:  # every fragment is exactly one window
            closed = (pl.col(WEND) + lat) <= w_end
            pieces: list[pl.DataFrame] = []
            rest: list[pl.DataFrame] = []
            for frame in (self._state, *self._pending):
                done = frame.filter(closed)
                if done.height:
                    pieces.append(done)
                    frame = frame.filter(~closed)
                rest.append(frame)
            self._state, self._pending = rest[0], [f for f in rest[1:] if f.height]
            if len(pieces) > 1:
                return self._combined(pieces)
            return pieces[0] if pieces else self._state.clear()
        st = self.state
        a, b = pl.col(WSTART), pl.col(WEND)
        oldest = -((size - b) // slide) * slide  # smallest multiple of slide >= b - size
        due = (oldest + (size + lat)) <= w_end
        cand = st.filter(due)
        if not cand.height:
            return st.clear()
        # the first window start that stays open after this firing
        nxt = (w_end - size - lat) // slide * slide + slide
        panes = self._fire_panes(cand, nxt - slide)
        if panes is not None:
            fired = panes
        else:
            # each fragment's closed windows: oldest .. min(a, nxt - slide), step slide
            newest = pl.min_horizontal(a, pl.lit(nxt - slide, dtype=pl.Int64))
            fired = (
                cand.lazy()
                .select(
                    KEY,
                    KEY_IS_INT,
                    pl.int_ranges(oldest, newest + slide, slide, dtype=pl.Int64).alias(WSTART),
                    *self.acc.schema(),
                )
                .explode(WSTART)
                .group_by([KEY, KEY_IS_INT, WSTART])
                .agg(self.acc.combine())
                .with_columns((pl.col(WSTART) + size).alias(WEND))
                .select(list(self.schema))
                .collect()
            )
        keep = cand.filter((a + (size + lat)) > w_end).with_columns(
            pl.max_horizontal(b, pl.lit(nxt + size, dtype=pl.Int64)).alias(WEND)
        )
        self.state = pl.concat([st.filter(~due), keep], how="vertical")
        return fired

    def _fire_panes(self, cand: pl.DataFrame, last: int) -> pl.DataFrame | None:
        """The windows ``s <= last`` of the due fragments ``cand``, combined over
        sorted ranges of fragments instead of one row per (fragment, window);
        rows come out in result order (``window_start``, then key text). None
        when the fragments do not follow the pane pattern below (then the caller
        explodes them).

        In slide units (``K = size / slide``), a fragment ``[a, b)`` belongs to
        the windows ``lo = b - K .. a``. The pattern: every fragment is a pane
        whose older windows fired up to a common frontier ``F``, that is
        ``lo = max(a - K + 1, F)`` (``F`` the smallest ``lo`` of the narrowed
        fragments, none if no fragment is narrowed). Then, for the windows
        ``s >= F``, the fragments of window ``s`` are those of its key with
        ``s <= a < s + K``: one contiguous range once sorted by (key, ``a``).
        """
        size, slide = self.size_ms, self.slide_ms
        if size % slide:
            return None
        k = size // slide
        a_ms = cand.get_column(WSTART).to_numpy()
        b_ms = cand.get_column(WEND).to_numpy()
        if (a_ms % slide).any() or (b_ms % slide).any():
            return None
        a, lo = a_ms // slide, b_ms // slide - k
        natural = a - (k - 1)
        narrowed = lo > natural
        start = np.maximum(natural, lo[narrowed].min()) if narrowed.any() else natural
        if not np.array_equal(lo, start) or (lo > a).any():
            return None
        words = key_words(cand)
        if words is None:
            return None
        # sort by key (text bytes, then __kint), then a
        keys = [*words, cand.get_column(KEY_IS_INT).to_numpy()]
        if cand.select(pl.col(KEY).str.contains("\x00", literal=True).any()).item():
            keys.insert(len(words), cand.get_column(KEY).str.len_bytes().to_numpy())
        order = lex_order([*keys, a])
        n = order.size
        new_key = np.zeros(n, dtype=bool)
        new_key[0] = True
        for col in keys:
            c = col[order]
            new_key[1:] |= c[1:] != c[:-1]
        kid = np.cumsum(new_key) - 1
        a, start = a[order], start[order]
        end = np.minimum(a, last // slide)
        # each window once: a fragment adds the windows past its key's previous one
        first = start.copy()
        first[1:] = np.where(new_key[1:], start[1:], np.maximum(start[1:], end[:-1] + 1))
        count = np.maximum(end - first + 1, 0)
        owner = np.repeat(np.arange(n), count)
        step = np.arange(owner.size) - np.repeat(np.cumsum(count) - count, count)
        s = first[owner] + step
        # window s of key kid: the fragments with code in [kid, s) .. [kid, s + K)
        base = int(a.min()) - k
        span = int(a.max()) - base + k + 1
        code = kid * span + (a - base)
        wkid = kid[owner]
        r0 = np.searchsorted(code, wkid * span + (s - base), side="left")
        r1 = np.searchsorted(code, wkid * span + (s + k - base), side="left")
        # result order: window start, then key (kid follows the key text)
        by_start = lex_order([s])
        s, r0, r1, wkid = s[by_start], r0[by_start], r1[by_start], wkid[by_start]
        accs = self.acc.combine_ranges(cand, order, r0, r1)
        if accs is None:
            return None
        ids: pl.DataFrame = cand.select(KEY, KEY_IS_INT)[order[new_key]][wkid]
        starts = pl.Series(WSTART, s * slide, dtype=pl.Int64)
        return ids.with_columns(starts, (starts + size).alias(WEND), *accs).select(
            list(self.schema)
        )

    # ---------------------------------------------------------------- session
    def _sessions(self, events: pl.DataFrame, w: Session) -> pl.DataFrame:
        if not events.height:
            return events
        gap, lat = w.gap_ms, self.lateness
        ev = events.with_row_index("__row")
        keys = ev.select(KEY, KEY_IS_INT).unique()
        in_batch = self.state.join(keys, on=[KEY, KEY_IS_INT], how="semi")
        untouched = self.state.join(keys, on=[KEY, KEY_IS_INT], how="anti")
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
        needed = [LABEL, KEY, KEY_IS_INT, TIME, SEQ, *self.acc.input_columns()]
        live = ev.lazy().filter(~pl.col("__late")).select(needed)
        if self.acc.needs_order():
            live = live.sort([TIME, SEQ])
        partial = live.group_by(LABEL).agg(
            pl.col(KEY).first(),
            pl.col(KEY_IS_INT).first(),
            pl.col(TIME).min().alias(WSTART),
            (pl.col(TIME).max() + gap).alias(WEND),
            *self.acc.partial(),
        ).collect()
        labelled_state = st.drop("__row").with_columns(st_labels)
        cols = [LABEL, *self.schema]
        both = pl.concat(
            [
                labelled_state.select(cols),
                partial.select(cols).cast(self.schema),  # type: ignore[arg-type]
            ],
            how="vertical",
        )
        merged = both.group_by(LABEL).agg(
            pl.col(KEY).first(),
            pl.col(KEY_IS_INT).first(),
            pl.col(WSTART).min(),
            pl.col(WEND).max(),
            *self.acc.combine(),
        )
        self.state = pl.concat(
            [untouched, merged.select(list(self.schema))], how="vertical"
        )
        return late


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
