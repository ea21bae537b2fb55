"""The retry bounds read from the environment (PostgreSQL, S3, a Kafka output) share
one reader: a number of seconds >= 0, or one line naming the variable."""

from __future__ import annotations

import pytest

from sealstream.errors import SpecError


@pytest.mark.parametrize(("name", "reader", "default"), [
    ("SEALSTREAM_PG_RETRY_S", "sealstream.checkpoint.stores.postgres", 30.0),
    ("SEALSTREAM_S3_RETRY_S", "sealstream._objects.s3", 30.0),
    ("SEALSTREAM_KAFKA_RETRY_S", "sealstream.sinks.kafka", 60.0),
])
def test_each_retry_bound_reads_its_variable(monkeypatch: pytest.MonkeyPatch, name: str,
                                             reader: str, default: float) -> None:
    import importlib

    retry_seconds = importlib.import_module(reader).retry_seconds
    monkeypatch.delenv(name, raising=False)
    assert retry_seconds() == default
    monkeypatch.setenv(name, " 2.5 ")
    assert retry_seconds() == 2.5
    monkeypatch.setenv(name, "0")
    assert retry_seconds() == 0.0
    for bad in ("soon", "-1", "nan", "inf"):
        monkeypatch.setenv(name, bad)
        with pytest.raises(SpecError, match=f"^{name}: '{bad}' is not a number of seconds"):
            retry_seconds()
