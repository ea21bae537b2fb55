"""Validation of a pipeline's settings: :func:`validate` raises a SpecError naming
the first bad setting (``window.size_ms: must be > 0, got 0``)."""

from __future__ import annotations

import glob
import re
from collections.abc import Mapping
from pathlib import Path

from sealstream.errors import SpecError
from sealstream.pipeline.join import check_join
from sealstream.pipeline.kafka import KafkaSourceSpec
from sealstream.pipeline.model import (
    Checkpoints,
    Output,
    Pipeline,
    Session,
    Sliding,
    Tumbling,
    Watermark,
    parse_aggregate,
)
from sealstream.pipeline.nats import NatsSourceSpec
from sealstream.pipeline.source import FileSource, Sources
from sealstream.pipeline.types import check_types as check_declared_types


def _check_kafka_output(section: str, out: Output,
                        topics: dict[tuple[str, str], str]) -> None:
    """A Kafka output names a broker and a valid topic that no other output uses."""
    if out.url is not None or out.table is not None:
        raise SpecError(f"{section}: a kafka output takes bootstrap and topic, not url/table")
    if not out.bootstrap:
        raise SpecError(f'{section}.bootstrap: a kafka output needs the broker address, '
                        f'e.g. "127.0.0.1:9092"')
    if not out.topic:
        raise SpecError(f"{section}.topic: a kafka output needs a topic")
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", out.topic) or out.topic in (".", ".."):
        raise SpecError(f"{section}.topic: {out.topic!r} is not a valid Kafka topic name "
                        "(letters, digits, '.', '_', '-')")
    where = (out.bootstrap, out.topic)
    if where in topics:
        raise SpecError(f"{section}.topic: {out.topic!r} is also the {topics[where]} topic; "
                        "give each output its own")
    topics[where] = section


def _check_table_output(section: str, out: Output) -> None:
    """A database output names its database and a valid table, and nothing else."""
    import re as _re

    from sealstream.checkpoint.stores import check_url, is_postgres, redact

    if out.path is not None:
        raise SpecError(f"{section}.path: a {out.kind} output takes url and table, not path")
    if not out.url:
        example = ("sqlite:///results.db" if out.kind == "sqlite"
                   else "postgresql://user@host/db")
        raise SpecError(f"{section}.url: a {out.kind} output needs a url, e.g. {example!r}")
    if (out.kind == "postgresql") != is_postgres(out.url):
        raise SpecError(f"{section}.url: {redact(out.url)!r} is not a {out.kind} url")
    check_url(out.url, out.base_dir)
    if not out.table:
        raise SpecError(f"{section}.table: a {out.kind} output needs a table name")
    ident = r"[A-Za-z_][A-Za-z0-9_]{0,62}"
    pattern = ident if out.kind == "sqlite" else rf"(?:{ident}\.)?{ident}"
    if not _re.fullmatch(pattern, out.table) or out.table.lower().startswith("sealstream_"):
        raise SpecError(f"{section}.table: {out.table!r} is not a valid table name "
                        "(letters, digits and _, not starting with a digit or sealstream_)")


MAX_SETTING = 10**15
"""The largest integer a setting takes (ms: about 31,700 years). Durations stay far
below the engine's infinities (2**62) added to any event time (at most 2**61)."""


def _positive(setting: str, value: object, *, zero_ok: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{setting}: expected an integer, got {value!r}")
    if value < 0 or (value == 0 and not zero_ok):
        bound = ">= 0" if zero_ok else "> 0"
        raise SpecError(f"{setting}: must be {bound}, got {value}")
    if value > MAX_SETTING:
        raise SpecError(f"{setting}: must be at most {MAX_SETTING:,}, got {value}")
    return value


def _check_path(setting: str, value: object) -> None:
    if isinstance(value, str) and "\x00" in value:
        raise SpecError(f"{setting}: path {value!r} contains a NUL character")


def _check_types(p: Pipeline) -> None:
    """Each part of a pipeline built in Python is of its type (not a dict, a string
    or a number standing for one)."""
    def bad(setting: str, want: str, got: object) -> SpecError:
        return SpecError(f"{setting}: expected {want}, got {type(got).__name__} {got!r:.60}")

    parts: list[tuple[str, object, tuple[type, ...], str]] = [
        ("source", p.source, (FileSource, KafkaSourceSpec, NatsSourceSpec, Sources),
         "a FileSource, KafkaSourceSpec, NatsSourceSpec or Sources"),
        ("window", p.window, (Tumbling, Sliding, Session), "a Tumbling, Sliding or Session"),
        ("watermark", p.watermark, (Watermark,), "a Watermark"),
        ("sink", p.sink, (Output,), "an Output"),
        ("late", p.late, (Output, type(None)), "an Output or None"),
        ("errors", p.errors, (Output, type(None)), "an Output or None"),
        ("checkpoint", p.checkpoint, (Checkpoints, type(None)), "a Checkpoints or None"),
    ]
    for setting, value, types, want in parts:
        if not isinstance(value, types):
            raise bad(setting, want, value)
    if not isinstance(p.aggregates, Mapping):
        raise bad("aggregates", 'a mapping of output name to function, e.g. {"n": "count"}',
                  p.aggregates)
    paths = p.source.paths
    if isinstance(paths, str | bytes) or not all(isinstance(x, str) for x in paths):
        raise bad("source.paths", "a list of paths (strings), e.g. ['in/p0.jsonl']", paths)


def _refuse_object_paths(p: Pipeline) -> None:
    """Sources in object storage are bounded only (followed ones refused in one line,
    before anything is read). Outputs in S3 (jsonl, parquet) are checked here: a well-formed
    ``s3://bucket/prefix``, none inside another's prefix nor the checkpoints'."""
    for i, path in enumerate(p.source.paths):
        if path.lower().startswith("s3://") and getattr(p.source, "follow", False):
            raise SpecError(f"source.paths[{i}]: {path!r}: following objects in S3 is not "
                            "supported yet (bounded runs only: remove follow)")
    urls: dict[str, str] = {}
    for section, out in (("sink", p.sink), ("late", p.late), ("errors", p.errors)):
        if out is None:
            continue
        if not (isinstance(out.path, str) and out.path.lower().startswith("s3://")):
            if out.endpoint_url is not None:
                raise SpecError(f"{section}.endpoint_url: only for an s3:// path")
            continue
        if out.kind not in ("jsonl", "parquet"):
            raise SpecError(f"{section}.path: {out.path!r}: only jsonl and parquet outputs "
                            f"can be in S3, not {out.kind!r}")
        from sealstream._objects import ObjectStoreError
        from sealstream._objects.s3 import parse_url

        try:
            bucket, prefix = parse_url(out.path)
        except ObjectStoreError as exc:
            raise SpecError(f"{section}.path: {exc}") from None
        where = f"{bucket}/{prefix}"
        for other, at in urls.items():
            if where == at or where.startswith(at + "/") or at.startswith(where + "/"):
                raise SpecError(f"{section}.path: {out.path!r} overlaps the {other} output; "
                                "give each its own prefix")
        urls[section] = where
    ckpt = p.checkpoint.url if p.checkpoint is not None else None
    if urls and isinstance(ckpt, str) and ckpt.lower().startswith("s3://"):
        from sealstream._objects import ObjectStoreError as _Bad
        from sealstream._objects.s3 import parse_url as _parse

        try:
            at = "/".join(_parse(ckpt))
        except _Bad:
            return  # checkpoint.url says what is wrong with it
        for section, where in urls.items():
            if where == at or where.startswith(at + "/") or at.startswith(where + "/"):
                raise SpecError(f"{section}.path: {where!r} overlaps the checkpoints' "
                                f"prefix (checkpoint.url); give each its own")


def validate(p: Pipeline) -> None:
    """Check a pipeline's settings; raise SpecError naming the first bad one."""
    _check_types(p)
    check_declared_types(p)
    _refuse_object_paths(p)
    for i, path in enumerate(p.source.paths):
        _check_path(f"source.paths[{i}]", path)
    for section, out in (("sink", p.sink), ("late", p.late), ("errors", p.errors)):
        if out is not None:
            _check_path(f"{section}.path", out.path)
    if p.checkpoint is not None:
        _check_path("checkpoint.path", p.checkpoint.path)
        _check_path("checkpoint.url", p.checkpoint.url)
    if not isinstance(p.name, str) or not p.name.strip():
        raise SpecError(f"pipeline.name: must be a non-empty string, got {p.name!r}")
    if isinstance(p.source, Sources):
        check_join(p)
    elif p.join is not None:
        raise SpecError("join: a join needs several sources ([sources.NAME] tables)")
    if p.source.kind not in ("jsonl", "csv", "parquet", "kafka", "nats", "sources"):
        raise SpecError(f"source.kind: {p.source.kind!r} is not one of jsonl, csv, parquet, "
                        "kafka, nats")
    if not p.source.paths and p.source.kind not in ("kafka", "nats", "sources"):
        raise SpecError("source.paths: at least one input file is needed")
    keys = p.source.key_fields or (p.source.key,)
    if not keys:
        raise SpecError("source.key: a compound key needs at least one field")
    for setting, val in [*(("source.key", k) for k in keys), ("source.time", p.source.time)]:
        if not isinstance(val, str) or not val:
            raise SpecError(f"{setting}: must be a non-empty field name, got {val!r}")
    if len(set(keys)) != len(keys):
        raise SpecError(f"source.key: a field is named twice in {list(keys)!r}")
    if p.source.time in keys:
        raise SpecError(f"source.key and source.time are the same field {p.source.time!r}")
    if p.source.key_fields is not None:
        reserved = [k for k in keys if k in ("window_start", "window_end")
                    or k in p.aggregates]
        if reserved:
            raise SpecError(f"source.key: {reserved[0]!r} would name two result columns")
        if p.sink.kind in ("sqlite", "postgresql") and "key_types" in keys:
            raise SpecError("source.key: 'key_types' names a column of the results table "
                            "(the kind of each key field); rename the field with "
                            "[transform] fields")
    if p.workers is not None:
        _positive("pipeline.workers", p.workers)
    _positive("watermark.max_delay_ms", p.watermark.max_delay_ms, zero_ok=True)
    if p.watermark.idle_ms is not None:
        _positive("watermark.idle_ms", p.watermark.idle_ms)
    w = p.window
    _positive("window.allowed_lateness_ms", w.allowed_lateness_ms, zero_ok=True)
    if isinstance(w, Tumbling):
        _positive("window.size_ms", w.size_ms)
    elif isinstance(w, Sliding):
        _positive("window.size_ms", w.size_ms)
        _positive("window.slide_ms", w.slide_ms)
        if w.slide_ms > w.size_ms:
            raise SpecError(
                f"window.slide_ms: must be <= size_ms ({w.size_ms}), got {w.slide_ms}"
            )
    elif isinstance(w, Session):
        _positive("window.gap_ms", w.gap_ms)
    else:
        raise SpecError(f"window: unknown window {w!r}")
    if not p.aggregates:
        raise SpecError("aggregates: at least one aggregate is needed, e.g. n = \"count\"")
    aggs = [parse_aggregate(n, e) for n, e in p.aggregates.items()]
    from sealstream.transforms import compile_transform

    if not isinstance(p.source, Sources):
        compile_transform(p)  # a bad expression names its setting and position
    for a in aggs:
        if a.field is not None and a.field in keys:
            raise SpecError(f"aggregates.{a.name}: {a.expr} reads the key field")
    outputs = [("sink", p.sink), ("late", p.late), ("errors", p.errors)]
    seen: dict[Path, str] = {}
    topics: dict[tuple[str, str], str] = {}
    for section, out in outputs:
        if out is None:
            continue
        allowed = (("jsonl", "parquet", "stdout", "sqlite", "postgresql", "kafka")
                   if section == "sink" else ("jsonl", "stdout", "kafka"))
        if out.kind not in allowed:
            raise SpecError(f"{section}.kind: {out.kind!r} is not one of {', '.join(allowed)}")
        if out.kind == "kafka":
            _check_kafka_output(section, out, topics)
            if out.path:  # its staging directory
                res = out.resolved.resolve()
                if res in seen:
                    raise SpecError(f"{section}.path: {out.path!r} is also the {seen[res]} "
                                    "directory")
                _check_dir(f"{section}.path", out.path, res)
                seen[res] = section
            continue
        if out.bootstrap is not None or out.topic is not None or out.settings:
            raise SpecError(f"{section}: bootstrap, topic and settings are for kind = "
                            f'"kafka", not {out.kind!r}')
        if out.kind in ("sqlite", "postgresql"):
            _check_table_output(section, out)
            continue
        if out.url is not None or out.table is not None:
            raise SpecError(f"{section}: url and table are for kind = \"sqlite\" or "
                            f"\"postgresql\", not {out.kind!r}")
        if out.kind == "stdout" and out.path is not None:
            raise SpecError(f"{section}.path: a stdout output takes no path")
        if out.kind != "stdout":
            if not out.path:
                raise SpecError(f"{section}.path: a {out.kind} output needs a directory path")
            if out.path.lower().startswith("s3://"):
                continue  # checked by _refuse_object_paths
            res = out.resolved.resolve()
            if res in seen:
                raise SpecError(f"{section}.path: {out.path!r} is also the {seen[res]} directory")
            _check_dir(f"{section}.path", out.path, res)
            seen[res] = section
    if p.checkpoint is not None:
        c = p.checkpoint
        if c.url is not None:
            if c.path:
                raise SpecError("checkpoint: set either path or url, not both")
            from sealstream.checkpoint.stores import check_url

            check_url(c.url, c.base_dir)
        elif not c.path:
            raise SpecError("checkpoint.path: must name a directory")
        if c.every_events is not None:
            _positive("checkpoint.every_events", c.every_events)
        if c.every_ms is not None:
            _positive("checkpoint.every_ms", c.every_ms)
        _positive("checkpoint.keep", c.keep)
        _positive("checkpoint.full_every", c.full_every)
        if c.max_age_s is not None:
            check_max_age("checkpoint.max_age_s", c.max_age_s)
        res = c.resolved.resolve()
        if c.url is None:
            if res in seen:
                raise SpecError(f"checkpoint.path: {c.path!r} is also the {seen[res]} directory")
            _check_dir("checkpoint.path", c.path, res)
            seen[res] = "checkpoint"
    _check_layout(p, seen)
    _positive("pipeline.batch_size", p.batch_size)
    if p.max_bad_ratio is not None:
        check_bad_ratio("pipeline.max_bad_ratio", p.max_bad_ratio)


def _number(setting: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{setting}: expected a number, got {value!r}")
    return float(value)


def check_bad_ratio(setting: str, value: object) -> float:
    """A share of bad records: a number from 0 to 1."""
    ratio = _number(setting, value)
    if not 0.0 <= ratio <= 1.0:
        raise SpecError(f"{setting}: must be between 0 and 1 (1 accepts any share of bad "
                        f"records), got {value!r}")
    return ratio


def check_max_age(setting: str, value: object) -> float:
    """A maximum checkpoint age in seconds: a positive, finite number."""
    age = _number(setting, value)
    if not 0.0 < age < 1e12:
        raise SpecError(f"{setting}: must be a positive number of seconds, got {value!r}")
    return age


def _check_dir(setting: str, written: str | None, res: Path) -> None:
    if res.exists() and not res.is_dir():
        raise SpecError(f"{setting}: {written!r} is a file, not a directory ({res})")


def _check_layout(p: Pipeline, dirs: dict[Path, str]) -> None:
    """Output directories (results, late, errors, checkpoints) neither nest in each
    other nor hold an input: a run would read, clear away or commit the other's
    files as its own."""
    written = {"sink": p.sink.path, "late": p.late.path if p.late else None,
               "errors": p.errors.path if p.errors else None,
               "checkpoint": p.checkpoint.path if p.checkpoint else None}
    found = list(dirs.items())
    for i, (a, sa) in enumerate(found):
        for b, sb in found[i + 1:]:
            if a.is_relative_to(b) or b.is_relative_to(a):
                inner, outer = (sa, sb) if a.is_relative_to(b) else (sb, sa)
                raise SpecError(f"{inner}.path: {written[inner]!r} is inside the {outer} "
                                f"directory {written[outer]!r} ({outer}.path); give each "
                                "its own")
    for i, path in enumerate(p.source.paths):
        parts = Path(path).parts
        cut = next((k for k, part in enumerate(parts) if glob.has_magic(part)), len(parts))
        at = (p.source.base_dir / Path(*parts[:cut])).resolve()
        for d, section in found:
            if at.is_relative_to(d):
                raise SpecError(f"source.paths[{i}]: {path!r} is inside the {section} "
                                f"directory {written[section]!r} ({section}.path); "
                                "inputs and outputs must be apart")
        if cut < len(parts):  # a glob above an output directory may match its files
            for m in sorted(glob.glob(path, root_dir=p.source.base_dir)):
                hit = (p.source.base_dir / m).resolve()
                for d, section in found:
                    if hit.is_relative_to(d):
                        raise SpecError(
                            f"source.paths[{i}]: {path!r} matches {m!r}, a file of the "
                            f"{section} directory {written[section]!r} ({section}.path); "
                            "narrow the pattern")


