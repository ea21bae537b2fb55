"""The console keeps one S3 client per store (URL and AWS settings) for its process:
browsing pages of a real SeaweedFS store makes no new S3 client after the first, a
second store gets its own, and threads opening a store at once share one."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import test_console_routes as routes
from test_console_s3 import _listing, _pages, _story

from sealstream.console import _objstores


@pytest.fixture(params=["botocore", "obstore"])
def made(monkeypatch: pytest.MonkeyPatch, request: Any) -> list[str]:
    """The services of every S3 client made in this process from now on, the
    console's shared clients forgotten first, on each client (SEALSTREAM_S3_CLIENT):
    a spy on botocore's real factory (which boto3's ``Session.client`` calls too), or
    on the real factory of the obstore ``S3Store`` of :class:`S3Objects`."""
    import botocore.session

    from sealstream._objects import s3

    monkeypatch.setattr(_objstores, "_shared", {}, raising=False)  # (none before)
    monkeypatch.setenv("SEALSTREAM_S3_CLIENT", request.param)
    out: list[str] = []
    if request.param == "botocore":
        real = botocore.session.Session.create_client

        def counting(self: Any, service: str, *args: Any, **kw: Any) -> Any:
            out.append(service)
            return real(self, service, *args, **kw)

        monkeypatch.setattr(botocore.session.Session, "create_client", counting)
    else:
        real_store = s3.make_store

        def counting_store(*args: Any, **kw: Any) -> Any:
            out.append("s3")
            return real_store(*args, **kw)

        monkeypatch.setattr(s3, "make_store", counting_store)
    return out


def test_pages_of_an_s3_store_make_one_client_per_store(
        tmp_path: Path, s3_server: Any, monkeypatch: pytest.MonkeyPatch,
        make_client: Any, made: list[str]) -> None:
    _, url = _story(tmp_path, s3_server)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SEALSTREAM_S3_RETRY_S", "3")
    empty = f"s3://{s3_server.bucket}/console-empty-{uuid.uuid4().hex[:12]}"
    before = _listing(s3_server)
    made.clear()  # (the listing's own client)
    c = make_client(url, empty)
    first = _pages(c)
    assert "ATOMIC_CHECKPOINT" in first and "no checkpoint store at" in first
    assert made == ["s3", "s3"]  # one for each store
    for _ in range(3):
        page = _pages(c, ("/s/0/0/cp/2", "/s/0/0/history"))
        routes._ok(c.get("/s/0/0/cp/1"))
        assert "ATOMIC_CHECKPOINT" in page
        assert s3_server.secret_key not in page and s3_server.access_key not in page
    assert made == ["s3", "s3"]  # no page made another
    made.clear()
    assert _listing(s3_server) == before  # still read-only


def test_threads_opening_one_store_at_once_share_one_client(
        s3_server: Any, monkeypatch: pytest.MonkeyPatch, made: list[str]) -> None:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    url = f"s3://{s3_server.bucket}/console-threads-{uuid.uuid4().hex[:12]}"
    start = threading.Barrier(8)
    inner: list[object] = []

    def open_one() -> None:
        start.wait(timeout=120)
        inner.append(_objstores.open_s3(url).objects.inner)  # type: ignore[attr-defined]

    threads = [threading.Thread(target=open_one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(inner) == 8 and len({id(o) for o in inner}) == 1
    assert made == ["s3"]
    # other AWS settings (here another key) are another client, never the first one's
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "another-key-id")
    other = _objstores.open_s3(url).objects.inner  # type: ignore[attr-defined]
    assert other is not inner[0] and made == ["s3", "s3"]
