"""Two Ray nodes (``ray.cluster_utils.Cluster``), the checkpoint store in PostgreSQL:
the workers on both nodes read their partitions, exchange rows through the object
store and write their checkpoint parts into PostgreSQL themselves; the worker on the
second node is SIGKILLed mid-run, every worker restarts from the newest checkpoint,
and the output is the single-process one, exactly once."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from scenarios._story import assert_same_output, make_input, write_spec

STORY = {"events": 1500, "every_events": 300, "batch_size": 100}
WINDOW = 'kind = "sliding"\nsize_ms = 3000\nslide_ms = 1000\nallowed_lateness_ms = 0'


def _node_of(actor: Any) -> str:
    import ray

    return str(ray.get(actor.__ray_call__.remote(
        lambda _self: ray.get_runtime_context().get_node_id()), timeout=120))


def _pool_on_both(node: Any, workers: int) -> None:
    """Idle workers in the driver's pool, one at least on ``node`` (SPREAD is best
    effort on a loaded machine: retried)."""
    from sealstream.distributed import _shard

    for _ in range(20):
        actors = _shard.acquire(workers)
        if node.node_id in [_node_of(a) for a in actors]:
            _shard.release(actors, healthy=True)
            return
        _shard.release(actors, healthy=False)
        time.sleep(0.5)
    pytest.fail("Ray placed no worker on the added node in 20 tries")


def test_two_nodes_postgres_store_and_a_killed_worker(ray_cluster: Any, tmp_path: Path,
                                                      reference: Any, pg_url: str) -> None:
    from _ray_nodes import NODE

    from sealstream import load_spec
    from sealstream.distributed import DistributedJob
    from sealstream.distributed._shard import drain_pool

    ref = reference(window=WINDOW, **STORY)
    d = tmp_path / "dist"
    names = make_input(d, events=STORY["events"])
    spec = write_spec(d, names, window=WINDOW, every_events=STORY["every_events"],
                      batch_size=STORY["batch_size"])
    spec.write_text(spec.read_text().replace('path = "ckpt"', f"url = {json.dumps(pg_url)}"))
    node = ray_cluster.add_node(**{**NODE, "num_cpus": 1})
    try:
        ray_cluster.wait_for_nodes()
        drain_pool()
        _pool_on_both(node, 2)
        rng = random.Random(5)
        at = rng.randrange(3, STORY["events"] // STORY["batch_size"])
        steps: list[int] = []
        killed: list[int] = []

        def kill(job: Any) -> None:
            steps.append(1)
            if len(steps) == at and not killed:
                op = job.operator
                on_node = [pid for a, pid in zip(op.actors, op.pids, strict=True)
                           if _node_of(a) == node.node_id]
                assert on_node, "no worker on the second node"
                os.kill(on_node[0], signal.SIGKILL)
                killed.append(on_node[0])

        job = DistributedJob(load_spec(spec), workers=2, progress=kill)
        job.run()
        assert killed and job.restarts == 1
        assert_same_output(d, ref)
        assert not (d / "ckpt").exists()  # nothing on the coordinator's file system
        with psycopg.connect(pg_url, autocommit=True) as conn:
            parts = conn.execute(
                "SELECT count(*) FROM sealstream_checkpoint_files "
                "WHERE pipeline = 'story' AND name LIKE '%%/state.part-%%'").fetchone()
        assert parts is not None and parts[0] >= 2
    finally:
        drain_pool()
        ray_cluster.remove_node(node)
