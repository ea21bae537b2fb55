"""``[source] kind = "nats"``: a NATS JetStream stream read live (see docs/nats.md).

::

    [source]
    kind = "nats"
    servers = "nats://127.0.0.1:4222"     # or a list of URLs
    stream = "ORDERS"                      # the JetStream stream
    subjects = ["orders.eu", "orders.us"]  # one partition each (wildcards allowed)
    start = "earliest"                     # "latest", an ISO-8601 time or ms since the epoch
    stop = "end"                           # or "never" (the default): run until SIGTERM/SIGINT
    key = "user"                           # a field of the JSON value, or "@key" (the subject)
    time = "ts"                            # a field, or "@timestamp" (the time JetStream stored it)
    fail_after_ms = 30000                  # a server unreachable this long fails the run

A :class:`NatsSourceSpec` has the attributes the rest of the pipeline reads from a
source (``kind``, ``key``, ``time``, ``live``, ``stop_mode``...); it has no files
(``paths`` is empty) and :meth:`open_live` builds the running
:class:`~sealstream.sources.nats.NatsSource`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sealstream.errors import SpecError
from sealstream.pipeline._live import LiveSourceSpec

if TYPE_CHECKING:
    from sealstream.sources._base import FieldPlan
    from sealstream.sources.nats import NatsSettings, NatsSource

#: the [source] settings a nats source takes (beside kind, key, time)
NATS_SETTINGS = frozenset(
    {"servers", "stream", "subjects", "start", "start_time_ms", "stop", "fail_after_ms",
     "poll_ms"}
)


@dataclass(frozen=True)
class NatsSourceSpec(LiveSourceSpec):
    """A JetStream stream's subjects as a pipeline's source. See the module docstring.

    >>> s = NatsSourceSpec(servers=("nats://127.0.0.1:4222",), stream="ORDERS",
    ...                    subjects=("orders.*",), key="@key", time="ts", stop="end")
    >>> s.live, s.stop_mode, s.settings().start
    (True, 'end', 'earliest')
    """

    servers: tuple[str, ...]
    stream: str
    subjects: tuple[str, ...]
    key: str
    time: str
    #: "earliest", "latest", or a time in ms since the epoch
    start: str | int = "earliest"
    stop: str | None = None
    fail_after_ms: int | None = None
    poll_ms: int = 200
    kind: Literal["nats"] = "nats"
    # what file sources have and a stream has not (the pipeline's checks read them)
    paths: tuple[str, ...] = field(default=(), repr=False)
    base_dir: Path = field(default=Path("."), repr=False)
    follow: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        self._check_common()
        self.settings()  # checks servers, stream, subjects, start, fail_after_ms

    def _what(self) -> str:
        return f"NATS stream {self.stream!r}"

    def settings(self) -> NatsSettings:
        from sealstream.sources.nats import DEFAULT_FAIL_AFTER_MS, NatsSettings

        table: dict[str, Any] = {
            "servers": list(self.servers), "stream": self.stream,
            "subjects": list(self.subjects), "start": self.start,
            "fail_after_ms": (DEFAULT_FAIL_AFTER_MS if self.fail_after_ms is None
                              else self.fail_after_ms),
        }
        return NatsSettings.from_table(table, where="source.")

    def open_live(self, plan: FieldPlan) -> NatsSource:
        """The running source (a :class:`~sealstream.sources._live.LiveSource`)."""
        from sealstream.sources.nats import NatsSource

        return NatsSource(self.settings(), plan)


def nats_source_from_dict(src: dict[str, Any]) -> NatsSourceSpec:
    """``[source]`` of ``kind = "nats"`` -> :class:`NatsSourceSpec` (SpecError naming
    the first bad setting)."""
    allowed = NATS_SETTINGS | {"kind", "key", "time", "types"}
    for name in src:
        if name not in allowed:
            raise SpecError(f"source.{name}: unknown setting for kind = \"nats\"; it takes "
                            f"{', '.join(sorted(allowed))}")
    for name in ("stream", "subjects", "key", "time"):
        if name not in src:
            raise SpecError(f"source.{name}: required setting is missing")
    for name in ("key", "time", "stream"):
        if not isinstance(src[name], str):
            raise SpecError(f"source.{name}: expected a string, got {src[name]!r}")
    for name in ("fail_after_ms", "poll_ms", "start_time_ms"):
        val = src.get(name)
        if val is not None and (isinstance(val, bool) or not isinstance(val, int)):
            raise SpecError(f"source.{name}: expected an integer, got {val!r}")
    stop = src.get("stop")
    if stop is not None and not isinstance(stop, str):
        raise SpecError(f"source.stop: expected \"end\" or \"never\", got {stop!r}")
    start = src.get("start", "earliest")
    if start == "time":  # as kind = "kafka" writes it
        if "start_time_ms" not in src:
            raise SpecError("source.start_time_ms: required with start = \"time\"")
        start = src["start_time_ms"]
    servers = src.get("servers", "nats://127.0.0.1:4222")
    subjects = src["subjects"]
    return NatsSourceSpec(
        servers=tuple(servers) if isinstance(servers, list) else (servers,),
        stream=src["stream"],
        subjects=tuple(subjects) if isinstance(subjects, list) else (subjects,),
        key=src["key"],
        time=src["time"],
        start=start,
        stop=stop,
        fail_after_ms=src.get("fail_after_ms"),
        poll_ms=src.get("poll_ms", 200),
    )
