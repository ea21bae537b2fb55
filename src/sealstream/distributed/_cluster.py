"""Connecting to Ray: a cluster at an address, or a local one for the run.

A local Ray started here (always a new one, even beside another Ray on the machine)
listens on 127.0.0.1 only and is stopped through the
API when the run ends (never ``ray stop``, which stops every Ray on the machine).
Ray's token authentication follows ``RAY_AUTH_MODE`` as the user set it; a
process that joins a cluster must use the same mode as the cluster.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from sealstream.distributed._reaper import Reaper, children
from sealstream.errors import SealstreamError


class ClusterError(SealstreamError):
    """Ray cannot be started or reached, or is not installed: install
    ``sealstream[ray]``, or check the ``--ray`` address. Exit code 1."""


def connect(address: str | None, workers: int, quiet: bool = False) -> Callable[[], None]:
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
    reaper = Reaper() if address is None else None
    before = children() if reaper is not None else set()
    try:
        with _own_signals(), _quiet(quiet):
            _init(ray, address, workers)
    except Exception as exc:  # noqa: BLE001 - Ray raises bare Exception on a start timeout
        if reaper is not None:
            reaper.watch(children() - before - _pid(reaper))
            reaper.close()
        where = address or "a local Ray on 127.0.0.1"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ClusterError(f"ray: cannot start or reach {where}: {first}") from None
    if reaper is not None:  # Ray's processes die with this one, even SIGKILLed
        reaper.watch(children() - before - _pid(reaper))

    def leave() -> None:
        from sealstream.distributed._shard import drain_pool

        try:
            with _own_signals():
                drain_pool()
                ray.shutdown()
        finally:
            if reaper is not None:
                reaper.close()

    return leave


def _pid(reaper: Reaper) -> set[int]:
    return {reaper.proc.pid} if reaper.proc is not None else set()


@contextlib.contextmanager
def _own_signals() -> Iterator[None]:
    """Keep this process's SIGINT/SIGTERM handlers: ``ray.init`` installs one that
    exits with the signal's number (15), which would skip the command's own stop
    (exit 143, the resume message, the lock released)."""
    main = threading.current_thread() is threading.main_thread()
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        yield
    finally:
        for sig, handler in old.items():
            if handler is not None:
                signal.signal(sig, handler)


@contextlib.contextmanager
def _quiet(quiet: bool) -> Iterator[None]:
    """``quiet``: Ray's start-up lines (written to this process's stderr by Ray's
    Python code) are swallowed."""
    if not quiet:
        yield
        return
    sink = io.StringIO()
    with contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
        yield


def _init(ray: Any, address: str | None, workers: int) -> None:
    if address is not None:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
        return
    # "local": a Ray of this run's own, even when another Ray runs on the machine
    # (RAY_ADDRESS, or the last cluster started here): never join it. No dashboard:
    # nothing of it to outlive the run.
    ray.init(
        address="local",
        num_cpus=max(workers, os.cpu_count() or 1),
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        configure_logging=False,
    )
