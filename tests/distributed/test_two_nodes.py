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
from pathlib import Path
from typing import Any

import psycopg

from scenarios._story import assert_same_output, make_input, write_spec

STORY = {"events": 1500, "every_events": 300, "batch_size": 100}
WINDOW = 'kind = "sliding"\nsize_ms = 3000\nslide_ms = 1000\nallowed_lateness_ms = 0'


def test_two_nodes_postgres_store_and_a_killed_worker(ray_cluster: Any, tmp_path: Path,
                                                      reference: Any, pg_url: str) -> None:
    from _ray_nodes import NODE, node_ids, pool_with_a_worker_on

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
        pool_with_a_worker_on(node, 2)
        rng = random.Random(5)
        at = rng.randrange(3, STORY["events"] // STORY["batch_size"])
        steps: list[int] = []
        killed: list[int] = []

        def kill(job: Any) -> None:
            steps.append(1)
            if len(steps) == at and not killed:
                op = job.operator
                on_node = [pid for n, pid in zip(node_ids(op.actors), op.pids, strict=True)
                           if n == node.node_id]
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
