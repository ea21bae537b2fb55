"""A start refused by the lease leaves no thread of the store's behind it.

The S3 store's start runs its probe on the store's background thread (beside the
first reads). A run refused because another live run holds the lease
(LockHeldError) must not leave that thread running: a long-lived process (tests,
notebooks, a retrying caller) keeps an idle thread for as long as the refused store
object lives (a traceback, a retry loop holding it).
Fails before the fix (a ``sealstream-s3bg`` thread left alive).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sealstream._objects.local import LocalObjects
from sealstream.checkpoint.stores.objects import ObjectCheckpointStore
from sealstream.errors import LockHeldError
from sealstream.testing.store_contract import PIPELINE


def _background_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("sealstream-s3bg")]


def test_a_start_refused_by_the_lease_leaves_no_background_thread(tmp_path: Path) -> None:
    before = set(_background_threads())
    holder = ObjectCheckpointStore(LocalObjects(tmp_path / "objects"), PIPELINE,
                                   encryption_key=None)
    with holder.locked():
        for _ in range(3):
            other = ObjectCheckpointStore(LocalObjects(tmp_path / "objects"), PIPELINE,
                                          encryption_key=None)
            with pytest.raises(LockHeldError), other.locked():
                pass
    left = [t for t in _background_threads() if t not in before and t.is_alive()]
    assert left == [], left
