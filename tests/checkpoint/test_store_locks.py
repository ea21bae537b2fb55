"""One writer per job, across processes, on every store: a second process is refused
with the holder named, and a SIGKILLed holder's lock is free again (the kernel drops a
flock, the server drops an advisory lock with the connection)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from sealstream.checkpoint.stores import open_store
from sealstream.errors import LockHeldError

HOLD = """
import sys, time
from pathlib import Path
from sealstream.checkpoint.stores import open_store
store = open_store(sys.argv[1], "job", Path(sys.argv[2]))
with store.locked():
    print("locked", flush=True)
    time.sleep(120)
"""


@pytest.fixture(params=["directory", "sqlite", "postgresql"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "directory":
        return str(tmp_path / "ckpt")
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ckpt.db'}"
    return str(request.getfixturevalue("pg_url"))


def test_second_process_is_refused_until_the_holder_dies(where: str, tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, where, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    store = open_store(where, "job", tmp_path)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        with pytest.raises(LockHeldError, match=f'"pid": {proc.pid}'):
            with store.locked():
                pass
        if "://" in where:  # a database holds many jobs; a directory belongs to one
            other = open_store(where, "other-job", tmp_path)
            with other.locked():  # another job in the same database is not blocked
                pass
            other.close()
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 10
        while store.is_locked() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        with store.locked():
            assert store.is_locked() is not None
        assert store.is_locked() is None
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
        store.close()
