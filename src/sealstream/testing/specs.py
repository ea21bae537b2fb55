"""The spec text the benches and tests write: one template, its varying parts given.

Every bench and most test stories run the same shape of pipeline (a source keyed
by ``user`` with times in ``ts``, a watermark, a tumbling minute, ``count`` and
``sum(amount)``, JSON Lines results in ``out``, checkpoints in ``ckpt``) and
differ in a few places: the source, the window, the batch size, the checkpoint
cadence. :func:`spec_text` writes that spec with those places as parameters::

    >>> print(spec_text("demo", files_source(["in/p0.jsonl"]), every_events=1000))
    [pipeline]
    name = "demo"
    <BLANKLINE>
    [source]
    kind = "jsonl"
    paths = ["in/p0.jsonl"]
    key = "user"
    time = "ts"
    <BLANKLINE>
    [watermark]
    max_delay_ms = 1000
    <BLANKLINE>
    [window]
    kind = "tumbling"
    size_ms = 60000
    <BLANKLINE>
    [aggregates]
    n = "count"
    total = "sum(amount)"
    <BLANKLINE>
    [sink]
    kind = "jsonl"
    path = "out"
    <BLANKLINE>
    [checkpoint]
    path = "ckpt"
    every_events = 1000
    <BLANKLINE>

Sections whose content varies by kind (``source``, ``window``, ``transform``,
``sink``, the checkpoint store) are given as TOML lines, the rest as values.
Each section is a ``[name]`` line followed by its ``key = value`` lines, sections
apart by one blank line, so a test may still edit the text (e.g. replace
``'[sink]\\nkind = "jsonl"\\npath = "out"'``). To write a spec from generated
files with every setting as a Python value, see
:func:`sealstream.testing.datagen.write_spec`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["COUNT_AND_SUM", "JSONL_OUT", "TUMBLING_MINUTE", "files_source", "spec_text",
           "tumbling"]

COUNT_AND_SUM: Mapping[str, str] = {"n": "count", "total": "sum(amount)"}
"""The standard workload's aggregates."""

JSONL_OUT = 'kind = "jsonl"\npath = "out"'
"""The ``[sink]`` lines of JSON Lines results in ``out``."""


def files_source(paths: Iterable[str | Path], kind: str = "jsonl") -> str:
    """The ``[source]`` lines reading files: ``kind`` and ``paths`` (each written as
    given: a relative path is relative to where the job runs, a glob stays a glob)."""
    quoted = ", ".join(json.dumps(str(p)) for p in paths)
    return f"kind = {json.dumps(kind)}\npaths = [{quoted}]"


def tumbling(size_ms: int = 60_000, allowed_lateness_ms: int | None = None) -> str:
    """The ``[window]`` lines of a tumbling window."""
    lines = f'kind = "tumbling"\nsize_ms = {size_ms}'
    if allowed_lateness_ms is not None:
        lines += f"\nallowed_lateness_ms = {allowed_lateness_ms}"
    return lines


TUMBLING_MINUTE = tumbling()
"""The standard workload's window: tumbling, 60 s."""


def _section(name: str, *lines: str) -> str:
    body = "\n".join(line.strip() for line in lines if line.strip())
    return f"[{name}]\n{body}\n"


def spec_text(
    name: str,
    source: str,
    *,
    key: str | None = "user",
    time: str | None = "ts",
    batch_size: int | None = None,
    max_delay_ms: int = 1000,
    idle_ms: int | None = None,
    transform: str | None = None,
    window: str = TUMBLING_MINUTE,
    aggregates: Mapping[str, str] = COUNT_AND_SUM,
    sink: str = JSONL_OUT,
    late: bool = False,
    errors: bool = False,
    checkpoint: str | None = 'path = "ckpt"',
    every_events: int | None = None,
    every_ms: int | None = None,
    keep: int | None = None,
) -> str:
    """The TOML text of a spec: pipeline ``name`` reading ``source``.

    * ``source``: the ``[source]`` lines saying where events come from (see
      :func:`files_source`); ``key`` and ``time`` follow them unless ``None`` (when
      ``source`` names them itself).
    * ``batch_size`` goes to ``[pipeline]`` when given; ``max_delay_ms`` and
      ``idle_ms`` (when given) to ``[watermark]``.
    * ``transform``, ``window``, ``sink``: those sections' lines (no
      ``[transform]`` unless given); ``aggregates``: output name -> expression.
    * ``late``, ``errors``: also write late events to ``late`` and bad records to
      ``errors``, as JSON Lines.
    * ``checkpoint``: the ``[checkpoint]`` lines before the cadence (the store,
      ``path = "ckpt"`` by default, and any other setting), then ``every_events``,
      ``every_ms`` and ``keep`` when given; ``None`` leaves the section out.
    """
    sections = [
        _section("pipeline", f"name = {json.dumps(name)}",
                 f"batch_size = {batch_size}" if batch_size is not None else ""),
        _section("source", source,
                 f"key = {json.dumps(key)}" if key is not None else "",
                 f"time = {json.dumps(time)}" if time is not None else ""),
        _section("watermark", f"max_delay_ms = {max_delay_ms}",
                 f"idle_ms = {idle_ms}" if idle_ms is not None else ""),
    ]
    if transform is not None:
        sections.append(_section("transform", transform))
    sections += [
        _section("window", window),
        _section("aggregates", *(f"{out} = {json.dumps(expr)}"
                                 for out, expr in aggregates.items())),
        _section("sink", sink),
    ]
    for wanted, output in ((late, "late"), (errors, "errors")):
        if wanted:
            sections.append(_section(output, f'kind = "jsonl"\npath = "{output}"'))
    cadence = {"every_events": every_events, "every_ms": every_ms, "keep": keep}
    if checkpoint is not None:
        sections.append(_section("checkpoint", checkpoint, *(
            f"{k} = {v}" for k, v in cadence.items() if v is not None)))
    elif any(v is not None for v in cadence.values()):
        raise ValueError("every_events, every_ms and keep need a [checkpoint] section")
    return "\n".join(sections)
