"""The processes of a run's own local Ray die with the run, even after a SIGKILL.

Ray's agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) notice a dead raylet
only by reporting it to the GCS, which died too: they linger for minutes. So when a
run starts a local Ray, it also starts a small watcher process (its own session, so
that a signal to the run's process group does not reach it) holding the read end of a
pipe whose write end only the run holds. The watcher notes, every half second, the
processes descending from the ones Ray started for the run (the run tells it which:
its children that ``ray.init`` added), with their start times, so that a reused
process id is never taken for one of them. When the pipe closes (the run ended, normally or
killed), the watcher kills every noted process still alive, by its id, and exits.
Only Linux (``/proc``) is covered; elsewhere nothing is started.
"""

from __future__ import annotations

import os
import subprocess
import sys

#: the watcher's program (run with ``python -c``); it reads the process ids of the
#: processes to watch (Ray's, started by the run), one a line, from the pipe
_WATCHER = r"""
import os, select, signal, sys
roots = set()
buf = b""
def table():
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        out[int(name)] = (int(stat[1]), stat[19])
    return out
seen = {}
while True:
    procs = table()
    kids = {r for r in roots if r in procs}
    grew = True
    while grew:
        grew = False
        for pid, (ppid, start) in procs.items():
            if ppid in kids and pid not in kids:
                kids.add(pid)
                grew = True
    for pid in kids - {os.getpid()}:
        seen.setdefault(pid, procs[pid][1])
    ready, _, _ = select.select([sys.stdin], [], [], 0.5)
    if ready:
        data = os.read(sys.stdin.fileno(), 4096)
        if not data:
            break
        buf += data
        *lines, buf = buf.split(b"\n")
        roots.update(int(x) for x in lines if x.strip())
for pid, start in seen.items():
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            now = f.read().rsplit(b")", 1)[1].split()[19]
    except OSError:
        continue
    if now == start:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
"""


class Reaper:
    """Started before the local Ray; :meth:`close` (or the run's death) lets it
    kill whatever of the run's descendants is left."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        if not sys.platform.startswith("linux") or not os.path.isdir("/proc"):
            return
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WATCHER],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True)

    def watch(self, pids: set[int]) -> None:
        """Watch ``pids`` and their descendants."""
        if self.proc is None or not pids:
            return
        assert self.proc.stdin is not None
        self.proc.stdin.write("".join(f"{p}\n" for p in sorted(pids)).encode())
        self.proc.stdin.flush()

    def close(self) -> None:
        """After Ray was stopped: the watcher kills what is left and ends."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def children() -> set[int]:
    """The process ids of this process's children (empty where there is no /proc)."""
    me = os.getpid()
    out: set[int] = set()
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) == me:
            out.add(int(name))
    return out
