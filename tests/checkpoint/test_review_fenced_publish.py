"""A run fenced by its lease's heartbeat publishes no checkpoint.

The S3 store's heartbeat renews the lease every third of its term; when a renewal
is refused because another run took the lease, the store is fenced (``_lost``) and
forgets the lease. The next ``write_checkpoint`` must refuse (LockHeldError) and
create no manifest: before the fix it saw no lease held, skipped the renewal, and
published the manifest of a run that no longer owns the prefix (a newer run's ids
and recovery then meet a checkpoint of the fenced run). Fails before the fix (the
checkpoint was published); passes now.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sealstream._objects.local import LocalObjects
from sealstream.checkpoint.manifest import MANIFEST_NAME
from sealstream.checkpoint.stores import checkpoint_dirname
from sealstream.checkpoint.stores.objects import LEASE_KEY, ObjectCheckpointStore
from sealstream.errors import LockHeldError
from sealstream.testing.store_contract import PIPELINE, sample_checkpoint


def _fenced(store: ObjectCheckpointStore) -> bool:
    try:
        store.check_lock()
    except LockHeldError:
        return True
    return False


def test_a_run_fenced_by_its_heartbeat_publishes_no_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEALSTREAM_S3_LEASE_S", "1")  # a beat every third of a second
    objects = LocalObjects(tmp_path / "objects")
    store = ObjectCheckpointStore(objects, PIPELINE, encryption_key=None)
    with pytest.raises(LockHeldError), store.locked():
        files, manifest = sample_checkpoint(1)
        store.write_checkpoint(1, files, manifest)
        # another run takes the lease (as one does once this run's has expired)
        got = objects.read_versioned(LEASE_KEY)
        assert got is not None
        doc = json.loads(got[0])
        taker = {"holder": {"pid": 1, "host": "elsewhere", "run": "other"},
                 "generation": doc["generation"] + 1,
                 "expires_ms": int((time.time() + 600) * 1000), "released": False}
        objects.replace(LEASE_KEY, json.dumps(taker).encode(), got[1])
        deadline = time.monotonic() + 120  # the heartbeat notices (generous: loaded machine)
        while not _fenced(store) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _fenced(store), "the heartbeat never noticed the lease was taken"
        files, manifest = sample_checkpoint(2, 1)
        try:
            store.write_checkpoint(2, files, manifest)
        finally:
            published = objects.get(f"{checkpoint_dirname(2)}/{MANIFEST_NAME}")
            assert published is None, "a fenced run published checkpoint 2"
