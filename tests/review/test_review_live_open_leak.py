"""A live run refused while its merger starts closes the archive it opened.

``open_live`` opens the source and the ``[archive]`` (an S3 archive: its client, and
``gc.freeze()`` of everything that exists then) before the live merger's constructor
runs; the constructor can refuse (here: the checkpoint's followed file was rotated
away and deleted while the job was stopped, and the S3 archive added since holds
none of its positions). The refusal must come as the one clear line it is, and the
run, in a long-lived process (the API, notebooks), must leave nothing behind: before
the fix the archive was never closed, so the collector stayed frozen for the rest of
the process (every object of before the run, cyclic garbage included, out of its
reach). Fails on the old code (the freeze count is left non-zero), passes now.
"""

from __future__ import annotations

import gc
import sys
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest

import sealstream
from sealstream.checkpoint.manifest import KEY_ENV
from sealstream.errors import SourceError

ARCHIVE_TESTS = Path(__file__).resolve().parents[1] / "archive"
if str(ARCHIVE_TESTS) not in sys.path:
    sys.path.insert(0, str(ARCHIVE_TESTS))

from test_archive_follow import crash_then_rotate_away, write_specs  # noqa: E402


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def test_a_live_start_refused_after_the_archive_opened_closes_it(
        tmp_path: Path, s3_server: Any, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest) -> None:
    request.addfinalizer(gc.unfreeze)  # a failure here leaves the next tests unfrozen
    d = tmp_path / "job"
    crash_then_rotate_away(d, "jsonl", archive=None)  # a real run, SIGKILLed
    write_specs(d, "jsonl", archive=f"s3://{s3_server.bucket}/review-open-{tmp_path.name}")
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SEALSTREAM_KEEP_PLANS", "1")
    monkeypatch.delenv(KEY_ENV, raising=False)

    gc.collect()
    assert gc.get_freeze_count() == 0
    threads = set(threading.enumerate())
    node = _Node()
    alive = weakref.ref(node)
    del node  # cyclic garbage made before the run
    gc.disable()  # no automatic collection frees it before the archive opens
    try:
        with pytest.raises(SourceError) as err:
            sealstream.Job(sealstream.load_spec(d / "end.toml")).run()
    finally:
        gc.enable()
    message = str(err.value)
    assert "rotated away" in message and "does not cover them" in message, message
    assert "\n" not in message, message
    gc.collect()
    assert gc.get_freeze_count() == 0, "the archive's freeze outlived the refused run"
    assert alive() is None, "garbage from before the run stayed out of the collector's reach"
    left = [t for t in threading.enumerate() if t not in threads and t.is_alive()
            and t.name.startswith("sealstream")]
    assert left == [], left
