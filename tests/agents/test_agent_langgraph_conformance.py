"""The official LangGraph conformance suite (langgraph-checkpoint-conformance)
against SealstreamSaver, on SQLite and on PostgreSQL: every base capability and
every optional one the saver implements must pass."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate  # noqa: E402
from langgraph.checkpoint.conformance.capabilities import (  # noqa: E402
    BASE_CAPABILITIES,
    DetectedCapabilities,
)

from sealstream.agents.langgraph import SealstreamSaver  # noqa: E402

KEY = b"conformance-signing-key"
ENC = bytes(range(32))
IMPLEMENTED = {"put", "put_writes", "get_tuple", "list", "delete_thread", "prune",
               "copy_thread", "delete_for_runs"}


def _run(make: Callable[[], SealstreamSaver], name: str) -> None:
    @checkpointer_test(name=name)
    async def factory() -> AsyncIterator[SealstreamSaver]:
        saver = make()
        try:
            yield saver
        finally:
            saver.close()

    report = asyncio.run(validate(factory))
    failures = {cap: r.failures for cap, r in report.results.items() if r.failures}
    assert not failures, failures
    assert report.passed_all_base()
    passed = {cap for cap, r in report.results.items() if r.passed}
    assert passed == IMPLEMENTED, passed
    assert {c.value for c in BASE_CAPABILITIES} <= passed
    counts = {cap: r.tests_passed for cap, r in sorted(report.results.items())}
    print(f"{name}: {sum(counts.values())} conformance tests passed: {counts}")


def test_detected_capabilities(tmp_path: Path) -> None:
    saver = SealstreamSaver(tmp_path / "a.db", key=KEY, encryption_key=None)
    detected = {c.value for c in DetectedCapabilities.from_instance(saver).detected}
    assert detected == IMPLEMENTED
    saver.close()


@pytest.mark.parametrize("encrypted", [False, True], ids=["signed", "signed+encrypted"])
def test_conformance_sqlite(tmp_path: Path, encrypted: bool) -> None:
    counter = iter(range(100))
    _run(lambda: SealstreamSaver(tmp_path / f"c{next(counter)}.db", key=KEY,
                                 encryption_key=ENC if encrypted else None),
         f"SealstreamSaver[sqlite,{'enc' if encrypted else 'plain'}]")


def test_conformance_postgres(pg_url: str) -> None:
    _run(lambda: SealstreamSaver(pg_url, key=KEY, encryption_key=ENC),
         "SealstreamSaver[postgresql,enc]")
