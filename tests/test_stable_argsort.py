"""The multi-threaded sort the window operator uses for large integer keys gives
exactly NumPy's stable permutation (ties keep their order), so results never depend
on which sort ran."""

from __future__ import annotations

import numpy as np
import pytest

from sealstream.windows.aggregates import PARALLEL_SORT_MIN, lex_order, stable_argsort


@pytest.mark.parametrize("high", [3, 70_000, 10**15])
@pytest.mark.parametrize("size", [10, PARALLEL_SORT_MIN + 7, 4 * PARALLEL_SORT_MIN])
def test_stable_argsort_is_numpy_stable(size: int, high: int) -> None:
    rng = np.random.default_rng(size + high)
    for dtype in (np.int64, np.uint64, np.int32):
        k = rng.integers(0, high, size).astype(dtype)
        assert np.array_equal(stable_argsort(k), np.argsort(k, kind="stable"))


def test_lex_order_ties_keep_order() -> None:
    rng = np.random.default_rng(7)
    n = 3 * PARALLEL_SORT_MIN
    a = rng.integers(0, 50, n).astype(np.int64) * 10**12
    b = rng.integers(-5, 5, n).astype(np.int64) * 10**9
    assert np.array_equal(lex_order([a, b]), np.lexsort((b, a)))
