"""A JetStream stream of its own for one test, and a publisher (used by conftest.py and
by tests that build one on their own server). A module of its own: ``from conftest
import`` would find whichever conftest was imported first."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any


class Jet:
    """Synchronous helpers around nats-py for one stream on one server."""

    def __init__(self, url: str, stream: str) -> None:
        self.url = url
        self.stream = stream
        self.prefix = stream.lower()

    def s(self, subject: str) -> str:
        """The test's own subject ``subject`` (subjects are unique per server)."""
        return f"{self.prefix}.{subject}"

    def _run(self, fn: Any) -> Any:
        import nats

        async def go() -> Any:
            nc = await nats.connect(self.url, connect_timeout=5, max_reconnect_attempts=5)
            try:
                return await fn(nc.jetstream(timeout=10))
            finally:
                await nc.close()

        return asyncio.run(go())

    def create(self, subjects: Sequence[str], **limits: Any) -> None:
        from nats.js.api import StreamConfig

        async def fn(js: Any) -> None:
            names = [self.s(x) for x in subjects]
            await js.add_stream(StreamConfig(name=self.stream, subjects=names, **limits))

        self._run(fn)

    def update(self, **limits: Any) -> None:
        async def fn(js: Any) -> None:
            info = await js.stream_info(self.stream)
            await js.update_stream(info.config.evolve(**limits))

        self._run(fn)

    def publish(self, items: Sequence[tuple[str, bytes | dict[str, Any]]]) -> list[int]:
        """Publish ``(subject, value)`` pairs in order; their stream sequences."""

        async def fn(js: Any) -> list[int]:
            seqs = []
            for subject, value in items:
                data = value if isinstance(value, bytes) else json.dumps(value).encode()
                ack = await js.publish(self.s(subject), data)
                seqs.append(int(ack.seq))
            return seqs

        return list(self._run(fn))

    def delete(self, seq: int) -> None:
        async def fn(js: Any) -> None:
            await js.delete_msg(self.stream, seq)

        self._run(fn)

    def purge(self, keep: int | None = None, seq: int | None = None) -> None:
        async def fn(js: Any) -> None:
            await js.purge_stream(self.stream, keep=keep, seq=seq)

        self._run(fn)

    def state(self) -> Any:
        async def fn(js: Any) -> Any:
            return (await js.stream_info(self.stream)).state

        return self._run(fn)
