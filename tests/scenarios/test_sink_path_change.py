"""Story: a job is killed, its outputs' paths are changed in the spec, and it resumes.

Output committed or prepared before the change stays where it was staged (the
checkpoint records the directory of its epoch); new output goes to the new paths.
Across the old and the new directories every result, late event and bad record is
there exactly once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from _story import (
    assert_same_output,
    committed,
    make_input,
    newest_checkpoint,
    run,
    uninterrupted,
    write_spec,
)

STORY = {"errors": True, "bad_every": 97}
SUBS = ("out", "late", "errors")

expected = uninterrupted(**STORY)


def _story(d: Path) -> Path:
    names = make_input(d, bad_every=97)
    return write_spec(d, names, errors=True)


def _move_outputs(spec: Path, suffix: str) -> None:
    text = spec.read_text()
    for sub in SUBS:
        old = f'path = "{sub}"'
        assert old in text
        text = text.replace(old, f'path = "{sub}{suffix}"')
    spec.write_text(text)


def _merged(d: Path, suffixes: tuple[str, ...]) -> Path:
    """The committed files of every generation of the outputs, side by side."""
    merged = d / "merged"
    for sub in SUBS:
        (merged / sub).mkdir(parents=True)
        for suffix in suffixes:
            for f in sorted((d / f"{sub}{suffix}").glob("part-*.jsonl")):
                assert not (merged / sub / f.name).exists()
                shutil.copy(f, merged / sub / f.name)
    return merged


def test_paths_changed_after_a_kill_between_publish_and_commit(
    tmp_path: Path, expected: Path
) -> None:
    spec = _story(tmp_path)
    crashed = run(spec, crash_at="after_manifest_publish:2")
    assert crashed.returncode == -9, crashed.stderr
    staged = sorted(p.name for p in (tmp_path / "out").glob(".part-*.inprogress"))
    assert staged, "the published checkpoint's epoch was not left prepared"
    manifest = json.loads((newest_checkpoint(tmp_path) / "MANIFEST.json").read_text())

    _move_outputs(spec, "2")
    resumed = run(spec)
    assert resumed.returncode == 0, resumed.stderr
    # the prepared epoch was committed where it was staged; the crashed run's later
    # staging there (no checkpoint refers to it) is gone
    tokens = manifest["sinks"]["results"]["tokens"]
    assert tokens and all(f".{t}.inprogress" in staged for t in tokens)
    old = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert set(tokens) <= set(old)
    assert not [n for n in old if n.endswith(".inprogress")]
    for sub in SUBS:
        assert committed(tmp_path, f"{sub}2"), f"no new output in {sub}2"
    assert_same_output(_merged(tmp_path, ("", "2")), expected)
    # the checkpoint recorded where its epoch was staged
    assert manifest["sinks"]["results"].get("path") == str((tmp_path / "out").resolve())
    # a finished rerun changes nothing in either generation
    before = {p: p.read_bytes() for s in SUBS for x in ("", "2")
              for p in sorted((tmp_path / f"{s}{x}").iterdir())}
    assert run(spec).returncode == 0
    after = {p: p.read_bytes() for s in SUBS for x in ("", "2")
             for p in sorted((tmp_path / f"{s}{x}").iterdir())}
    assert before == after


def test_paths_changed_then_a_fallback_past_a_broken_checkpoint(
    tmp_path: Path, expected: Path
) -> None:
    """The newest checkpoint's epoch was committed in the old directories, then that
    checkpoint is damaged: the resume falls back to the one before, at the new paths,
    and does not produce again what the old directories hold past it."""
    spec = _story(tmp_path)
    assert run(spec, crash_at="after_retention:3").returncode == -9
    newest = newest_checkpoint(tmp_path)
    state = newest / "state.arrow"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))

    _move_outputs(spec, "2")
    resumed = run(spec)
    assert resumed.returncode == 0, resumed.stderr
    assert list((tmp_path / "ckpt" / "rejected").glob(f"{newest.name}-*"))
    assert_same_output(_merged(tmp_path, ("", "2")), expected)


def test_paths_changed_twice(tmp_path: Path, expected: Path) -> None:
    spec = _story(tmp_path)
    assert run(spec, crash_at="after_manifest_publish:2").returncode == -9
    _move_outputs(spec, "2")
    assert run(spec, crash_at="after_manifest_publish:2").returncode == -9
    text = spec.read_text()
    for sub in SUBS:
        text = text.replace(f'path = "{sub}2"', f'path = "{sub}3"')
    spec.write_text(text)
    resumed = run(spec)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_output(_merged(tmp_path, ("", "2", "3")), expected)
