"""Stories of the Kafka outputs' staging folder: two instances of one job started from
the same folder (each with its own checkpoint store, as a copy of the job) never
remove each other's staged epochs; a job whose staged rows are gone after its
manifest reads what the topic holds and goes on, or refuses with the way forward,
never stuck for ever."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from _kafka_story import assert_topics_match, kafka_spec
from _story import make_input, run, uninterrupted, write_spec

pytestmark = pytest.mark.usefixtures("kafka")

expected = uninterrupted(errors=True, bad_every=97)


def _default_staging(spec: Path, checkpoint: str = "ckpt") -> None:
    """Drop the outputs' ``path``: the default staging folder, shared by every instance
    started from the spec's folder."""
    text = re.sub(r'\npath = "staging-[a-z]+"', "", spec.read_text())
    text = text.replace('[checkpoint]\npath = "ckpt"', f'[checkpoint]\npath = "{checkpoint}"')
    spec.write_text(text)


def _staged(d: Path) -> list[Path]:
    return sorted((d / ".sealstream-staging").rglob(".part-*.arrow"))


@pytest.mark.parametrize("gone", [False, True])
def test_an_instance_with_another_store_keeps_its_hands_off_the_staged_epochs(
        tmp_path: Path, expected: Path, kafka: Any, gone: bool) -> None:
    """A is killed after its manifest named a prepared epoch, before the Kafka commit
    (its staged rows wait). B, the same job with its own checkpoint store started from
    the same folder, runs to its end. A then resumes (old code: B's start had deleted
    A's staged epoch, and A failed on every restart with "the staged rows are gone"):
    it finishes, and the topics hold every row exactly once (A's prepared epoch is not
    produced again over B's rows: their identities are in the topic).

    ``gone``: A's staged rows are deleted before it resumes. B committed epochs after
    A's checkpoint (the same results): A says so in one warning line per output and goes on."""
    names = make_input(tmp_path, bad_every=97)
    spec = write_spec(tmp_path, names, errors=True)
    topics = kafka_spec(spec, kafka.bootstrap)
    _default_staging(spec)
    b_spec = tmp_path / "b.toml"
    shutil.copy(spec, b_spec)
    _default_staging(b_spec, checkpoint="ckpt-b")
    a = run(spec, crash_at="after_manifest_publish:2")
    assert a.returncode == -9, a.stderr
    a_staged = _staged(tmp_path)
    assert a_staged, "A left no staged epoch"
    b = run(b_spec)
    assert b.returncode == 0, b.stderr
    assert all(p.exists() for p in a_staged), "B removed A's staged epoch"
    if gone:
        for p in a_staged:
            p.unlink()
    resumed = run(spec)
    assert resumed.returncode == 0, resumed.stderr
    warned = [ln for ln in resumed.stderr.splitlines() if "staged" in ln]
    assert len(warned) == (3 if gone else 0), resumed.stderr  # one per output
    assert_topics_match(kafka.bootstrap, topics, expected)
    assert not _staged(tmp_path), "staged epochs left behind"


def test_staged_rows_really_gone_are_never_a_dead_end(
        tmp_path: Path, expected: Path, kafka: Any) -> None:
    """A is killed after its manifest named a prepared epoch; its staged rows are then
    deleted. Nothing else wrote the topic: the rows are lost, and the resume refuses
    with one line that says how to go on. --start-over reads the topic back (its
    identity headers) and produces only what it does not hold: exactly once."""
    names = make_input(tmp_path, bad_every=97)
    spec = write_spec(tmp_path, names, errors=True)
    topics = kafka_spec(spec, kafka.bootstrap)
    _default_staging(spec)
    a = run(spec, crash_at="after_manifest_publish:2")
    assert a.returncode == -9, a.stderr
    staged = _staged(tmp_path)
    assert staged
    for p in staged:
        p.unlink()
    refused = run(spec)
    assert refused.returncode == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "staged rows are gone" in lines[0], refused.stderr
    assert "--start-over" in lines[0]
    over = run(spec, "--start-over")
    assert over.returncode == 0, over.stderr
    assert_topics_match(kafka.bootstrap, topics, expected)
