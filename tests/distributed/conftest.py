"""One Ray cluster per test process: two "nodes" on 127.0.0.1 (ray.cluster_utils).

Starting Ray costs seconds and about 0.7 GB, so the cluster is session-scoped and
this process stays connected to it; it is stopped through the API at the end (never
``ray stop``, which would stop every Ray on the machine). Token authentication is
on in every process of it (``RAY_AUTH_MODE=token``, the default of Ray 2.60).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

# before Ray is imported: it reads them once
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_AUTH_MODE", "token")

from _ray_nodes import NODE


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A connected Ray cluster (a head node) that tests may add nodes to and remove."""
    try:
        import ray
        from ray.cluster_utils import Cluster
    except ImportError:
        pytest.fail("ray is not installed (pip install 'sealstream[ray]'; make test does)",
                    pytrace=False)
    cluster = Cluster(initialize_head=True, head_node_args=dict(NODE))
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
