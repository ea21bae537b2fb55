"""Checkpoint writes that really fail: a file-size limit (EFBIG), a full filesystem
(ENOSPC) and a read-only checkpoint directory.

Contract: the run stops with exit 1 and one line naming the checkpoint directory
and the cause; the checkpoints written before stay ATOMIC_CHECKPOINT; a rerun
without the limit finishes with output equal to an uninterrupted run.

Tests run as root, so permissions do not stop writes: the failures come from
``RLIMIT_FSIZE`` and from tmpfs mounts (skipped when mounting is not permitted).
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _story import assert_same_output, committed, run, write_spec

# a day-long window: every key stays open until the end, so the window state —
# and the state file of each checkpoint — grows by ~3.5 KB per checkpoint
_WINDOW = 'kind = "tumbling"\nsize_ms = 86400000\nallowed_lateness_ms = 500'
_FAILED = "cannot write checkpoint"


def _story(d: Path, *, keep: int = 100) -> Path:
    """Input whose keys are all distinct (growing state) and its spec."""
    rng = random.Random(3)
    (d / "in").mkdir(parents=True, exist_ok=True)
    names = []
    for p in range(2):
        t = 1_700_000_000_000
        lines = []
        for i in range(600):
            t += rng.randint(0, 400)
            lines.append(json.dumps({"user": f"k{p}-{i}", "ts": t - rng.randint(0, 900),
                                     "amount": rng.randint(0, 50), "i": i}))
        (d / f"in/p{p}.jsonl").write_text("\n".join(lines) + "\n")
        names.append(f"in/p{p}.jsonl")
    return write_spec(d, names, window=_WINDOW, every_events=200, keep=keep)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("reference")
    res = run(_story(d))
    assert res.returncode == 0, res.stderr
    assert committed(d, "out"), "the reference run committed nothing"
    return d


def _verdicts(ckdir: Path) -> list[dict[str, object]]:
    res = subprocess.run(
        [sys.executable, "-m", "sealstream", "checkpoints", "verify", str(ckdir), "--json"],
        capture_output=True, text=True, timeout=60,
    )
    assert res.returncode in (0, 1), res.stderr
    checkpoints: list[dict[str, object]] = json.loads(res.stdout)["checkpoints"]
    return checkpoints


def _assert_failed_cleanly(d: Path, res: subprocess.CompletedProcess[str], cause: str) -> None:
    assert res.returncode == 1, (res.returncode, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr  # one line, no traceback
    msg = lines[0]
    assert "Traceback" not in res.stderr
    assert _FAILED in msg and str(d / "ckpt") in msg and cause in msg, msg
    verdicts = _verdicts(d / "ckpt")
    atomic = [v for v in verdicts if v["verdict"] == "ATOMIC_CHECKPOINT"]
    assert len(atomic) >= 2, verdicts  # the failure hit a later checkpoint
    # every checkpoint written before the failure is intact; at most the failed one
    # (the newest, never published) is left behind, recognisably partial
    others = [v for v in verdicts if v["verdict"] != "ATOMIC_CHECKPOINT"]
    assert all(v["reason"] == "NO_MANIFEST" for v in others), others
    newest_atomic = max(int(str(v["id"])) for v in atomic)
    assert all(int(str(v["id"])) > newest_atomic for v in others), verdicts
    assert str(newest_atomic + 1) in msg.split(_FAILED, 1)[1].split()[0]


def _rerun_equals_reference(d: Path, reference: Path) -> None:
    res = run(d / "spec.toml")
    assert res.returncode == 0, res.stderr
    assert_same_output(d, reference)
    verdicts = _verdicts(d / "ckpt")
    assert verdicts and all(v["verdict"] == "ATOMIC_CHECKPOINT" for v in verdicts), verdicts


# ----------------------------------------------------------------- (a) EFBIG
def _limit_file_size(limit: int) -> Callable[[], None]:
    def pre() -> None:
        # ignored SIGXFSZ: the write fails with EFBIG instead of killing the process
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return pre


def test_file_size_limit_fails_a_later_checkpoint_cleanly(tmp_path: Path,
                                                          reference: Path) -> None:
    spec = _story(tmp_path)
    # state files grow ~7 KB, ~10.5 KB, ~14.5 KB, ~18 KB...: the 4th exceeds 16000 bytes
    res = subprocess.run(
        [sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
        capture_output=True, text=True, timeout=120, preexec_fn=_limit_file_size(16_000),
    )
    _assert_failed_cleanly(tmp_path, res, "File too large")
    _rerun_equals_reference(tmp_path, reference)


# ----------------------------------------------------------------- tmpfs mounts
def _mount(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def tmpfs_ckpt(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path/ckpt`` as a 48 KiB tmpfs (skips when mounting is not permitted)."""
    target = tmp_path / "ckpt"
    target.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command: cannot make a small filesystem")
    res = _mount(["-t", "tmpfs", "-o", "size=48k,mode=0700", "tmpfs", str(target)])
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root/CAP_SYS_ADMIN): {res.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], capture_output=True, timeout=30)


def test_full_filesystem_fails_a_later_checkpoint_cleanly(tmp_path: Path, tmpfs_ckpt: Path,
                                                          reference: Path) -> None:
    spec = _story(tmp_path)
    # 48 KiB in 4 KiB pages: the lock, then checkpoints of 16 KiB, 20 KiB, 24 KiB...
    res = run(spec)
    _assert_failed_cleanly(tmp_path, res, "No space left on device")
    grown = _mount(["-o", "remount,size=16m", str(tmpfs_ckpt)])
    assert grown.returncode == 0, grown.stderr
    _rerun_equals_reference(tmp_path, reference)


# ----------------------------------------------------------------- (c) read-only
def _assert_clear_start_error(res: subprocess.CompletedProcess[str], path: Path) -> None:
    assert res.returncode in (1, 2), (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sealstream: error:"), res.stderr
    assert str(path) in lines[0], lines[0]


def test_read_only_checkpoint_directory_is_refused_at_start(tmp_path: Path,
                                                            tmpfs_ckpt: Path) -> None:
    spec = _story(tmp_path)
    ro = _mount(["-o", "remount,ro", str(tmpfs_ckpt)])
    if ro.returncode != 0:
        pytest.skip(f"cannot remount the tmpfs read-only: {ro.stderr.strip()}")
    res = run(spec)
    _assert_clear_start_error(res, tmpfs_ckpt)
    assert "Read-only file system" in res.stderr
    assert committed(tmp_path, "out") == []


def test_checkpoint_path_under_a_regular_file_is_refused_at_start(tmp_path: Path) -> None:
    spec = _story(tmp_path)
    (tmp_path / "blocker").write_text("not a directory\n")
    spec.write_text(spec.read_text().replace('path = "ckpt"', 'path = "blocker/ckpt"'))
    res = run(spec)
    _assert_clear_start_error(res, tmp_path / "blocker" / "ckpt")
    assert committed(tmp_path, "out") == []
