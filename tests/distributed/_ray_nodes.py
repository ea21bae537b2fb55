"""The arguments of every Ray node the tests start (loopback only, no dashboard).

A module of its own: test files import it by a name no other test directory uses
(``from conftest import ...`` would find whichever conftest was imported first)."""

from __future__ import annotations

import time
from typing import Any

import pytest

NODE = {"node_ip_address": "127.0.0.1", "include_dashboard": False, "num_cpus": 2}

#: how long a test waits for Ray to start a worker and answer it: only a hang reaches it.
#: Starting a worker process (Python, Ray, Polars, sealstream) took minutes at load ~60,
#: and the raylet starts it again when it does not register in time: a bound of 120 s
#: on ``ray.get`` failed a test with ``GetTimeoutError`` on a loaded machine.
GENEROUS_S = 900.0


def node_ids(actors: list[Any]) -> list[str]:
    """The node each actor runs on, once every one of them answers (the condition
    waited for); a dead actor raises Ray's error. Only a hang of :data:`GENEROUS_S`
    fails the test, with one line saying how many answered."""
    import ray

    refs = [a.__ray_call__.remote(lambda _self: ray.get_runtime_context().get_node_id())
            for a in actors]
    deadline = time.monotonic() + GENEROUS_S
    ready: list[Any] = []
    pending = list(refs)
    while pending:  # ray.wait returns as soon as an actor answers: polling a state
        done, pending = ray.wait(pending, num_returns=len(pending), timeout=5.0)
        ready += done
        if pending and time.monotonic() > deadline:
            pytest.fail(f"Ray started {len(ready)} of {len(refs)} workers in "
                        f"{GENEROUS_S:.0f} s", pytrace=False)
    return [str(n) for n in ray.get(refs)]


def pool_with_a_worker_on(node: Any, workers: int) -> None:
    """Leave ``workers`` idle workers in the driver's pool (the next job takes them),
    one of them on ``node`` for sure: it is placed there by node affinity, not left to
    SPREAD (best effort: on a loaded machine it put every worker on the head node, and
    each retry started workers anew, minutes each at load ~60). The pinned worker is
    made as :func:`sealstream.distributed._shard.acquire` makes its workers."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from sealstream.distributed import _shard
    from sealstream.distributed._worker import ShardWorker

    actor = ray.remote(num_cpus=0, max_restarts=0,  # type: ignore[call-overload]
                       concurrency_groups={_shard.CKPT: 1})(ShardWorker)
    pinned = actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        node_id=node.node_id, soft=False)).remote()
    actors = [pinned, *_shard.acquire(workers - 1)]
    where = node_ids(actors)
    assert where[0] == node.node_id, f"the pinned worker runs on {where[0]}, not {node.node_id}"
    _shard.release(actors, healthy=True)
