"""``[archive]`` with ``--workers``: refused before Ray starts (no worker writes
archive segments yet), so a user never believes expired data is archived when it
is not (docs/scale-out.md, "Limits today")."""

from __future__ import annotations

from pathlib import Path

from tests.archive._archive_story import kafka_source, run, write_spec


def test_an_archive_with_workers_is_refused_in_one_line_before_anything_starts(
    tmp_path: Path,
) -> None:
    # no broker listens there: the refusal comes before any connection or Ray start
    spec = write_spec(tmp_path, kafka_source("127.0.0.1:1", "events"))
    proc = run(spec, "--workers", "2")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == ["sealstream: error: [archive] is not supported with --workers yet "
                     "(the workers read the source, and no worker writes archive "
                     "segments): run the job on one process, or remove [archive]"], lines
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "archive").exists()
    assert not (tmp_path / "out").exists()
