"""SIGTERM and SIGINT stop a run with one clear line and the documented exit code
(143 and 130: 128 + the signal's number), and nothing committed is lost: the next
run resumes from the checkpoint the line names and the output is exactly once.

The signal is sent at a deterministic point: after the first checkpoint's log line
has been read from the child's stderr (byte by byte, so nothing more is taken
from the pipe). The child is then certainly still running, because it has more
log lines to write than the pipe can hold and nobody reads them until the signal
is sent. No timer decides anything here. The pipe is made before the child starts
and shrunk to one page, so a short run (30 checkpoints) already overfills it.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import sealstream
from sealstream.checkpoint.manifest import KEY_ENV
from sealstream.cli import main
from test_pipeline_spec import base_spec, write_spec

SRC = Path(sealstream.__file__).resolve().parents[1]  # the package under test
PARTITIONS = 8
LINES = 150  # per partition
EVERY = 40  # events per checkpoint: 30 checkpoints, 1 KB of log line each
F_SETPIPE_SZ = 1031
F_GETPIPE_SZ = 1032
PIPE_BYTES = 4096  # the smallest pipe Linux makes (one page)


def _job(d: Path) -> Path:
    paths = []
    for p in range(PARTITIONS):
        name = f"in/p{p}.jsonl"
        path = d / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(
            json.dumps({"user": f"u{(i * 7 + p) % 13}", "ts": i * 1000 + p, "amount": i}) + "\n"
            for i in range(LINES)), encoding="utf-8")
        paths.append(name)
    spec = base_spec()
    spec["source"]["paths"] = paths
    spec["window"]["size_ms"] = 10_000
    spec["checkpoint"]["every_events"] = EVERY
    spec["checkpoint"]["keep"] = 2
    return write_spec(d, spec)


def _results(d: Path) -> list[tuple[Any, ...]]:
    rows = [json.loads(x) for f in sorted((d / "out").glob("part-*.jsonl"))
            for x in f.read_text(encoding="utf-8").splitlines()]
    return sorted((r["key"], r["window_start"], r["n"], r["total"]) for r in rows)


def _read_line(fd: int) -> bytes:
    out = bytearray()
    while not out.endswith(b"\n"):
        b = os.read(fd, 1)
        if not b:
            break
        out += b
    return bytes(out)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_the_run_with_one_line_and_the_next_run_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    sig: signal.Signals, code: int,
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv("SEALSTREAM_CRASH_AT", raising=False)
    ref = _job(tmp_path / "ref")
    assert main(["run", str(ref), "--quiet"]) == 0
    want = _results(tmp_path / "ref")
    d = tmp_path / "job"
    spec = _job(d)
    env = dict(os.environ, PYTHONPATH=str(SRC))
    fd, child_end = os.pipe()  # the child's stderr, one page, before the child starts
    fcntl.fcntl(child_end, F_SETPIPE_SZ, PIPE_BYTES)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "sealstream", "run", str(spec),
                                 "--json"], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=child_end, bufsize=0)
    finally:
        os.close(child_end)
    try:
        capacity = fcntl.fcntl(fd, F_GETPIPE_SZ)
        first = json.loads(_read_line(fd))
        assert first["event"] == "checkpoint" and first["id"] == 1
        # what is left to log is more than the pipe holds: the child cannot end yet
        assert (LINES * PARTITIONS // EVERY - 2) * len(json.dumps(first)) > 2 * capacity
        proc.send_signal(sig)
        with os.fdopen(fd, "rb", closefd=False) as rest:
            err = rest.read()  # to the child's end (it holds the write end)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(fd)
    lines = err.decode().splitlines()
    assert proc.returncode == code, err.decode()[-2000:]
    assert "Traceback" not in err.decode() and out == b""
    last = lines[-1]
    prefix = (f"sealstream: interrupted by {sig.name}; committed output is intact; "
              "the next run resumes from checkpoint ")
    assert last.startswith(prefix), last
    resume = int(last[len(prefix):])
    assert all(json.loads(x)["event"] == "checkpoint" for x in lines[:-1])
    logged = [first["id"], *(json.loads(x)["id"] for x in lines[:-1])]
    assert resume >= max(logged)
    assert resume < LINES * PARTITIONS // EVERY  # stopped before the end
    # the named checkpoint is the one a run resumes from
    assert main(["checkpoints", "verify", str(d / "ckpt"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["resume_from"] == resume
    assert main(["run", str(spec), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["resumed_from"] == resume
    assert _results(d) == want  # every window once, with the uninterrupted values


# A SIGINT while Polars runs a query (here: a step of the query sends it to its own
# process). Polars' import puts a SIGINT handler of its own in front of Python's,
# which aborts the query with a KeyboardInterrupt; the first signal to a live run
# must instead only ask the run to finish its step (the CI once saw a never-ending
# NATS run end "aborted", exit 1, this way). `_reclaim_signals` is what `run` calls
# once Polars is imported.
_SIGNAL_IN_A_QUERY = """
import os, signal, sys
import sealstream.cli as cli

class Live:
    stop_requested = None

cli._catch_signals()
cli._GRACEFUL[:] = [Live]
import polars as pl

cli._reclaim_signals()

sent = []

def step(s):
    if not sent:  # once: a second signal stops the run at once, by design
        sent.append(os.kill(os.getpid(), signal.SIGINT))
    return s

df = pl.DataFrame({"a": range(50_000), "g": [i % 7 for i in range(50_000)]})
for _ in range(3):
    out = (df.lazy().with_columns(pl.col("a").map_batches(step, return_dtype=pl.Int64))
           .group_by("g").agg(pl.col("a").sum()).collect())
print(Live.stop_requested, out["a"].sum())
"""


def test_a_sigint_inside_a_polars_query_reaches_the_run_and_not_polars() -> None:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    done = subprocess.run([sys.executable, "-c", _SIGNAL_IN_A_QUERY], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    # the run was asked to stop, and the query the signal came in, and the next ones,
    # finished
    assert done.stdout.split() == [str(int(signal.SIGINT)), str(sum(range(50_000)))]
    assert "sealstream: SIGINT: finishing the step" in done.stderr
