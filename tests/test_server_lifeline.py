"""A test server dies with the process that started it, even a SIGKILLed one.

The servers of sealstream.testing.brokers run in sessions of their own (a signal to
the test run's process group does not reach them); before they were tied to their
parent (``PR_SET_PDEATHSIG``), a SIGKILLed pytest left them running with their ports
and data. Here a pytest-like parent process starts one, reports its PID, and is
SIGKILLed; the server (and anything it started) must be gone, waited for as a
condition."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sealstream.testing.lifeline import die_with_parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="PR_SET_PDEATHSIG is Linux's")

WAIT_S = 120.0  # generous: the machine is shared and loaded

#: a pytest-like parent: starts the server, prints its PID, holds it until killed
#: ("chromium": Playwright's driver and the browser it starts, as the console's browser
#: tests do; Playwright ends them itself when its parent's pipe closes)
PARENT = r"""
import os, sys, threading
kind, data = sys.argv[1], sys.argv[2]
if kind == "chromium":
    from playwright.sync_api import sync_playwright
    pw = sync_playwright().start()
    pw.chromium.launch(executable_path=sys.argv[3], headless=True,
                       args=["--no-sandbox", "--disable-dev-shm-usage"])
    print(os.getpid(), flush=True)  # the test follows every process under this one
else:
    from sealstream.testing.brokers import KafkaBroker, NatsServer, SeaweedServer
    server = {"kafka": KafkaBroker, "nats": NatsServer, "s3": SeaweedServer}[kind](data_dir=data)
    server.start()
    print(server.pid, flush=True)
threading.Event().wait()
"""


def _stat(pid: int) -> tuple[str, int, bytes] | None:
    """(state, parent PID, start time) of a live process, None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[0].decode(), int(fields[1]), fields[19]


def _descendants(root: int) -> dict[int, bytes]:
    """``root`` and every process under it, with their start times."""
    procs = {int(n): _stat(int(n)) for n in os.listdir("/proc") if n.isdigit()}
    found = {root}
    grew = True
    while grew:
        grew = False
        for pid, st in procs.items():
            if st is not None and st[1] in found and pid not in found:
                found.add(pid)
                grew = True
    return {pid: st[2] for pid in found if (st := procs.get(pid)) is not None}


def _alive(pid: int, start: bytes) -> bool:
    st = _stat(pid)  # a zombie (not yet reaped by whoever adopted it) is dead
    return st is not None and st[2] == start and st[0] != "Z"


def _read_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            return proc.stdout.readline()
        assert proc.poll() is None, f"the parent exited with {proc.returncode}"
    raise AssertionError(f"the server did not start within {WAIT_S:.0f} s")


def _chromium() -> str:
    pytest.importorskip("playwright.sync_api")
    res = subprocess.run([str(Path(__file__).resolve().parents[1] / "scripts" /
                              "install-chromium")], capture_output=True, text=True, timeout=900)
    path = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    if res.returncode != 0 or not path:
        msg = f"no system Chromium: {res.stderr.strip()}"
        if os.environ.get("SEALSTREAM_REQUIRE_BROWSER") == "1":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return path


@pytest.mark.parametrize("kind", ["kafka", "nats", "s3", "chromium"])
def test_a_server_dies_with_its_sigkilled_parent(kind: str, tmp_path: Path) -> None:
    extra = [_chromium()] if kind == "chromium" else []
    parent = subprocess.Popen([sys.executable, "-c", PARENT, kind, str(tmp_path / "data"),
                               *extra], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ), preexec_fn=die_with_parent())
    server: dict[int, bytes] = {}
    try:
        pid = int(_read_line(parent))
        server = _descendants(pid)
        if kind == "chromium":  # the parent itself is not the server: what it started is
            server.pop(parent.pid)
            assert len(server) >= 2, f"no driver and browser under the parent: {server}"
        assert pid in server or kind == "chromium", f"the server {pid} is not running"
        parent.send_signal(signal.SIGKILL)
        assert parent.wait(WAIT_S) == -signal.SIGKILL
        deadline = time.monotonic() + WAIT_S
        while left := [p for p, start in server.items() if _alive(p, start)]:
            assert time.monotonic() < deadline, f"{kind}: still running after its " \
                f"parent's SIGKILL: {left}"
            time.sleep(0.05)  # polling for a state (the processes gone), not a timer
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        assert parent.stdout is not None
        parent.stdout.close()
        for p, start in server.items():  # only when the test failed: not left behind
            if _alive(p, start):
                os.kill(p, signal.SIGKILL)
