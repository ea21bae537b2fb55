"""The asyncio side of the NATS source: a private event loop driven synchronously,
pull requests answered at an inbox, and JetStream metadata cut out of reply subjects
as columns. Used by :mod:`sealstream.sources.nats` only."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import polars as pl

from ..errors import SourceError

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg

T = TypeVar("T")

REQUEST_TIMEOUT_S = 5.0
"""Deadline of one request to the server (stream info, consumer creation)."""


class Loop:
    """A private asyncio event loop on a daemon thread, driven synchronously."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="sealstream-nats", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout_s)
        except TimeoutError:
            fut.cancel()
            raise

    def close(self) -> None:
        if self.loop.is_closed():
            return

        async def _cancel_all() -> None:
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            self.run(_cancel_all(), 5.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5.0)
        if not self._thread.is_alive():
            self.loop.close()


async def noop(*_: Any) -> None:
    return None


class Pull:
    """Pull requests of one consumer, answered at a private inbox (on the loop thread).

    nats-py's ``fetch`` waits for each message with its own timer; this asks the
    consumer directly (``$JS.API.CONSUMER.MSG.NEXT``) and collects what arrives in a
    list from the subscription's callback, which is several times faster. At most
    one request is outstanding, so at most one batch waits here (memory is bounded);
    after a full batch the next one is asked for at once, so that it arrives while the
    engine parses the first.

    A poll first drains what has arrived. Otherwise it asks for ``n`` messages
    with ``no_wait`` (the server sends what it has and ends the request: a full batch,
    or a "404 No Messages" status); when nothing came it asks again with ``expires``
    = the poll's timeout and returns as soon as the first message arrives (the rest
    of that request lands here for the next polls) or when the time is up.
    """

    def __init__(self) -> None:
        self.buf: list[Msg] = []
        self.want = 0  # messages the outstanding request may still bring
        self.until = 0.0  # when the outstanding request ends at the latest (monotonic)
        self.gone: str | None = None  # the server said the consumer is gone
        self.no_wait = True  # the outstanding request is a no_wait one
        self.event: asyncio.Event | None = None

    async def on_msg(self, msg: Msg) -> None:
        hdr = msg.headers
        if hdr is not None and not msg.data and "Status" in hdr:
            code = hdr.get("Status", "")
            if code not in ("404", "408", "409", "100"):
                self.gone = f"{code} {hdr.get('Description', '')}".strip()
            elif code == "409" and "deleted" in hdr.get("Description", "").lower():
                self.gone = f"409 {hdr.get('Description', '')}"
            if code != "100":  # 100: an idle heartbeat
                self.want = 0
        else:
            self.buf.append(msg)
            self.want -= 1
            if len(self.buf) != 1 and self.want > 0:
                return  # a waiter cares about the first message and the last only
        if self.event is not None:
            self.event.set()

    def _outstanding(self) -> bool:
        return self.want > 0 and time.monotonic() < self.until

    async def _ask(self, nc: Client, subject: str, inbox: str, n: int,
                   expires_s: float | None) -> None:
        req: dict[str, Any] = {"batch": n}
        self.no_wait = expires_s is None
        if expires_s is None:
            req["no_wait"] = True
            self.until = time.monotonic() + REQUEST_TIMEOUT_S
        else:
            req["expires"] = int(expires_s * 1e9)
            self.until = time.monotonic() + expires_s + 1.0
        self.want = n
        await nc.publish(subject, json.dumps(req).encode(), reply=inbox)

    async def _wait(self, done: Callable[[], bool], timeout_s: float) -> None:
        assert self.event is not None
        deadline = time.monotonic() + timeout_s
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self.event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.event.wait(), remaining)

    async def take(self, nc: Client, subject: str, inbox: str, n: int,
                   timeout_s: float) -> list[Msg]:
        if not self.buf or (self.no_wait and self._outstanding() and len(self.buf) < n):
            if not self._outstanding():
                await self._ask(nc, subject, inbox, n, None)
            if self.no_wait:
                await self._wait(lambda: not self._outstanding() or len(self.buf) >= n,
                                 REQUEST_TIMEOUT_S)
            if not self.buf:
                if not self._outstanding():
                    await self._ask(nc, subject, inbox, n, timeout_s)
                await self._wait(lambda: bool(self.buf) or not self._outstanding(), timeout_s)
        got = self.buf[:n]
        del self.buf[:n]
        if len(got) == n and not self.buf and not self._outstanding():
            # a full batch: ask for the next one now, it arrives while this one is parsed
            await self._ask(nc, subject, inbox, n, None)
        return got


def reply_fields(
    replies: Sequence[str | None],
) -> tuple[np.ndarray[Any, np.dtype[np.int64]], np.ndarray[Any, np.dtype[np.int64]], int]:
    """Stream sequences and stored times (ms) from JetStream reply subjects, as columns,
    and the last one's pending count (messages of the filter after it).

    ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>`` (9
    tokens) or, with a domain and account, ``$JS.ACK.<domain>.<hash>.<stream>...``
    (11 or 12 tokens)."""
    parts = pl.Series("r", replies, dtype=pl.String).str.split(".")
    n_tok = parts.list.len()
    short = n_tok == 9
    df = pl.DataFrame({"p": parts, "short": short}).select(
        pl.when(pl.col("short")).then(pl.col("p").list.get(5, null_on_oob=True))
        .otherwise(pl.col("p").list.get(7, null_on_oob=True))
        .cast(pl.Int64, strict=False).alias("seq"),
        pl.when(pl.col("short")).then(pl.col("p").list.get(7, null_on_oob=True))
        .otherwise(pl.col("p").list.get(9, null_on_oob=True))
        .cast(pl.Int64, strict=False).alias("ns"),
        pl.when(pl.col("short")).then(pl.col("p").list.get(8, null_on_oob=True))
        .otherwise(pl.col("p").list.get(10, null_on_oob=True))
        .cast(pl.Int64, strict=False).alias("pending"),
    )
    if df["seq"].null_count():
        raise SourceError("NATS source: a message arrived without JetStream metadata "
                          "(is the subject bound to the stream?)")
    seqs = df["seq"].to_numpy().astype(np.int64, copy=False)
    ts = (df["ns"].fill_null(-1_000_000) // 1_000_000).to_numpy().astype(np.int64, copy=False)
    last_pending = df["pending"][-1] if df.height else 0
    return seqs, ts, int(last_pending or 0)


def why(e: BaseException | None) -> str:
    if e is None:
        return "no answer"
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:200]
