"""Raw errors of an S3 answer become retries or one line, never a traceback.

A proxy in front of SeaweedFS cuts the body of a GET in the middle (the full
Content-Length announced, half the bytes sent, the connection closed), or answers a
PUT with 200 and no ETag. Before the fix the first escaped ``S3Objects.get`` as
botocore's raw ``ResponseStreamingError`` (the body was read after the retried call),
and the second as a ``KeyError`` from ``resp["ETag"]``. Now a cut body is a server
fault, retried for ``SEALSTREAM_S3_RETRY_S`` and then one line, and a missing ETag is
one line naming the store.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("boto3")

from s3_proxy import HeaderDroppingProxy  # noqa: E402
from sealstream._objects import ObjectStoreError  # noqa: E402
from sealstream._objects.s3 import S3Objects  # noqa: E402
from sealstream.testing.brokers import SeaweedServer  # noqa: E402

DATA = bytes(range(256)) * 400  # 100 KiB


class Faults:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cut_gets = 0  # GETs of an object still to cut in the middle
        self.cut = 0
        self.no_etag_puts = 0  # PUTs still to answer 200 without an ETag, not stored

    def take(self, name: str) -> bool:
        with self.lock:
            if getattr(self, name) > 0:
                setattr(self, name, getattr(self, name) - 1)
                return True
            return False


@pytest.fixture(scope="module")
def server() -> Iterator[SeaweedServer]:
    with SeaweedServer(anonymous=True) as s3:
        yield s3


@pytest.fixture
def store(server: SeaweedServer, monkeypatch: pytest.MonkeyPatch, request: Any
          ) -> Iterator[tuple[S3Objects, Faults]]:
    faults = Faults()
    with HeaderDroppingProxy(server.endpoint, drop=()) as proxy:
        base: Any = proxy._server.RequestHandlerClass

        class Faulty(base):  # type: ignore[misc]
            def do_GET(self) -> None:
                if "list-type" in self.path or not faults.take("cut_gets"):
                    self._forward()
                    return
                with faults.lock:
                    faults.cut += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(DATA)))
                self.send_header("ETag", '"0123456789abcdef0123456789abcdef"')
                self.end_headers()
                self.wfile.write(DATA[:len(DATA) // 2])
                self.wfile.flush()
                self.close_connection = True

            def do_PUT(self) -> None:
                if not faults.take("no_etag_puts"):
                    self._forward()
                    return
                self._body()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        proxy._server.RequestHandlerClass = Faulty
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("SEALSTREAM_S3_RETRY_S", "3")
        yield S3Objects(server.bucket, request.node.name[:40], endpoint_url=proxy.url), faults


def test_a_body_cut_in_the_middle_is_read_again(store: tuple[S3Objects, Faults]) -> None:
    objects, faults = store
    assert objects.create("blob", DATA)
    faults.cut_gets = 2
    assert objects.get("blob") == DATA
    assert faults.cut == 2
    faults.cut_gets = 1
    got = objects.read_versioned("blob")
    assert got is not None and got[0] == DATA and got[1]
    assert faults.cut == 3


def test_a_body_cut_every_time_is_one_line_after_the_retry_time(
        store: tuple[S3Objects, Faults]) -> None:
    objects, faults = store
    assert objects.create("blob", DATA)
    faults.cut_gets = 10_000
    with pytest.raises(ObjectStoreError) as err:
        objects.get("blob")
    text = str(err.value)
    assert "\n" not in text and text.startswith("cannot read blob in s3://"), text
    assert "did not answer for 3 s" in text, text
    assert faults.cut >= 2


def test_a_write_answered_without_an_etag_is_one_line(store: tuple[S3Objects, Faults]
                                                       ) -> None:
    objects, faults = store
    version = objects.replace("doc", b"one", None)
    faults.no_etag_puts = 1
    with pytest.raises(ObjectStoreError) as err:
        objects.replace("doc", b"two", version)
    text = str(err.value)
    assert "\n" not in text and "cannot replace doc in s3://" in text, text
    assert "no ETag" in text, text
    assert objects.read_versioned("doc") == (b"one", version)  # nothing was applied
