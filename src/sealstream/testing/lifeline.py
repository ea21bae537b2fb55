"""Child processes that die with the process that started them.

A test server (a broker, an S3 server, a console) is started in a session of its own
so that a signal meant for the test run's process group does not reach it; but then a
SIGKILLed test run (``pytest`` killed by a CI timeout, say) leaves it running, holding
its ports and data directory. :func:`die_with_parent` gives ``subprocess.Popen`` a
``preexec_fn`` that asks Linux to SIGKILL the child when its parent dies
(``prctl(PR_SET_PDEATHSIG, SIGKILL)``), and kills the child at once if the parent
is already gone by the time the child runs it.

Linux only: elsewhere it returns ``None`` (no ``preexec_fn``) and nothing changes.
The signal is tied to the *thread* that started the child: start it from a thread
that lives as long as the server should (the main thread, as pytest's fixtures do),
not from a short-lived worker thread, whose end would kill the server.

>>> import subprocess, sys
>>> p = subprocess.Popen([sys.executable, "-c", "pass"], preexec_fn=die_with_parent())
>>> p.wait()
0
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

__all__ = ["die_with_parent"]

#: from <linux/prctl.h>
PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child SIGKILLed when this process dies (Linux),
    or ``None`` where that is not available."""
    if not sys.platform.startswith("linux"):
        return None
    # resolved here, in the parent: between fork and exec the child only calls it
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        if prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
        if os.getppid() != parent:  # the parent died before the line above
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec
