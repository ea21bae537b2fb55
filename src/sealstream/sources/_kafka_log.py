"""librdkafka's log and broker trouble, in sealstream's words (source and sinks).

librdkafka prints its log on stderr by itself (``%3|...|FAIL|...`` lines, hundreds
while a broker is unreachable). Every client sealstream makes (consumers, producers)
sets confluent-kafka's ``logger`` to :data:`CLIENT_LOG` instead: the lines go to the
Python logger ``sealstream.kafka.client`` (silent unless the application attaches a
handler) and never to stderr directly.

While a client retries, :func:`note_trouble` prints at most one line per distinct
kind of broker error and address in the process (connection refused, no answer,
unknown host...), on stderr::

    sealstream: warning: kafka source: the broker at 127.0.0.1:9092 refuses
    connections (...: Connect to ipv4#127.0.0.1:9092 failed: Connection refused); retrying

(one line on stderr, wrapped here).

The error that ends the retrying is the run's one error line, as before.
"""

from __future__ import annotations

import logging
import re
import sys
import threading

#: librdkafka's ``receive.message.max.bytes`` for every consumer that reads records:
#: its largest value. A broker that does not bound a fetch's answer by
#: ``fetch.max.bytes`` (noida-db answers a backlog of 2,000,000 events in one response
#: of ~118 MB) is otherwise refused by the 100 MB default on every try, and the read
#: never moves (a source failed with "Bad message format"). Kafka bounds the answer, so
#: there this changes nothing; a spec's ``client`` table can still set another value.
RECEIVE_MAX_BYTES = 2_147_483_647

CLIENT_LOG = logging.getLogger("sealstream.kafka.client")
CLIENT_LOG.addHandler(logging.NullHandler())
CLIENT_LOG.propagate = False  # an application's root handler would flood again

_seen: set[tuple[str, str]] = set()
_lock = threading.Lock()

#: (pattern in librdkafka's text, kind, our words)
_KINDS = (
    (re.compile(r"connection refused", re.I), "refused", "refuses connections"),
    (re.compile(r"resolve|name or service not known|nodename", re.I), "resolve",
     "cannot be resolved"),
    (re.compile(r"timed out|timeout", re.I), "timeout", "does not answer in time"),
    (re.compile(r"brokers are down|transport failure|disconnected|connect to|"
                r"connection reset|broken pipe", re.I), "down", "cannot be reached"),
)


def kind_of(text: str) -> tuple[str, str]:
    """(kind, our words) of a librdkafka error text; ("other", "fails") if unknown."""
    for pattern, kind, words in _KINDS:
        if pattern.search(text):
            return kind, words
    return "other", "fails"


def is_unanswered(text: str) -> bool:
    """Whether ``text`` says the broker did not answer (unreachable or timed out)."""
    return kind_of(text)[0] in ("refused", "resolve", "timeout", "down")


def note_trouble(who: str, bootstrap: str, text: str) -> None:
    """Print one line on stderr for the first error of its kind at ``bootstrap`` in
    this process (``who``: "kafka source", "kafka sink"); later ones of the same
    kind stay quiet (they are in :data:`CLIENT_LOG`)."""
    kind, words = kind_of(text)
    with _lock:
        if (bootstrap, kind) in _seen:
            return
        _seen.add((bootstrap, kind))
    detail = text.strip().splitlines()[0][:200] if text.strip() else ""
    detail = re.sub(r"\s*\(after \d+ms in state \w+[^)]*\)", "", detail)
    print(f"sealstream: warning: {who}: the broker at {bootstrap} {words}"
          + (f" ({detail})" if detail else "") + "; retrying",
          file=sys.stderr, flush=True)


__all__ = ["CLIENT_LOG", "is_unanswered", "kind_of", "note_trouble"]
