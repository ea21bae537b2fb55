"""An S3 archive freezes the collector's objects for its run (``gc.freeze`` after
opening its client); closing it must give them back. A job run in a long-lived
process (the API, tests, notebooks) would otherwise keep everything that existed
when the archive opened, cyclic garbage included, out of the collector's reach for
the rest of the process (``sealstream run`` unfreezes at its end; the archive's own
freeze had no counterpart). Fails before the fix: garbage made before the archive
opened is never collected after it closed."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from sealstream.archive import ArchiveSettings
from sealstream.archive._live import Archiver
from sealstream.sources._base import FieldPlan


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def test_a_closed_s3_archive_leaves_no_garbage_out_of_the_collectors_reach(
        s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    gc.collect()
    assert gc.get_freeze_count() == 0
    node = _Node()
    alive = weakref.ref(node)
    del node  # cyclic garbage, not collected yet
    plan = FieldPlan(key="@key", time="@timestamp", fields={"amount": "numeric"})
    gc.disable()  # no automatic collection frees it before the archive opens
    try:
        archiver = Archiver(ArchiveSettings(url=f"s3://{s3_server.bucket}/review-gc"), plan)
    finally:
        gc.enable()
    try:
        assert archiver.location.startswith("s3://")
    finally:
        archiver.close()
    gc.collect()
    assert alive() is None, "garbage from before the archive stayed frozen after close"
    assert gc.get_freeze_count() == 0
