"""Story: run, SIGKILL at a named step of the checkpoint/commit protocol,
restart, and the committed output equals an uninterrupted run, exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest
from _story import (
    assert_same_output,
    committed,
    make_input,
    run,
    run_here,
    uninterrupted,
    write_spec,
)

from sealstream._runtime.crash import POINTS

STORY = {"errors": True, "bad_every": 97}


expected = uninterrupted(**STORY)


def _story(d: Path) -> Path:
    names = make_input(d, bad_every=97)
    return write_spec(d, names, errors=True)


@pytest.mark.parametrize("point", [p for p in POINTS if p != "after_write_suppress"])
def test_kill_at_each_protocol_step_then_resume(tmp_path: Path, expected: Path, point: str) -> None:
    spec = _story(tmp_path)
    crashed = run(spec, crash_at=f"{point}:2")
    assert crashed.returncode == -9, f"{point} was not reached: {crashed.stderr}"
    resumed = run_here(spec)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_output(tmp_path, expected)


def test_two_crashes_in_a_row_and_a_finished_rerun_changes_nothing(
    tmp_path: Path, expected: Path
) -> None:
    spec = _story(tmp_path)
    assert run(spec, crash_at="before_manifest_publish:3").returncode == -9
    assert run(spec, crash_at="after_commit_results:2").returncode == -9
    assert run_here(spec).returncode == 0
    assert_same_output(tmp_path, expected)
    before = {p: p.read_bytes() for p in sorted((tmp_path / "out").iterdir())}
    again = run_here(spec)
    assert again.returncode == 0, again.stderr
    after = {p: p.read_bytes() for p in sorted((tmp_path / "out").iterdir())}
    assert before == after


def test_crash_without_checkpoints_leaves_nothing_half_committed(
    tmp_path: Path, expected: Path
) -> None:
    names = make_input(tmp_path, bad_every=97)
    spec = write_spec(tmp_path, names, errors=True, checkpoints=False)
    assert "[checkpoint]" not in spec.read_text()
    assert run(spec, crash_at="batch:5").returncode == -9
    assert committed(tmp_path, "out") == []
    assert run_here(spec).returncode == 0
    assert_same_output(tmp_path, expected)
    assert run_here(spec).returncode == 0  # a rerun suppresses what is committed
    assert_same_output(tmp_path, expected)


@pytest.mark.parametrize(
    "point", ["after_sink_prepare", "after_write_state", "before_manifest_publish"]
)
def test_kill_while_writing_the_very_first_checkpoint(
    tmp_path: Path, expected: Path, point: str
) -> None:
    """No checkpoint was ever published: the next run clears the crashed writer's
    directory away (as evidence) and starts from the beginning."""
    spec = _story(tmp_path)
    assert run(spec, crash_at=f"{point}:1").returncode == -9
    resumed = run_here(spec)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_output(tmp_path, expected)
    moved = list((tmp_path / "ckpt" / "rejected").glob("cp-000000000001-NO_MANIFEST-*"))
    assert len(moved) == (0 if point == "after_sink_prepare" else 1)
