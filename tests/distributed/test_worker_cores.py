"""Workers share their node's cores instead of each sizing Polars' thread pool to all
of them, and a slab's rows travel to another worker without the two columns it
rebuilds (docs/scale-out.md, "Sharing the cores, slimmer rows")."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import polars as pl

from sealstream.sources._base import OFFSET, PARTITION
from sealstream.windows.aggregates import SEQ


def _pool_size(actor: Any) -> int:
    import ray

    def size(_self: Any) -> int:
        import polars

        return int(polars.thread_pool_size())

    return int(ray.get(actor.__ray_call__.remote(size), timeout=300))


def test_each_worker_gets_its_share_of_the_node_cores(ray_cluster: Any) -> None:
    """Two workers on a 2-core node get one Polars thread each, one worker both cores
    (the old workers sized their pools to every core: 2 each, 4 on 2 cores)."""
    import ray

    from sealstream.distributed._shard import THREADS_ENV, acquire, drain_pool, thread_share

    assert THREADS_ENV not in os.environ  # (the user's own setting would win)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    cores = int(nodes[0]["Resources"]["CPU"])
    assert cores == 2 and all(int(n["Resources"]["CPU"]) == cores for n in nodes)
    drain_pool()  # idle workers of earlier tests keep the pools they started with
    for workers in (2, 1):
        per_node = -(-workers // len(nodes))
        expected = max(1, cores // per_node)
        assert thread_share(workers) == expected
        actors = acquire(workers)
        try:
            assert [_pool_size(a) for a in actors] == [expected] * workers
        finally:
            for a in actors:
                ray.kill(a)
    if len(nodes) == 1:
        assert thread_share(2) == 1 and thread_share(1) == 2 and thread_share(3) == 1


def test_a_slab_travels_without_its_partition_and_sequence_columns() -> None:
    from sealstream.distributed._worker import slim, unslim

    n_parts, q = 3, 2
    offs = np.arange(5, 15, dtype=np.int64)
    frame = pl.DataFrame({
        OFFSET: offs, "__key": [f"k{i % 3}" for i in range(10)],
        "__t": np.arange(10, dtype=np.int64) * 7,
    }).with_columns(pl.lit(q, dtype=pl.Int32).alias(PARTITION),
                    (pl.col(OFFSET) * n_parts + q).alias(SEQ))
    thin = slim(frame)
    assert thin.columns == [OFFSET, "__key", "__t"]
    back = unslim(thin, q, n_parts)
    assert back.schema == frame.schema and back.equals(frame)
    empty = frame.clear()
    assert unslim(slim(empty), q, n_parts).equals(empty)
    # a frame whose columns are in another order (or a live slab's) travels whole
    other = frame.select(PARTITION, OFFSET, "__key", "__t", SEQ)
    assert slim(other).equals(other) and unslim(other, q, n_parts).equals(other)
