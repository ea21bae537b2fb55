"""Check, in your own test suite, that a new pipeline definition can resume
from checkpoints written by the deployed one.

>>> # def test_new_spec_restores(tmp_path):
>>> #     assert_restores("deploy/spec.toml", "spec.toml", tmp_path)

:func:`assert_restores` runs the *old* pipeline on its input (or on
``sample``, a list of partition files standing in for it) with outputs and
checkpoints moved into ``tmp_dir``, and stops right after the first
checkpoint that holds open windows. It then runs the *new* pipeline, with its
outputs in the same place, to the end of the input: it must resume from that
checkpoint (not refuse it) and its results must equal an uninterrupted run of
the new pipeline. Otherwise an :class:`AssertionError` explains why, with the
definition diff when the saved state does not fit (see
:mod:`sealstream._runtime.engine`: every change of what the state depends on
is refused, including an added aggregate).

Nothing outside ``tmp_dir`` is written; the pipelines' own output and
checkpoint directories are not touched.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from sealstream._runtime.crash import CrashPoints
from sealstream._runtime.engine import DefinitionMismatchError, Job, RunSummary
from sealstream._runtime.replay import replay_pipeline
from sealstream.errors import SealstreamError, SpecError
from sealstream.pipeline import Checkpoints, Pipeline, load_spec
from sealstream.pipeline.source import Sources

__all__ = ["assert_restores"]


def _load(p: Pipeline | str | Path) -> Pipeline:
    return p if isinstance(p, Pipeline) else load_spec(p)


def _isolated(p: Pipeline, dest: Path, every_events: int | None, batch_size: int | None,
              sample: Sequence[str | Path] | None) -> Pipeline:
    """``p`` with outputs and checkpoints under ``dest``; ``every_events`` None
    checkpoints only at the end of the input."""
    iso = replay_pipeline(p, dest)
    assert iso.checkpoint is not None
    ckpt: Checkpoints = replace(iso.checkpoint, every_events=every_events, every_ms=None,
                                keep=1_000_000)
    iso = replace(iso, checkpoint=ckpt, batch_size=batch_size or p.batch_size)
    if sample is not None:
        if isinstance(iso.source, Sources):
            raise SpecError("sample: a sample of several sources is not supported yet")
        paths = tuple(str(Path(s).resolve()) for s in sample)
        iso = replace(iso, source=replace(iso.source, paths=paths))
    return iso


def _results(directory: Path) -> dict[str, dict[str, Any]]:
    """Committed results of a jsonl directory by identity (key, window)."""
    out: dict[str, dict[str, Any]] = {}
    if directory.is_dir():
        for f in sorted(directory.glob("*.jsonl")):
            if f.name.startswith((".", "_")):
                continue
            for line in f.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    r = json.loads(line)
                    ident = json.dumps([r.get("key"), r.get("window_start"), r.get("window_end")])
                    out[ident] = r
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return type(a) is type(b) and a == b


def _run(job: Job, what: str) -> RunSummary:
    try:
        return job.run()
    except DefinitionMismatchError:
        raise
    except SealstreamError as err:
        raise AssertionError(f"the {what} failed: {err}") from None


def assert_restores(
    old: Pipeline | str | Path,
    new: Pipeline | str | Path,
    tmp_dir: str | Path,
    *,
    sample: Sequence[str | Path] | None = None,
    every_events: int = 8,
    batch_size: int = 4,
) -> dict[str, Any]:
    """Assert that ``new`` resumes from a checkpoint ``old`` wrote with open windows.

    ``old``/``new`` are :class:`Pipeline` objects or spec paths. ``sample``
    replaces the source's files (same number, same order). Returns what was
    checked (the checkpoint id, its open windows, result counts).
    """
    old_p, new_p = _load(old), _load(new)
    root = Path(tmp_dir).resolve() / "sealstream-compat"
    if root.exists() and any(root.iterdir()):
        raise AssertionError(f"{root} is not empty; give assert_restores a fresh tmp_dir")
    resumed = root / "resumed"
    old_iso = _isolated(old_p, resumed, every_events, batch_size, sample)
    new_iso = _isolated(new_p, resumed, None, None, sample)
    quiet = CrashPoints("")

    first = Job(old_iso, crash=quiet, stop_when=lambda j: bool(
        j.operator is not None and j.operator.open_windows > 0))
    s1 = _run(first, "run of the old pipeline")
    if not first.stopped_early:
        raise AssertionError(
            "the old pipeline never wrote a checkpoint with open windows before the end of "
            f"its input ({s1.counters.events} events); give a larger sample or a smaller "
            "every_events"
        )
    cid = s1.checkpoints.last_id
    open_windows = s1.open_windows

    second = Job(new_iso, crash=quiet)
    try:
        s2 = _run(second, "resumed run of the new pipeline")
    except DefinitionMismatchError as err:
        raise AssertionError(
            f"the new pipeline cannot resume from checkpoint {cid} of the old one "
            f"({open_windows} open windows):\n{err}"
        ) from None
    if s2.resumed_from != cid:
        raise AssertionError(
            f"the new pipeline did not resume from checkpoint {cid} of the old one "
            f"(resumed from {s2.resumed_from}; rejected: {json.dumps(s2.rejected)})"
        )

    fresh = root / "fresh"
    fresh_iso = _isolated(new_p, fresh, None, None, sample)
    s3 = _run(Job(fresh_iso, crash=quiet), "uninterrupted run of the new pipeline")
    if new_iso.sink.kind == "jsonl":
        got = _results(new_iso.sink.resolved)
        want = _results(fresh_iso.sink.resolved)
        missing = sorted(set(want) - set(got))[:3]
        extra = sorted(set(got) - set(want))[:3]
        differ = [k for k in sorted(set(got) & set(want))
                  if got[k].keys() != want[k].keys()
                  or not all(_same(v, want[k][f]) for f, v in got[k].items())][:3]
        if missing or extra or differ:
            raise AssertionError(
                "resuming the new pipeline from the old checkpoint gives other results than "
                f"an uninterrupted run: missing {missing}, unexpected {extra}, "
                f"different values {differ}"
            )
    return {
        "checkpoint": cid,
        "open_windows": open_windows,
        "events_before_checkpoint": s1.counters.events,
        "results": s2.counters.results_written,  # counters carry on from the checkpoint
        "results_uninterrupted": s3.counters.results_written,
    }
