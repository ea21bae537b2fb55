"""A pruning that fails (the archive's server gone) is reported as one clear line.

Retention's deletion of old segments runs on the archive's writer thread; its
failure is raised by the next checkpoint's pruning. It must come as a
:class:`SealstreamError` naming the archive (the CLI prints one line and exits as
the contract says), not as the raw object-store exception (a traceback). Real
SeaweedFS, stopped under the archive. Fails before the fix (ObjectStoreError, not a
SealstreamError); passes now.
"""

from __future__ import annotations

import time

import pytest

from sealstream.archive import ArchiveSettings
from sealstream.archive._live import Archiver
from sealstream.errors import SealstreamError
from sealstream.sources._base import FieldPlan
from sealstream.testing.brokers import SeaweedServer


def test_a_failed_pruning_is_raised_as_one_clear_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEALSTREAM_S3_RETRY_S", "1")
    server = SeaweedServer()
    server.start()
    try:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        plan = FieldPlan(key="@key", time="@timestamp", fields={"amount": "numeric"})
        archiver = Archiver(ArchiveSettings(url=f"s3://{server.bucket}/prune"), plan)
        archiver.objects.create("seg-000000000001-0123456789abcdef.parquet", b"x")
    finally:
        server.close()  # the server is gone: the listing of the pruning fails
    try:
        archiver.prune(5)
        deadline = time.monotonic() + 300
        while archiver._pruning is not None and not archiver._pruning.done() \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert archiver._pruning is not None and archiver._pruning.done()
        with pytest.raises(SealstreamError) as err:
            archiver.prune(6)
        assert "[archive]" in str(err.value) and "\n" not in str(err.value)
    finally:
        archiver.close()
