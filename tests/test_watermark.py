"""assign_watermarks against a literal per-event reference (semantics section 2).

The reference walks the events of every batch one by one in read order
``(offset, partition)`` and keeps each partition's watermark by the contract's
definition. The function under test must give every event exactly that value,
except where the caller passes a threshold above an upper bound of it: there
any value below the threshold (and not below the exact one) makes the same
decisions, so that is what is checked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from sealstream.sources._base import OFFSET, PARTITION, TIME
from sealstream.watermark import NEG_INF, POS_INF, WATERMARK, WatermarkState, assign_watermarks


@dataclass
class Ref:
    """The contract's watermark, one event at a time."""

    delay: int
    parts: int

    def __post_init__(self) -> None:
        self.max_time: list[int | None] = [None] * self.parts
        self.done = [False] * self.parts
        self.global_ms = NEG_INF

    def partition_ms(self, q: int) -> int:
        if self.done[q]:
            return POS_INF
        mt = self.max_time[q]
        return NEG_INF if mt is None else max(NEG_INF, mt - self.delay)

    def current(self) -> int:
        return max(self.global_ms, min(self.partition_ms(q) for q in range(self.parts)))

    def walk(self, records: list[tuple[int, int, int | None]], last: dict[int, int]) -> dict:
        """records: (offset, partition, time or None for a bad record), in read order;
        last: each ended partition's last offset. Returns {(offset, partition): W}."""
        out = {}
        for o, p, t in records:
            if t is not None:
                out[(o, p)] = self.current()
                mt = self.max_time[p]
                self.max_time[p] = t if mt is None else max(mt, t)
            if last.get(p) == o:
                self.done[p] = True
            self.global_ms = self.current()
        return out


@st.composite
def runs(draw: st.DrawFn) -> tuple[int, int, list[list[tuple[int, int, int | None]]], dict]:
    parts = draw(st.integers(1, 4))
    delay = draw(st.sampled_from([0, 1, 3, 10]))
    lengths = [draw(st.integers(0, 25)) for _ in range(parts)]
    records = []
    for q, n in enumerate(lengths):
        for o in range(n):
            bad = draw(st.integers(0, 9)) == 0
            records.append((o, q, None if bad else draw(st.integers(0, 40)) + o))
    records.sort()
    cuts = sorted(draw(st.lists(st.integers(0, len(records)), max_size=4)))
    batches, prev = [], 0
    for c in [*cuts, len(records)]:
        batches.append(records[prev:c])
        prev = c
    last = {q: n - 1 for q, n in enumerate(lengths) if n and draw(st.booleans())}
    return parts, delay, batches, last


@settings(max_examples=300, deadline=None)
@given(runs(), st.integers(-5, 60), st.booleans())
def test_matches_reference(case, threshold_shift: int, with_threshold: bool) -> None:
    parts, delay, batches, last = case
    ref = Ref(delay, parts)
    state = WatermarkState.initial(parts, delay)
    for q, lo in last.items():
        state.last_offset[q] = lo  # the reader has seen the end of q
    for batch in batches:
        expected = ref.walk(batch, last)
        events = sorted((p, o, t) for o, p, t in batch if t is not None)
        frame = pl.DataFrame(
            {
                OFFSET: [o for _, o, _ in events],
                PARTITION: [p for p, _, _ in events],
                TIME: [t for _, _, t in events],
            },
            schema={OFFSET: pl.Int64, PARTITION: pl.Int32, TIME: pl.Int64},
        )
        end = (batch[-1][0], batch[-1][1]) if batch else None
        times = frame[TIME].to_numpy()
        threshold = times + threshold_shift if with_threshold else None
        got = assign_watermarks(frame, state, end, threshold)[WATERMARK].to_list()
        for k, (p, o, _) in enumerate(events):
            exact = expected[(o, p)]
            if threshold is not None and threshold[k] > exact:
                # any value in [exact, threshold) makes the same decisions
                assert exact <= got[k] < threshold[k], (p, o, exact, got[k])
            else:
                assert got[k] == exact, (p, o, exact, got[k])
        assert state.global_ms == ref.global_ms
        assert state.max_time == ref.max_time



def test_many_events_take_the_counting_path() -> None:
    """Enough events per partition for the prefix count instead of binary search."""
    rng = np.random.default_rng(7)
    parts, delay, n = 3, 5, 400
    ref = Ref(delay, parts)
    records = sorted(
        (o, q, int(o + rng.integers(0, 30))) for q in range(parts) for o in range(n)
    )
    expected = ref.walk(records, {})
    state = WatermarkState.initial(parts, delay)
    events = sorted((p, o, t) for o, p, t in records)
    frame = pl.DataFrame(
        {OFFSET: [e[1] for e in events], PARTITION: [e[0] for e in events],
         TIME: [e[2] for e in events]},
        schema={OFFSET: pl.Int64, PARTITION: pl.Int32, TIME: pl.Int64},
    )
    got = assign_watermarks(frame, state, None)[WATERMARK].to_list()
    assert got == [expected[(o, p)] for p, o, _ in events]
