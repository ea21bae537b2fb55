"""Tamper stories on S3: the stories of test_agent_tamper.py that run on every
backend (rows altered, truncated, deleted, moved, keys and encryption failing
closed, the effect ledger's rows) run here on an ``s3://`` agent store (a real
SeaweedFS server) with the same verdicts. Altering the objects straight in the
bucket, behind the store's back, is told in test_agent_s3_store.py."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from test_agent_tamper import (  # noqa: E402,F401 - run here on S3
    test_agent_checkpoint_history_falls_back_past_a_tampered_one,
    test_deleted_checkpoints_are_reported_missing,
    test_deliberate_deletions_and_copies_stay_verified,
    test_keys_and_encryption_fail_closed,
    test_ledger_rows_tampered_truncated_deleted,
    test_retention_is_not_mistaken_for_deletion,
    test_row_moved_from_another_thread_is_refused,
)


@pytest.fixture
def backend_url(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh agent store: a new prefix in the test server's bucket."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return f"s3://{s3_server.bucket}/agents-{uuid.uuid4().hex[:12]}"
