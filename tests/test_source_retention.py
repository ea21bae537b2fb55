"""Source retention: a partition file that shrank, was replaced or rotated since
the checkpoint stops the run (exit 1, one line naming the partition, the position,
what changed and the way out); an appended file resumes exactly once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from scenarios._story import assert_same_output, make_input, run, write_spec


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("crashed")
    spec = write_spec(d, make_input(d))
    res = run(spec, crash_at="after_retention:3")
    assert res.returncode == -9, res.stderr
    return d


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def truncate(f: Path) -> str:
    data = f.read_bytes()
    f.write_bytes(data[:200])
    return "shorter"


def same_size_other_content(f: Path) -> str:
    data = f.read_bytes()
    first = data.index(b'"u')
    f.write_bytes(data[:first] + b'"v' + data[first + 2:])  # same size, other first record
    assert len(f.read_bytes()) == len(data)
    return "first bytes differ"


def checkpoint_byte_offset(f: Path) -> int:
    """The byte position of partition ``in/<f>`` in the job's newest checkpoint."""
    job = f.parent.parent
    res = subprocess.run(
        [sys.executable, "-m", "sealstream", "checkpoints", "inspect", str(job / "ckpt"),
         "--json"], capture_output=True, text=True, check=True,
    )
    parts = json.loads(res.stdout)["partitions"]
    return int(next(p["byte_offset"] for p in parts if p["partition"] == f"in/{f.name}"))


def same_size_other_tail(f: Path) -> str:
    # a change just before the checkpoint position, far from the head of the file
    pos = checkpoint_byte_offset(f)
    data = f.read_bytes()
    assert pos > 4300, pos  # the identity hashes the first 4 KiB: change a byte past them
    j = data.rindex(b"}", 4200, pos) - 1  # the last record ending before the position
    assert data[j:j + 1].isdigit()
    new = data[:j] + (b"0" if data[j:j + 1] != b"0" else b"1") + data[j + 1:]
    assert len(new) == len(data) and new != data
    f.write_bytes(new)
    return "bytes before that position differ"


def rotated(f: Path) -> str:
    os.rename(f, f.with_suffix(".jsonl.1"))
    other = tmp_input(f.parent.parent / "other", seed=99)
    shutil.copy(other, f)
    return "first bytes differ"


def tmp_input(d: Path, seed: int) -> Path:
    make_input(d, partitions=1, events=600, seed=seed)
    return d / "in" / "p0.jsonl"


@pytest.mark.parametrize("change", [truncate, same_size_other_content, same_size_other_tail,
                                    rotated])
def test_a_changed_partition_stops_the_run_with_one_clear_line(
    crashed: Path, tmp_path: Path, change: Callable[[Path], str]
) -> None:
    d = _copy(crashed, tmp_path / "job")
    what = change(d / "in" / "p0.jsonl")
    before = sorted(p.relative_to(d) for p in (d / "out").rglob("*"))
    res = run(d / "spec.toml")
    assert res.returncode == 1
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "partition 'in/p0.jsonl' changed since its checkpoint at offset" in err
    assert "(byte " in err and what in err
    assert "replay from an earlier position into an isolated destination" in err
    assert sorted(p.relative_to(d) for p in (d / "out").rglob("*")) == before
    # it keeps refusing: nothing was read from the wrong place
    assert run(d / "spec.toml").returncode == 1


def test_an_appended_partition_resumes_exactly_once(crashed: Path, tmp_path: Path) -> None:
    d = _copy(crashed, tmp_path / "job")
    extra = '{"user": "u1", "ts": 1700000900000, "amount": 3, "i": 9999}\n' * 3
    with (d / "in" / "p1.jsonl").open("a") as f:
        f.write(extra)
    res = run(d / "spec.toml")
    assert res.returncode == 0, res.stderr
    ref = tmp_path / "ref"
    names = make_input(ref)
    with (ref / "in" / "p1.jsonl").open("a") as f:
        f.write(extra)
    assert run(write_spec(ref, names)).returncode == 0
    assert_same_output(d, ref)
