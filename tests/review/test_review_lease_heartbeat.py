"""The S3 store's lease heartbeat survives a renewal that fails with a raw error.

The heartbeat thread renews the lease every third of its term and lets the next beat
try again after a server fault (CheckpointError). A renewal can also fail with an
exception that is no CheckpointError: here a proxy in front of SeaweedFS answers one
PUT of ``LEASE`` with ``200`` but no ``ETag`` (the write not applied), and the S3
layer's ``resp["ETag"]`` raises a raw KeyError. Before the fix that killed the
heartbeat thread (a traceback on stderr through threading's excepthook) and no
renewal was ever sent again: the lease silently expired under a running job. Fails
on the old code (no renewal after the fault; the thread's exception), passes now.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from sealstream.checkpoint.stores.objects import ObjectCheckpointStore
from sealstream.testing.store_contract import PIPELINE

#: how long a condition may take on a loaded machine
PATIENCE_S = 120.0


def _wait(condition: Any, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_raw_error_in_one_renewal_does_not_stop_the_heartbeat(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("boto3")
    from s3_proxy import HeaderDroppingProxy
    from sealstream._objects.s3 import S3Objects
    from sealstream.testing.brokers import SeaweedServer

    state: dict[str, Any] = {"fake": False, "faked": 0, "renewed": 0}
    lock = threading.Lock()
    monkeypatch.setenv("SEALSTREAM_S3_LEASE_S", "1")  # a beat every third of a second
    with SeaweedServer(anonymous=True) as s3, \
            HeaderDroppingProxy(s3.endpoint, drop=()) as proxy:
        base: Any = proxy._server.RequestHandlerClass

        class NoEtagOnce(base):  # type: ignore[misc]
            def do_PUT(self) -> None:
                lease = self.path.split("?", 1)[0].endswith("/LEASE")
                with lock:
                    fake = lease and state["fake"]
                    if fake:
                        state["fake"] = False
                if not fake:
                    self._forward()
                    if lease:
                        with lock:
                            state["renewed"] += 1
                    return
                self._body()  # not stored: answered without the ETag a PUT returns
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                with lock:
                    state["faked"] += 1

        proxy._server.RequestHandlerClass = NoEtagOnce
        for name, value in s3.env().items():
            monkeypatch.setenv(name, value)
        store = ObjectCheckpointStore(S3Objects(s3.bucket, "review-beat", endpoint_url=proxy.url),
                                      PIPELINE, encryption_key=None)
        try:
            with store.locked():
                with lock:
                    state["fake"] = True
                _wait(lambda: state["faked"] == 1, "the heartbeat never renewed the lease")
                with lock:
                    after_fault = state["renewed"]
                _wait(lambda: state["renewed"] > after_fault,
                      "no renewal was sent after the faulty one: the heartbeat died")
                store.check_lock()  # still this run's: not fenced, not lost
                assert store.is_locked() is not None
        finally:
            store.close()


def test_a_raw_error_in_the_renewal_before_a_manifest_is_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The renewal a checkpoint sends beside its files, answered without its ETag: the
    write refuses with one line (CheckpointError naming the lease) and publishes
    nothing. Before the fix the raw KeyError reached the caller (a traceback from
    ``sealstream run``). Fails on the old code (KeyError), passes now."""
    pytest.importorskip("boto3")
    from s3_proxy import HeaderDroppingProxy
    from sealstream._objects.s3 import S3Objects
    from sealstream.errors import CheckpointError
    from sealstream.testing.brokers import SeaweedServer
    from sealstream.testing.store_contract import sample_checkpoint

    state = {"fake": False}
    with SeaweedServer(anonymous=True) as s3, \
            HeaderDroppingProxy(s3.endpoint, drop=()) as proxy:
        base: Any = proxy._server.RequestHandlerClass

        class NoEtag(base):  # type: ignore[misc]
            def do_PUT(self) -> None:
                if not (state["fake"] and self.path.split("?", 1)[0].endswith("/LEASE")):
                    self._forward()
                    return
                self._body()  # not stored: answered without the ETag a PUT returns
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        proxy._server.RequestHandlerClass = NoEtag
        for name, value in s3.env().items():
            monkeypatch.setenv(name, value)
        store = ObjectCheckpointStore(S3Objects(s3.bucket, "review-renew", endpoint_url=proxy.url),
                                      PIPELINE, encryption_key=None)
        try:
            with store.locked():
                files, manifest = sample_checkpoint(1)
                state["fake"] = True
                try:
                    with pytest.raises(CheckpointError) as err:
                        store.write_checkpoint(1, files, manifest)
                finally:
                    state["fake"] = False
        finally:
            store.close()
        message = str(err.value)
        assert "cannot renew the lease" in message and "\n" not in message, message
        assert store.ids() == [] or not store.has_manifest(1)
