"""Story: SIGKILL the job at random instants, over and over, until it finishes;
the output is exactly that of an uninterrupted run."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from _story import (
    assert_same_output,
    make_input,
    reference_run,
    run_killed_randomly,
    write_spec,
)

WINDOWS = {
    "tumbling": 'kind = "tumbling"\nsize_ms = 2000\nallowed_lateness_ms = 500',
    "sliding": 'kind = "sliding"\nsize_ms = 3000\nslide_ms = 1000\nallowed_lateness_ms = 0',
    "session": 'kind = "session"\ngap_ms = 1500\nallowed_lateness_ms = 200',
}


@pytest.mark.parametrize("kind", sorted(WINDOWS))
def test_random_sigkills(tmp_path: Path, kind: str) -> None:
    story = {"events": 3000, "window": WINDOWS[kind], "every_events": 400, "batch_size": 100,
             "bad_every": 0}
    reference_run(tmp_path / "ref", **story)
    d = tmp_path / "killed"
    names = make_input(d, events=3000)
    spec = write_spec(d, names, window=WINDOWS[kind], every_events=400, batch_size=100)
    typical = float((tmp_path / "ref" / "duration").read_text())
    kills = run_killed_randomly(spec, random.Random(kind), typical)
    assert kills >= 1
    assert_same_output(d, tmp_path / "ref")


def test_a_machine_faster_than_its_calibration_is_still_killed(tmp_path: Path) -> None:
    """The calibration said 20 times longer than this machine needs (as a fixed
    timer would on a fast machine): the first run finishes before its timer, the
    job starts over timed by that run, and is really killed at least once."""
    story = {"events": 3000, "every_events": 400, "batch_size": 100, "bad_every": 0}
    reference_run(tmp_path / "ref", **story)
    d = tmp_path / "killed"
    spec = write_spec(d, make_input(d, events=3000), every_events=400, batch_size=100)
    typical = float((tmp_path / "ref" / "duration").read_text())
    kills = run_killed_randomly(spec, random.Random(3), 20 * typical)
    assert kills >= 1
    assert_same_output(d, tmp_path / "ref")
