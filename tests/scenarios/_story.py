"""Shared pieces of the crash stories: a small realistic input, a spec, runs in
subprocesses, and the committed output read back for comparison."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sealstream.testing.specs import files_source, spec_text

ROOT = Path(__file__).resolve().parents[2]
AGGREGATES = {"n": "count", "total": "sum(amount)", "low": "min(amount)",
              "high": "max(amount)", "avg": "mean(amount)", "first_i": "first(i)",
              "last_amount": "last(amount)"}


def make_input(
    d: Path, *, partitions: int = 3, events: int = 400, seed: int = 7, bad_every: int = 0
) -> list[str]:
    """Out-of-order events with some late ones, ints and floats, a few nulls."""
    rng = random.Random(seed)
    (d / "in").mkdir(parents=True, exist_ok=True)
    names = []
    for p in range(partitions):
        t = 1_700_000_000_000
        lines = []
        for i in range(events):
            t += rng.randint(0, 400)
            ts = t - rng.randint(0, 900)
            if rng.random() < 0.04:
                ts -= 5_000  # late for a 1 s delay and small lateness
            amount: Any = rng.choice([rng.randint(-5, 50), round(rng.uniform(0, 30), 2), None])
            rec = {"user": f"u{rng.randint(0, 6)}", "ts": ts, "amount": amount, "i": i}
            if rng.random() < 0.05:
                rec["user"] = rng.randint(1, 3)  # integer keys
            lines.append(json.dumps(rec))
            if bad_every and i % bad_every == bad_every - 1:
                lines.append('{"user": "u1", "ts": "not-a-time"}')
            if rng.random() < 0.02:
                lines.append("")
        name = f"in/p{p}.jsonl"
        (d / name).write_text("\n".join(lines) + "\n")
        names.append(name)
    return names


def write_spec(
    d: Path,
    names: list[str],
    *,
    window: str = 'kind = "tumbling"\nsize_ms = 2000\nallowed_lateness_ms = 500',
    every_events: int = 120,
    keep: int = 3,
    errors: bool = False,
    batch_size: int = 50,
    checkpoints: bool = True,
) -> Path:
    """The story's spec in ``d``; ``checkpoints=False`` leaves ``[checkpoint]`` out."""
    spec = d / "spec.toml"
    spec.write_text(spec_text("story", files_source(names), batch_size=batch_size,
                              window=window, aggregates=AGGREGATES, late=True, errors=errors,
                              checkpoint='path = "ckpt"' if checkpoints else None,
                              every_events=every_events if checkpoints else None,
                              keep=keep if checkpoints else None))
    return spec


def run(spec: Path, *extra: str, crash_at: str | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ)
    e.pop("SEALSTREAM_CRASH_AT", None)
    if crash_at:
        e["SEALSTREAM_CRASH_AT"] = crash_at
    if env:
        e.update(env)
    return subprocess.run(
        [sys.executable, "-m", "sealstream", "run", str(spec), "--quiet", *extra],
        env=e, capture_output=True, text=True, timeout=120,
    )


def in_process(*args: str, env: dict[str, str | None] | None = None
               ) -> subprocess.CompletedProcess[str]:
    """``sealstream ARGS`` in this process (``sealstream.cli.main``; the CLI is thin):
    its exit code and what it printed, as :func:`subprocess.run` gives them. ``env``
    sets (or, with ``None``, removes) environment variables for the call only.

    For commands that need no process of their own (``checkpoints list|verify|...``):
    a subprocess costs a Python start and the imports of Polars and Arrow (a second or
    more on a loaded machine) and tests nothing more. Runs that are SIGKILLed, or whose
    safety net is a process limit, stay in subprocesses (:func:`run`)."""
    import contextlib
    import io

    from sealstream.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in (env or {})}

    def put(values: dict[str, str | None]) -> None:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    put(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        put(saved)
    return subprocess.CompletedProcess(["sealstream", *args], code, out.getvalue(),
                                       err.getvalue())


def run_here(spec: Path, *extra: str, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    """:func:`run` in this process (``sealstream run SPEC --quiet`` through
    :func:`in_process`): for runs that are not killed, e.g. the run that resumes
    after a SIGKILL, a reference run or a rerun. ``sealstream.cli.main`` restores the
    signal handlers and a run closes its files, connections and threads before it
    returns, so only the Python start and the Polars/Arrow imports of a subprocess
    are saved. No crash or pause point applies (``SEALSTREAM_CRASH_AT`` and
    ``SEALSTREAM_PAUSE_AT`` are unset for the call)."""
    values: dict[str, str | None] = {"SEALSTREAM_CRASH_AT": None, "SEALSTREAM_PAUSE_AT": None}
    values.update(env or {})
    return in_process("run", str(spec), "--quiet", *extra, env=values)


def run_killed_randomly(spec: Path, rng: random.Random, typical_s: float, max_rounds: int = 6,
                        env: dict[str, str] | None = None,
                        reset: Callable[[], None] | None = None) -> int:
    """SIGKILL the run at random instants, up to ``max_rounds`` times, then let it
    finish; returns the kill count, always at least 1.

    ``typical_s`` is how long an uninterrupted run of the same job took here, measured
    in the same test (a constant would be too short on a slow machine and too long on
    a fast one). Each timer is drawn in [0.05, 0.95) of the expected duration. Until
    the first kill lands, a run that finishes before its timer does not count: the
    job is set back to its start (every file the runs created under the spec's
    directory is removed, then ``reset()`` undoes what lives elsewhere, e.g. tables
    in a database) and the expected duration becomes that run's own, so the next
    draw falls inside it. After the first kill, a run that finishes ends the story.
    """
    e = dict(os.environ)
    e.pop("SEALSTREAM_CRASH_AT", None)
    e.pop("SEALSTREAM_PAUSE_AT", None)
    if env:
        e.update(env)
    home = spec.parent
    before = {p.relative_to(home) for p in home.rglob("*")}

    def set_back() -> None:
        for p in sorted(home.rglob("*"), key=lambda q: len(q.parts), reverse=True):
            if p.relative_to(home) not in before:
                if p.is_dir() and not p.is_symlink():
                    p.rmdir()
                else:
                    p.unlink()
        if reset is not None:
            reset()

    expected_s = typical_s
    kills = rounds = fresh_tries = 0
    while rounds < max_rounds:
        timer = rng.uniform(0.05, 0.95) * expected_s
        started = time.monotonic()
        with subprocess.Popen(
            [sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
            env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        ) as proc:
            try:
                _, err = proc.communicate(timeout=timer)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.communicate()
                kills += 1
                rounds += 1
                continue
        took = time.monotonic() - started
        assert proc.returncode == 0, err
        if kills:
            return kills
        # finished before the first kill: start over, timed by this very run
        fresh_tries += 1
        assert fresh_tries <= 20, f"20 runs in a row finished before a timer under {took:.2f} s"
        set_back()
        expected_s = took
    final = run(spec, env=env)
    assert final.returncode == 0, final.stderr
    return kills


def committed(d: Path, sub: str) -> list[dict[str, Any]]:
    """Every committed line of a directory output (names not starting with . or _)."""
    out: list[dict[str, Any]] = []
    folder = d / sub
    if not folder.is_dir():
        return out
    for f in sorted(folder.glob("*.jsonl")):
        if f.name.startswith((".", "_")):
            continue
        for line in f.read_text().splitlines():
            if line.strip():
                out.append(json.loads(line))
    return out


def _norm(v: Any) -> Any:
    if isinstance(v, float):
        return ("f", v)
    return (type(v).__name__, v)


def assert_same_output(actual_dir: Path, expected_dir: Path) -> None:
    """Results, late events and bad records equal an uninterrupted run, exactly once."""
    for sub, ident in (
        ("out", ("key", "window_start", "window_end")),
        ("late", ("_partition", "_offset")),
        ("errors", ("_partition", "_offset")),
    ):
        got, want = committed(actual_dir, sub), committed(expected_dir, sub)
        ids_got = [tuple(_norm(r[k]) for k in ident) for r in got]
        assert len(ids_got) == len(set(ids_got)), f"{sub}: duplicated output"
        by_id = {tuple(_norm(r[k]) for k in ident): r for r in want}
        assert sorted(map(repr, ids_got)) == sorted(map(repr, by_id)), f"{sub}: different ids"
        for r in got:
            exp = by_id[tuple(_norm(r[k]) for k in ident)]
            assert r.keys() == exp.keys()
            for k, v in r.items():
                e = exp[k]
                if isinstance(e, float) and isinstance(v, float):
                    assert math.isclose(v, e, rel_tol=1e-9, abs_tol=1e-12), (sub, k, v, e)
                else:
                    assert type(v) is type(e) and v == e, (sub, k, v, e)


def reference_run(d: Path, **spec_kw: Any) -> Path:
    """An uninterrupted run of the same story in its own directory."""
    names = make_input(d, **{k: v for k, v in spec_kw.items() if k in ("partitions", "events",
                                                                        "seed", "bad_every")})
    spec = write_spec(d, names, **{k: v for k, v in spec_kw.items()
                                   if k in ("window", "every_events", "keep", "errors",
                                            "batch_size")})
    started = time.monotonic()
    res = run(spec)
    assert res.returncode == 0, res.stderr
    (d / "duration").write_text(str(time.monotonic() - started))
    return spec


def newest_checkpoint(d: Path) -> Path:
    cps = sorted((d / "ckpt").glob("cp-*"))
    assert cps, "no checkpoint was written"
    return cps[-1]


def wait_a_bit() -> None:
    time.sleep(0.01)


def uninterrupted(**story: Any) -> Any:
    """A module-scoped ``expected`` fixture: the output directory of an uninterrupted
    run of the story (``reference_run`` keywords). In a test module::

        expected = uninterrupted(errors=True, bad_every=97)
    """
    @pytest.fixture(scope="module")
    def expected(tmp_path_factory: pytest.TempPathFactory) -> Path:
        d = tmp_path_factory.mktemp("uninterrupted")
        reference_run(d, **story)
        return d

    return expected
