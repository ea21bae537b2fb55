"""The stop line's checkpoint number (``sealstream: interrupted by ...; the next run
resumes from checkpoint N``) comes from listing the job's store. When the store
cannot be listed, the number is only what the run itself finished, and a checkpoint
being written when the signal came may have been published since: the line says so
instead of naming a number that may be too old."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from tests.test_cli_signals import _job

from sealstream._runtime.engine import Job
from sealstream.checkpoint.stores.directory import LocalCheckpointStore
from sealstream.cli import _resume_note
from sealstream.pipeline.spec import load_spec


def test_the_line_names_the_newest_published_checkpoint_or_says_the_store_was_not_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SEALSTREAM_CRASH_AT", raising=False)
    job = Job(load_spec(_job(tmp_path)))
    job.run()
    newest = max(c for c in LocalCheckpointStore(tmp_path / "ckpt").ids())
    assert _resume_note(job) == ("committed output is intact; the next run resumes "
                                 f"from checkpoint {newest}")

    def unreadable(self: LocalCheckpointStore) -> list[int]:
        raise OSError(errno.EIO, "Input/output error", str(self.root))

    monkeypatch.setattr(LocalCheckpointStore, "ids", unreadable)
    # as if the newest had been published after the run's last report
    job.ck_stats.last_id = newest - 1
    note = _resume_note(job)
    assert note == ("committed output is intact; the next run resumes from checkpoint "
                    f"{newest - 1} or a newer one (the store could not be listed: "
                    f"[Errno 5] Input/output error: '{tmp_path / 'ckpt'}')"), note
