"""``[source] kind = "kafka"``: a Kafka topic read live (see docs/kafka-source.md).

::

    [source]
    kind = "kafka"
    bootstrap = "127.0.0.1:9092"
    topic = "clicks"
    group = "clicks-per-minute"   # told the positions after each checkpoint (default: name)
    start = "earliest"            # or "latest", or "time" with start_time_ms
    stop = "end"                  # or "never" (the default): run until SIGTERM/SIGINT
    key = "user"                  # a field of the JSON value, or "@key" (the message key)
    time = "ts"                   # a field, or "@timestamp" (the message timestamp)
    fail_after_ms = 30000         # a broker unreachable this long fails the run
    client = { "fetch.max.bytes" = "52428800" }   # librdkafka settings passed through

A :class:`KafkaSourceSpec` has the attributes the rest of the pipeline reads from a
source (``kind``, ``key``, ``time``, ``live``, ``stop_mode``...); it has no files
(``paths`` is empty) and :meth:`open_live` builds the running
:class:`~sealstream.sources.kafka.KafkaSource`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sealstream.errors import SpecError
from sealstream.pipeline._live import LiveSourceSpec

if TYPE_CHECKING:
    from sealstream.sources._base import FieldPlan
    from sealstream.sources.kafka import KafkaSettings, KafkaSource

#: the [source] settings a kafka source takes (beside kind, key, time)
KAFKA_SETTINGS = frozenset(
    {"bootstrap", "topic", "group", "start", "start_time_ms", "stop", "client",
     "fail_after_ms", "poll_ms"}
)


@dataclass(frozen=True)
class KafkaSourceSpec(LiveSourceSpec):
    """A Kafka topic as a pipeline's source. See the module docstring.

    >>> s = KafkaSourceSpec(bootstrap="127.0.0.1:9092", topic="clicks", key="@key",
    ...                     time="ts", stop="end")
    >>> s.live, s.stop_mode, s.settings().start
    (True, 'end', 'earliest')
    """

    bootstrap: str
    topic: str
    key: str
    time: str
    group: str | None = None
    start: Literal["earliest", "latest", "time"] = "earliest"
    start_time_ms: int | None = None
    #: "end": read up to the end offsets seen at start, then stop (W = +inf);
    #: "never" (the default): run until SIGTERM/SIGINT
    stop: str | None = None
    #: librdkafka settings passed through, as (name, value) pairs
    client: tuple[tuple[str, str], ...] = ()
    fail_after_ms: int | None = None
    poll_ms: int = 200
    kind: Literal["kafka"] = "kafka"
    # what file sources have and a topic has not (the pipeline's checks read them)
    paths: tuple[str, ...] = field(default=(), repr=False)
    base_dir: Path = field(default=Path("."), repr=False)
    follow: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        self._check_common()
        self.settings()  # checks bootstrap, topic, start, client, fail_after_ms

    def _what(self) -> str:
        return f"kafka topic {self.topic!r}"

    def settings(self) -> KafkaSettings:
        from sealstream.sources.kafka import DEFAULT_FAIL_AFTER_MS, KafkaSettings

        return KafkaSettings(
            bootstrap=self.bootstrap,
            topic=self.topic,
            group=self.group,
            start=self.start,
            start_time_ms=self.start_time_ms,
            stop="end" if self.stop_mode == "end" else "never",
            client=dict(self.client),
            fail_after_ms=(DEFAULT_FAIL_AFTER_MS if self.fail_after_ms is None
                           else self.fail_after_ms),
        )

    def open_live(self, plan: FieldPlan) -> KafkaSource:
        """The running source (a :class:`~sealstream.sources._live.LiveSource`)."""
        from sealstream.sources.kafka import KafkaSource

        return KafkaSource(self.settings(), plan)


def kafka_source_from_dict(src: dict[str, Any]) -> KafkaSourceSpec:
    """``[source]`` of ``kind = "kafka"`` -> :class:`KafkaSourceSpec` (SpecError naming
    the first bad setting)."""
    allowed = KAFKA_SETTINGS | {"kind", "key", "time", "types"}
    for name in src:
        if name not in allowed:
            raise SpecError(f"source.{name}: unknown setting for kind = \"kafka\"; it takes "
                            f"{', '.join(sorted(allowed))}")

    def get(name: str, typ: type, default: Any) -> Any:
        if name not in src:
            if default is _REQUIRED:
                raise SpecError(f"source.{name}: required setting is missing")
            return default
        val = src[name]
        if typ is int and (isinstance(val, bool) or not isinstance(val, int)):
            raise SpecError(f"source.{name}: expected an integer, got {val!r}")
        if typ is str and not isinstance(val, str):
            raise SpecError(f"source.{name}: expected a string, got {val!r}")
        return val

    client = src.get("client", {})
    if not isinstance(client, dict) or not all(
        isinstance(v, str | int | float | bool) for v in client.values()
    ):
        raise SpecError(f"source.client: expected a table of librdkafka settings, e.g. "
                        f"client = {{ \"fetch.max.bytes\" = \"52428800\" }}, got {client!r}")
    start = get("start", str, "earliest")
    if start not in ("earliest", "latest", "time"):
        raise SpecError(f"source.start: expected \"earliest\", \"latest\" or \"time\", got "
                        f"{start!r}")
    try:
        return KafkaSourceSpec(
            bootstrap=get("bootstrap", str, _REQUIRED),
            topic=get("topic", str, _REQUIRED),
            key=get("key", str, _REQUIRED),
            time=get("time", str, _REQUIRED),
            group=get("group", str, None),
            start=start,
            start_time_ms=get("start_time_ms", int, None),
            stop=get("stop", str, None),
            client=tuple(sorted((str(k), _text(v)) for k, v in client.items())),
            fail_after_ms=get("fail_after_ms", int, None),
            poll_ms=get("poll_ms", int, 200),
        )
    except SpecError as e:
        msg = str(e)
        if msg.startswith("kafka source: "):  # KafkaSettings' checks: name the section
            raise SpecError("source: " + msg.removeprefix("kafka source: ")) from None
        raise


def _text(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


_REQUIRED = object()
