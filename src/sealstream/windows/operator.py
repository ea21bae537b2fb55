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
from sealstream.windows._sessions import session_step
from sealstream.windows.aggregates import (
    GROUP,
    SEQ,
    WEND,
    WSTART,
    Accumulators,
    key_words,
    lex_order,
)
from sealstream.windows.join import JoinRule

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
        self.state, late = session_step(
            self.state, events, w.gap_ms, self.lateness, self.acc, self.schema
        )
        return late
