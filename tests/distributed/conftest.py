"""One Ray cluster per test process: two "nodes" on 127.0.0.1 (ray.cluster_utils).

Starting Ray costs seconds and about 0.7 GB, so the cluster is session-scoped and
this process stays connected to it; it is stopped through the API at the end (never
``ray stop``, which would stop every Ray on the machine). Token authentication is
on in every process of it (``RAY_AUTH_MODE=token``, the default of Ray 2.60).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# before Ray is imported: it reads them once
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_AUTH_MODE", "token")
if (os.environ["RAY_AUTH_MODE"].lower() == "token" and not os.environ.get("RAY_AUTH_TOKEN")
        and not os.environ.get("RAY_AUTH_TOKEN_PATH")):
    # ray.init() makes ~/.ray/auth_token on first use, ray.cluster_utils does not:
    # on a machine where no Ray ran before, the test cluster's GCS would die at start
    # ("Token authentication is enabled but Ray couldn't find an authentication
    # token"). A token of this session, inherited by every process of the cluster
    # and by the runs the tests start; nothing is written to the home directory.
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)

from _ray_nodes import NODE


def _descendants() -> set[int]:
    """The PIDs of this process's descendants (from /proc: no psutil here)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            parent[int(entry)] = int(stat.rpartition(")")[2].split()[1])
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - found
        found |= frontier
    return found


def _start_head(cluster_class: Any) -> Any:
    """The cluster's head node, started again (up to 3 times) when Ray gives up on it:
    Ray 2.60 waits a hard-coded 30 s for a node to register ("The current node timed out
    during startup"), which a loaded machine can exceed. The half-started node's
    processes are stopped by their PIDs before the next try."""
    for attempt in range(3):
        before = _descendants()
        try:
            return cluster_class(initialize_head=True, head_node_args=dict(NODE))
        except Exception as exc:
            if "timed out during startup" not in str(exc) or attempt == 2:
                raise
            for pid in _descendants() - before:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A connected Ray cluster (a head node) that tests may add nodes to and remove."""
    try:
        import ray
        from ray.cluster_utils import Cluster
    except ImportError:
        pytest.fail("ray is not installed (pip install 'sealstream[ray]'; make test does)",
                    pytrace=False)
    # never S3 credentials, whichever test starts it (one that set AWS_* for its own
    # server, say): its processes inherit this environment, and a test relies on a
    # worker node without credentials (test_s3_worker_outputs.py starts a cluster of
    # its own that has them)
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("AWS_")}
    try:
        cluster = _start_head(Cluster)
    finally:
        os.environ.update(saved)
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="session")
def live_story(kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """tests/distributed/_live_case.py's topic and one process's output of it, made
    once per test process for the test_live_*.py files (they only read it)."""
    from _live_case import make_story

    return make_story(kafka.bootstrap, tmp_path_factory.mktemp("live-ref"))


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``reference(**story)``: the directory of an uninterrupted single-process run of
    the story (tests/scenarios/_story.py's ``reference_run`` keywords), made once per
    test process and set of keywords. The tests only read it (assert_same_output)."""
    from scenarios._story import reference_run

    made: dict[str, Path] = {}

    def get(**story: Any) -> Path:
        key = json.dumps(story, sort_keys=True)
        if key not in made:
            d = tmp_path_factory.mktemp("reference")
            reference_run(d, **story)
            made[key] = d
        return made[key]

    return get
