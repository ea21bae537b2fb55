"""Ray's start and stop around ``sealstream run --workers N`` (a local Ray of the
run's own, in a subprocess, not on a terminal): SIGTERM stops cleanly with exit 143
and the one-line resume message, ``-q`` prints nothing, ``--json`` reports the
workers and the start and engine times apart, and after a SIGKILL of the
coordinator none of the Ray processes it started (agents included) outlives it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scenarios._story import ROOT, assert_same_output, make_input, reference_run, write_spec

STORY = {"events": 40_000, "every_events": 3_000, "batch_size": 500}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _start(spec: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sealstream", "run", str(spec), "--workers", "2", *extra],
        cwd=spec.parent, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=_env())


def _wait_checkpoint_line(proc: subprocess.Popen[str]) -> list[str]:
    """stderr lines up to the first checkpoint's log line (the run is processing)."""
    assert proc.stderr is not None
    seen: list[str] = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("{") and json.loads(line).get("event") == "checkpoint":
            return seen
    raise AssertionError(f"the run ended before a checkpoint: {''.join(seen)}")


def test_sigterm_stops_with_143_and_the_resume_line_then_resumes(
        tmp_path: Path, ray_cluster: Any) -> None:
    """The stopped run started its own Ray (its stop is what is checked); the resume
    checks the output only, so it runs on the session's cluster (one Ray start less)."""
    d = tmp_path / "run"
    names = make_input(d, events=STORY["events"])
    spec = write_spec(d, names, every_events=STORY["every_events"],
                      batch_size=STORY["batch_size"])
    proc = _start(spec)
    before = _wait_checkpoint_line(proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=600)
    lines = [ln for ln in (before + err.splitlines(keepends=True)) if ln.strip()]
    assert proc.returncode == 143, "".join(lines)
    assert lines[-1].startswith("sealstream: interrupted by SIGTERM;"), lines[-1]
    assert "the next run resumes from checkpoint" in lines[-1]
    noise = [ln for ln in lines if not ln.startswith(("{", "sealstream: ", "Token auth"))]
    assert not noise, "".join(noise)  # no traceback, no Ray crash dump
    again = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "-q",
                            "--workers", "2", "--ray", ray_cluster.address], cwd=d,
                           capture_output=True, text=True, env=_env(), timeout=900)
    assert again.returncode == 0, again.stderr
    reference_run(tmp_path / "ref", **STORY)
    assert_same_output(d, tmp_path / "ref")


def test_quiet_prints_nothing_and_json_reports_ray_and_engine_apart(tmp_path: Path) -> None:
    d = tmp_path / "run"
    names = make_input(d, events=2_000)
    spec = write_spec(d, names, every_events=1_000, batch_size=200)
    quiet = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "-q",
                            "--workers", "2"], cwd=d, capture_output=True, text=True,
                           env=_env(), timeout=900)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == "" and quiet.stderr == "", quiet.stderr  # no Ray banner
    shown = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--json",
                            "--start-over", "--workers", "2"], cwd=d, capture_output=True,
                           text=True, env=_env(), timeout=900)
    assert shown.returncode == 0, shown.stderr
    dist = json.loads(shown.stdout)["distributed"]
    assert dist["workers"] == 2
    assert dist["ray_start_s"] > 0 and dist["worker_start_s"] > 0 and dist["engine_s"] > 0
    assert dist["engine_s"] <= json.loads(shown.stdout)["seconds"]


def _children_of(root: int) -> dict[int, bytes]:
    """Every process descending from ``root``, with its start time."""
    table: dict[int, tuple[int, bytes]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = (Path("/proc") / name / "stat").read_bytes().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            table[int(name)] = (int(stat[1]), stat[19])
    kids: dict[int, bytes] = {}
    grew = True
    while grew:
        grew = False
        for pid, (ppid, start) in table.items():
            if (ppid == root or ppid in kids) and pid not in kids:
                kids[pid] = start
                grew = True
    return kids


def _still_there(procs: dict[int, bytes]) -> list[str]:
    left = []
    for pid, start in procs.items():
        try:
            raw = (Path("/proc") / str(pid) / "stat").read_bytes()
        except OSError:
            continue
        fields = raw.rsplit(b")", 1)[1].split()
        if fields[19] == start and fields[0] != b"Z":
            left.append(f"{pid} {(Path('/proc') / str(pid) / 'cmdline').read_bytes()[:60]!r}")
    return left


def test_no_ray_process_outlives_a_sigkilled_coordinator(tmp_path: Path) -> Any:
    d = tmp_path / "run"
    names = make_input(d, events=STORY["events"])
    spec = write_spec(d, names, every_events=STORY["every_events"],
                      batch_size=STORY["batch_size"])
    proc = _start(spec)
    _wait_checkpoint_line(proc)
    ray_procs = _children_of(proc.pid)
    names_seen = b" ".join((Path("/proc") / str(p) / "cmdline").read_bytes()
                           for p in ray_procs if (Path("/proc") / str(p)).exists())
    assert b"ray::DashboardAgent" in names_seen and b"ray::ShardWorker" in names_seen
    proc.kill()
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 20  # "a few seconds", on a loaded machine
    left = _still_there(ray_procs)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _still_there(ray_procs)
    assert not left, left
