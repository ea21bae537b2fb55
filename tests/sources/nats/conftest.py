"""Fixtures of the NATS source tests: a JetStream stream on the tests' server and a
publisher. Each test gets a stream of its own (unique name), so tests share one
server and stay independent."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from _jet import Jet


@pytest.fixture
def jet(nats_server: Any) -> Iterator[Jet]:
    yield Jet(nats_server.url, f"S{uuid.uuid4().hex[:10]}")
