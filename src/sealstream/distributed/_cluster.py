"""Connecting to Ray: a cluster at an address, or a local one for the run.

A local Ray started here (always a new one, even beside another Ray on the machine)
listens on 127.0.0.1 only and is stopped through the
API when the run ends (never ``ray stop``, which stops every Ray on the machine).
Ray's token authentication follows ``RAY_AUTH_MODE`` as the user set it; a
process that joins a cluster must use the same mode as the cluster.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from sealstream.errors import SealstreamError


class ClusterError(SealstreamError):
    """Ray cannot be started or reached, or is not installed: install
    ``sealstream[ray]``, or check the ``--ray`` address. Exit code 1."""


def connect(address: str | None, workers: int) -> Callable[[], None]:
    """Join the cluster at ``address`` (or start a local one); return how to leave it.

    When this process is already connected (``ray.init`` called by the user),
    that connection is used and left open.
    """
    try:
        import ray
    except ImportError:
        raise ClusterError(
            "--workers needs Ray: install it with pip install 'sealstream[ray]'"
        ) from None
    if ray.is_initialized():
        return lambda: None
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        if address is not None:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        else:
            # "local": a Ray of this run's own, even when another Ray runs on the
            # machine (RAY_ADDRESS, or the last cluster started here): never join it
            ray.init(
                address="local",
                num_cpus=max(workers, os.cpu_count() or 1),
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                log_to_driver=False,
                configure_logging=False,
            )
    except Exception as exc:  # noqa: BLE001 - Ray raises bare Exception on a start timeout
        where = address or "a local Ray on 127.0.0.1"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ClusterError(f"ray: cannot start or reach {where}: {first}") from None
    def leave() -> None:
        from sealstream.distributed._shard import drain_pool

        drain_pool()
        ray.shutdown()

    return leave
