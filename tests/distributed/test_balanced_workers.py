"""The work of a bounded run spread evenly over the workers: keys routed by weight when
the workers read unequal shares of the input (3 partitions on 2 workers), and a
reading worker's rows of its own keys handed to its own processing without Ray's
object store. The output stays the single-process output byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from sealstream.distributed._routing import BUCKETS_PER_WORKER, describe, read_shares, weighted
from sealstream.distributed._shard import SEED, shard_ids, split
from sealstream.sources._base import KEY
from sealstream.testing.specs import files_source, spec_text


def test_weighted_routing_gives_fewer_keys_to_the_workers_reading_more() -> None:
    # 3 equal partitions on 2 workers: worker 0 reads two thirds
    table = weighted([2.0, 1.0])
    assert table is not None and len(table) == 2 * BUCKETS_PER_WORKER
    counts = [table.count(0), table.count(1)]
    # k_0 = 1/2 + 2.5 (1/2 - 2/3) = 1/12, k_1 = 11/12 of 128 buckets
    assert counts == [11, 117]
    assert list(table) == sorted(table)  # consecutive ranges
    assert describe(table, 2)["buckets_per_worker"] == [11, 117]
    # equal shares (or within a bucket of them): plain hash mod N, as before
    assert weighted([1.0, 1.0]) is None and weighted([3.0, 3.0, 3.0]) is None
    assert weighted([1_000_000.0, 1_000_001.0]) is None
    assert describe(None, 2) == {"rule": "hash mod workers"}
    # a worker reading much more gets no key at all; the shares still add up
    lopsided = weighted([9.0, 1.0])
    assert lopsided is not None and lopsided.count(0) == 0
    assert len(lopsided) == 2 * BUCKETS_PER_WORKER


def test_read_shares_follow_the_partition_owners(tmp_path: Path) -> None:
    paths = []
    for q, size in enumerate((300, 100, 200)):
        p = tmp_path / f"p{q}.jsonl"
        p.write_bytes(b"x" * size)
        paths.append(p)
    assert read_shares(paths, 2) == [500.0, 100.0]  # partitions 0 and 2 on worker 0
    assert read_shares([*paths, tmp_path / "gone.jsonl"], 2) == [2.0, 2.0]  # counts


def test_split_keeps_each_key_on_one_worker_and_the_order_within() -> None:
    keys = [f"k{i % 97}" for i in range(2_000)]
    frame = pl.DataFrame({KEY: keys, "i": range(2_000)})
    table = weighted([2.0, 1.0])
    for workers, tab in ((2, None), (3, None), (2, table)):
        parts = split(frame, workers, tab)
        assert sum(p.height for p in parts) == frame.height
        owner: dict[str, int] = {}
        for w, part in enumerate(parts):
            assert part["i"].is_sorted()
            for k in part[KEY].unique():
                assert owner.setdefault(k, w) == w
        if tab is None:  # plain routing: Polars' hash with the seed, mod N
            want = (frame[KEY].hash(seed=SEED) % workers).cast(pl.Int64).to_list()
            assert shard_ids(frame, workers).tolist() == want
    assert split(frame, 2, (1,) * 128)[1].equals(frame)  # every key on worker 1


def _input(d: Path, keys: int, per_partition: int) -> list[str]:
    (d / "in").mkdir(parents=True)
    names = []
    for q in range(3):
        lines = [json.dumps({"user": f"u{(i * 7 + q) % keys:04d}",
                             "ts": 1_700_000_000_000 + i * 20 + q, "amount": i % 13})
                 for i in range(per_partition)]
        (d / f"in/p{q}.jsonl").write_text("\n".join(lines) + "\n")
        names.append(f"in/p{q}.jsonl")
    return names


def _lines(d: Path) -> list[str]:
    return sorted(ln for f in sorted((d / "out").glob("*.jsonl")) if not f.name.startswith(".")
                  for ln in f.read_text().splitlines() if ln.strip())


@pytest.mark.parametrize("workers", [1, 2])
def test_three_partitions_share_their_work_and_own_rows_stay_home(
        ray_cluster: Any, tmp_path: Path, workers: int,
        capsys: pytest.CaptureFixture[str]) -> None:
    """With 2 workers, worker 0 reads two partitions and gets about a twelfth of the keys
    (it processes the fewer rows, the manifest records the routing);
    every row read goes either to the object store for another worker or stays with
    its reader for its own keys, none is left behind; the results are one process's,
    byte for byte. With 1 worker every row stays home."""
    from sealstream import Job, load_spec
    from sealstream.cli import main
    from sealstream.distributed import DistributedJob

    per_partition, keys = 3_000, 400
    out: dict[str, list[str]] = {}
    for label, n in (("single", None), ("dist", workers)):
        d = tmp_path / label
        names = _input(d, keys, per_partition)
        spec = d / "spec.toml"
        spec.write_text(spec_text("balanced", files_source(names), batch_size=500,
                                  window='kind = "tumbling"\nsize_ms = 2000\n'
                                         'allowed_lateness_ms = 0',
                                  aggregates={"n": "count", "low": "min(amount)"},
                                  checkpoint='path = "ckpt"', every_events=6_000))
        pipeline = load_spec(spec)
        job = Job(pipeline) if n is None else DistributedJob(pipeline, workers=n)
        job.run()
        out[label] = _lines(d)
        if n is None:
            continue
        import ray

        rows = ray.get([a.plane_rows.remote() for a in job.merger.actors])  # type: ignore[union-attr]
        assert sum(r["kept"] + r["put"] for r in rows) == 3 * per_partition
        assert all(r["held"] == 0 for r in rows), rows  # every own slab was processed
        capsys.readouterr()
        assert main(["checkpoints", "inspect", str(d / "ckpt"), "--json"]) == 0
        dist = json.loads(capsys.readouterr().out)["distributed"]
        done = [r["processed"] for r in rows]
        assert sum(done) == 3 * per_partition, rows
        if workers == 1:
            assert rows[0]["put"] == 0, rows
            assert dist["routing"]["rule"] == "hash mod workers"
            continue
        assert dist["routing"]["buckets_per_worker"] == [11, 117], dist["routing"]
        assert 0 < done[0] < done[1] / 5, rows  # about 1/12 against 11/12
        # worker 1 reads partition 1 and keeps the rows of its own keys (11/12 of them)
        assert rows[1]["kept"] > rows[1]["put"] > 0, rows
        assert rows[0]["kept"] > 0, rows
    assert out["single"] and out["dist"] == out["single"]
