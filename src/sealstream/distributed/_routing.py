"""Weighted key routing: fewer keys for the workers that read more of the input.

Partition ``q`` is read and parsed by worker ``q mod N``; with ``P`` partitions not
a multiple of ``N`` (3 partitions on 2 workers) some workers read more than others,
and reading (parse, breakpoints, split, put) costs a worker about
:data:`READ_COST` times what processing an event of its keys does (aggregate,
watermarks, fetch). Plain ``hash mod N`` gives every worker the same keys, so the
workers reading more finish their steps last while the others wait.

A weighted routing hashes each key into ``B = BUCKETS_PER_WORKER * N`` buckets
(``hash mod B``, the same Polars hash and seed) and gives worker ``i`` a range of
``c_i`` consecutive buckets, ``c_i`` proportional to its key share
``k_i = 1/N + READ_COST * (1/N - f_i)`` (clipped at 0, normalised), where ``f_i`` is
the share of the input bytes worker ``i`` reads. Then every worker's expected work
``READ_COST * f_i + k_i`` is the same (where no share is clipped). Each key still
belongs to exactly one worker, for the whole run: the routing is fixed when the
workers load the state (every restore re-splits the whole state, so a restarted or
rescaled run may route differently). When every share rounds to ``B / N`` buckets the
routing is plain ``hash mod N`` (``B`` is a multiple of ``N``), so balanced inputs
route exactly as before.

A live source's partitions count as equal shares (:func:`partition_shares`): those
listed in the checkpoint a run resumes from, or, on a fresh start (no state yet),
those the run opens at start, the routing then given to the still empty workers
before the first step. Partitions that appear later are read by ``q mod N`` and do
not change the routing.
"""

from __future__ import annotations

from pathlib import Path

#: a reading worker's CPU per event relative to a key worker's: parse, breakpoints,
#: key split and put about 0.7-0.8 us against aggregate, watermarks and fetch about
#: 0.3 us (bench/results/scaleout.md, profile of the workers' phases); measured on
#: 3 partitions over 2 workers, 2.0 left the worker reading two partitions about 10%
#: more CPU than the other, 3.0 about 5% less (docs/scale-out.md, "Key routing")
READ_COST = 2.5
#: buckets per worker of a weighted routing (a key share's resolution: 1/64 of 1/N)
BUCKETS_PER_WORKER = 64

Table = tuple[int, ...]


def weighted(read_shares: list[float], read_cost: float = READ_COST) -> Table | None:
    """The bucket table (bucket -> worker) for workers reading ``read_shares`` of the
    input (any unit), or None for plain ``hash mod N``."""
    n = len(read_shares)
    total = float(sum(read_shares))
    if n <= 1 or total <= 0:
        return None
    keys = [max(0.0, 1 / n + read_cost * (1 / n - s / total)) for s in read_shares]
    norm = sum(keys)
    buckets = BUCKETS_PER_WORKER * n
    exact = [k / norm * buckets for k in keys]
    counts = [int(e) for e in exact]
    # largest remainders first (ties: the lower worker), so the counts add up to B
    for i in sorted(range(n), key=lambda i: (counts[i] - exact[i], i))[:buckets - sum(counts)]:
        counts[i] += 1
    if all(c == BUCKETS_PER_WORKER for c in counts):
        return None
    return tuple(w for w, c in enumerate(counts) for _ in range(c))


def read_shares(paths: list[Path], workers: int) -> list[float]:
    """The bytes each worker reads when partition ``q`` (``paths[q]``) is read by
    worker ``q mod workers``; a partition count per worker when a size is unknown
    (an object-storage URL, a file gone)."""
    try:
        sizes = [float(p.stat().st_size) for p in paths]
    except (OSError, ValueError):
        sizes = [1.0] * len(paths)
    shares = [0.0] * workers
    for q, size in enumerate(sizes):
        shares[q % workers] += size
    return shares


def partition_shares(partitions: int, workers: int) -> list[float]:
    """The partitions each worker reads when partition ``q`` is read by worker
    ``q mod workers``: a live source's partitions (Kafka, NATS, followed files),
    whose sizes are not known at start, taken as equal."""
    shares = [0.0] * workers
    for q in range(partitions):
        shares[q % workers] += 1.0
    return shares


def describe(table: Table | None, workers: int) -> dict[str, object]:
    """The routing as recorded in the manifest (``distributed.routing``)."""
    if table is None:
        return {"rule": "hash mod workers"}
    counts = [table.count(i) for i in range(workers)]
    return {"rule": "hash mod buckets, consecutive bucket ranges per worker",
            "buckets": len(table), "buckets_per_worker": counts}
