"""Fit between saved state and the deployed definition: a changed definition is
refused with a readable diff; what the state does not depend on resumes; the
`sealstream.testing.compat` helper checks it in a user's test suite."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from scenarios._story import assert_same_output, make_input, reference_run, run, write_spec
from sealstream.pipeline import Output, Tumbling, load_spec
from sealstream.testing.compat import assert_restores

WINDOW = 'kind = "tumbling"\nsize_ms = 2000\nallowed_lateness_ms = 500'


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("uninterrupted")
    reference_run(d)
    return d


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A job killed after its third checkpoint: open windows, unfinished input."""
    d = tmp_path_factory.mktemp("crashed")
    spec = write_spec(d, make_input(d))
    res = run(spec, crash_at="after_retention:3")
    assert res.returncode == -9, res.stderr
    return d


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _tree(d: Path) -> dict[str, bytes]:
    """Every file's bytes (the run lock's holder note aside)."""
    return {str(f.relative_to(d)): f.read_bytes() for f in sorted(d.rglob("*"))
            if f.is_file() and f.name != "LOCK"}


def test_a_changed_window_size_is_refused_with_the_diff(crashed: Path, tmp_path: Path) -> None:
    d = _copy(crashed, tmp_path / "job")
    spec = d / "spec.toml"
    spec.write_text(spec.read_text().replace("size_ms = 2000", "size_ms = 1000"))
    before = _tree(d)
    res = run(spec)
    assert res.returncode == 1
    err = res.stderr
    assert "Traceback" not in err
    assert "was written by a different pipeline definition" in err
    assert "window.size_ms: 2000 -> 1000" in err
    assert "sealstream replay SPEC --from start --to NEW_DIR" in err
    assert "--start-over" in err
    assert "none is ATOMIC_CHECKPOINT" not in err
    assert _tree(d) == before  # nothing deleted, moved or written


def test_an_added_aggregate_is_refused_and_explained(crashed: Path, tmp_path: Path) -> None:
    d = _copy(crashed, tmp_path / "job")
    spec = d / "spec.toml"
    spec.write_text(spec.read_text().replace('n = "count"', 'n = "count"\nspan = "max(i)"'))
    res = run(spec)
    assert res.returncode == 1
    assert 'aggregates.span: (absent) -> "max(i)"' in res.stderr
    assert "Added aggregate(s) 'span'" in res.stderr and "wrong values" in res.stderr


def test_a_refused_definition_can_be_replayed_into_a_new_destination(
    crashed: Path, tmp_path: Path
) -> None:
    d = _copy(crashed, tmp_path / "job")
    spec = d / "spec.toml"
    spec.write_text(spec.read_text().replace("size_ms = 2000", "size_ms = 1000"))
    assert run(spec).returncode == 1
    from sealstream._runtime.replay import replay

    summary = replay(load_spec(spec), "start", tmp_path / "v2")
    assert summary.counters.events > 0 and summary.checkpoints.count > 0
    fresh = tmp_path / "fresh"
    names = make_input(fresh)
    write_spec(fresh, names, window=WINDOW.replace("2000", "1000"))
    assert run(fresh / "spec.toml").returncode == 0
    assert_same_output(tmp_path / "v2", fresh)


@pytest.mark.parametrize("change", [
    ("every_events = 120", "every_events = 77"),
    ("batch_size = 50", "batch_size = 13"),
    ("keep = 3", "keep = 5"),
])
def test_what_the_state_does_not_depend_on_resumes_exactly_once(
    crashed: Path, expected: Path, tmp_path: Path, change: tuple[str, str]
) -> None:
    d = _copy(crashed, tmp_path / "job")
    spec = d / "spec.toml"
    spec.write_text(spec.read_text().replace(*change))
    res = run(spec, "--summary-json", str(tmp_path / "s.json"))
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "s.json").read_text())["resumed_from"] is not None
    assert_same_output(d, expected)


# ------------------------------------------------------------------ the compat helper
@pytest.fixture()
def job(tmp_path: Path) -> Path:
    d = tmp_path / "job"
    names = make_input(d, events=150)
    write_spec(d, names)
    return d


def _variant(job: Path, name: str, old: str, new: str) -> Path:
    text = (job / "spec.toml").read_text()
    assert old in text
    out = job / name
    out.write_text(text.replace(old, new))
    return out


def test_compat_passes_for_a_sink_path_change(job: Path, tmp_path: Path) -> None:
    new = _variant(job, "new.toml", 'path = "out"', 'path = "results-v2"')
    before = _tree(job)
    info = assert_restores(job / "spec.toml", new, tmp_path / "check")
    assert info["open_windows"] > 0 and info["checkpoint"] is not None
    assert info["results"] == info["results_uninterrupted"] > 0
    assert _tree(job) == before  # the spec's own outputs and checkpoints are not touched
    assert not (job / "out").exists() and not (job / "ckpt").exists()


def test_compat_accepts_pipeline_objects(job: Path, tmp_path: Path) -> None:
    old = load_spec(job / "spec.toml")
    new = replace(old, sink=Output(kind="jsonl", path="elsewhere", base_dir=job),
                  batch_size=7)
    assert assert_restores(old, new, tmp_path / "check")["open_windows"] > 0


def test_compat_fails_for_a_window_size_change_with_the_diff(job: Path, tmp_path: Path) -> None:
    new = _variant(job, "new.toml", "size_ms = 2000", "size_ms = 1000")
    with pytest.raises(AssertionError) as info:
        assert_restores(job / "spec.toml", new, tmp_path / "check")
    text = str(info.value)
    assert "cannot resume" in text and "window.size_ms: 2000 -> 1000" in text
    old = load_spec(job / "spec.toml")
    with pytest.raises(AssertionError, match=r"window\.size_ms: 2000 -> 4000"):
        assert_restores(old, replace(old, window=Tumbling(4000, 500)), tmp_path / "check2")


def test_compat_fails_for_an_added_aggregate(job: Path, tmp_path: Path) -> None:
    new = _variant(job, "new.toml", 'n = "count"', 'n = "count"\nspan = "max(i)"')
    with pytest.raises(AssertionError, match="Added aggregate"):
        assert_restores(job / "spec.toml", new, tmp_path / "check")


def test_compat_needs_a_sample_that_leaves_windows_open(job: Path, tmp_path: Path) -> None:
    tiny = [tmp_path / f"t{i}.jsonl" for i in range(3)]
    for t in tiny:
        t.write_text('{"user": "a", "ts": 1, "amount": 1, "i": 0}\n')
    with pytest.raises(AssertionError, match="never wrote a checkpoint with open windows"):
        assert_restores(job / "spec.toml", job / "spec.toml", tmp_path / "check", sample=tiny)
