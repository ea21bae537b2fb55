"""The session merge's second ordering (by group, then arrival) reuses the first
ordering's groups instead of sorting every row again; it must equal the full sort."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sealstream.windows._sessions import _order_by, _regroup_by_arrival


def _groups(code: np.ndarray, s: np.ndarray, cuts: np.ndarray) -> tuple[np.ndarray, ...]:
    order = _order_by(code, s)
    new_group = np.ones(code.size, bool)
    new_group[1:] = (code[order][1:] != code[order][:-1]) | cuts[1:]
    g_sorted = np.cumsum(new_group) - 1
    g = np.empty_like(g_sorted)
    g[order] = g_sorted
    return order, g_sorted, g


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 400),
    keys=st.integers(1, 20),
    seed=st.integers(0, 2**32 - 1),
    in_arrival_order=st.booleans(),
    state_share=st.floats(0.0, 0.5),
)
def test_regroup_equals_the_full_sort(
    n: int, keys: int, seed: int, in_arrival_order: bool, state_share: float
) -> None:
    rng = np.random.default_rng(seed)
    code = rng.integers(0, keys, n)
    s = rng.integers(0, 1_000, n)
    seq = np.arange(n, dtype=np.int64) if in_arrival_order else rng.permutation(n)
    seq[rng.random(n) < state_share] = -1  # state sessions: all tie at -1
    order, g_sorted, g = _groups(code, s, rng.random(n) < 0.3)
    assert np.array_equal(_regroup_by_arrival(order, g_sorted, g, seq), _order_by(g, seq))


def test_groups_already_in_arrival_order_are_not_sorted_again() -> None:
    code = np.array([1, 0, 1, 0], dtype=np.int64)
    s = np.array([10, 20, 30, 40], dtype=np.int64)
    seq = np.arange(4, dtype=np.int64)
    order, g_sorted, g = _groups(code, s, np.zeros(4, bool))
    assert _regroup_by_arrival(order, g_sorted, g, seq) is order
    assert np.array_equal(order, _order_by(g, seq))
