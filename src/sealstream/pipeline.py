"""The user-facing pipeline definition and the TOML spec loader.

A :class:`Pipeline` is a frozen description: source -> watermark -> window ->
aggregates -> sink, with optional late and error outputs and checkpoints. The
TOML spec (``sealstream run SPEC.toml``) loads into exactly these objects.

Example::

    >>> from sealstream import Pipeline, FileSource, Tumbling, Output
    >>> p = Pipeline(
    ...     name="payments",
    ...     source=FileSource(kind="jsonl", paths=("in/p0.jsonl",), key="user", time="ts"),
    ...     window=Tumbling(size_ms=60_000),
    ...     aggregates={"n": "count", "total": "sum(amount)"},
    ...     sink=Output(kind="jsonl", path="out"),
    ... )
    >>> p.window.kind
    'tumbling'
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from sealstream.errors import SpecError
from sealstream.sources._base import FieldKind, FieldPlan

STATE_FORMAT_VERSION = 1
# records per partition per step: memory and speed only, never the results
DEFAULT_BATCH_SIZE = 262_144
#: without a limit (``[pipeline] max_bad_ratio``, ``--max-bad-ratio``) a run fails
#: (exit 1, after committing) only when it had records and none was good, and warns
#: when more than this share of its records is bad
WARN_BAD_RATIO = 0.5
AGGREGATE_FUNCTIONS = ("count", "sum", "min", "max", "mean", "first", "last")
NUMERIC_FUNCTIONS = frozenset({"sum", "min", "max", "mean"})
_AGG_RE = re.compile(r"^\s*(count|sum|min|max|mean|first|last)\s*(?:\(\s*([^()\s]*)\s*\))?\s*$")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
RESERVED_OUTPUT_NAMES = frozenset({"key", "window_start", "window_end"})

SourceKind = Literal["jsonl", "csv", "parquet"]
WindowKind = Literal["tumbling", "sliding", "session"]


@dataclass(frozen=True)
class FileSource:
    """Files read as partitions, one partition per file, in the order given.

    ``paths`` are as written by the user (globs allowed); ``base_dir`` is what
    they are relative to. :meth:`partitions` expands globs (sorted) and checks
    that every file exists.
    """

    kind: SourceKind
    paths: tuple[str, ...]
    key: str
    time: str
    base_dir: Path = Path(".")

    def partitions(self) -> list[tuple[str, Path]]:
        """``(name as written, resolved path)`` for every partition, in read order."""
        out: list[tuple[str, Path]] = []
        for written in self.paths:
            if glob.has_magic(written):
                matches = sorted(glob.glob(written, root_dir=self.base_dir))
                if not matches:
                    raise SpecError(f"source.paths: {written!r} matches no file in {self.base_dir}")
                for m in matches:
                    path = self.base_dir / m
                    if not path.is_file():
                        raise SpecError(f"source.paths: {written!r} matches {m!r}, which is "
                                        f"{_not_a_file(path)}")
                    out.append((m, path))
            else:
                path = self.base_dir / written
                if not path.is_file():
                    what = ("does not exist" if not path.exists()
                            else f"is {_not_a_file(path)}")
                    raise SpecError(f"source.paths: input file {written!r} {what} ({path})")
                out.append((written, path))
        seen: dict[str, str] = {}
        for name, path in out:
            real = os.path.realpath(path)
            if real in seen:
                same = ("is listed twice" if seen[real] == name
                        else f"and {seen[real]!r} are the same file")
                raise SpecError(f"source.paths: partition {name!r} {same}")
            seen[real] = name
        return out


def _not_a_file(path: Path) -> str:
    return "a directory, not a file" if path.is_dir() else "not a regular file"


@dataclass(frozen=True)
class Watermark:
    """Bounded out-of-orderness: ``W_p = max(event time seen in p) - max_delay_ms``."""

    max_delay_ms: int = 0


@dataclass(frozen=True)
class Tumbling:
    """Fixed windows ``[k*size, (k+1)*size)``."""

    size_ms: int
    allowed_lateness_ms: int = 0
    kind: Literal["tumbling"] = "tumbling"


@dataclass(frozen=True)
class Sliding:
    """Windows of ``size_ms`` starting every ``slide_ms`` (``0 < slide <= size``)."""

    size_ms: int
    slide_ms: int
    allowed_lateness_ms: int = 0
    kind: Literal["sliding"] = "sliding"


@dataclass(frozen=True)
class Session:
    """Per-key sessions closed by ``gap_ms`` of inactivity (Flink semantics)."""

    gap_ms: int
    allowed_lateness_ms: int = 0
    kind: Literal["session"] = "session"


Window = Tumbling | Sliding | Session


@dataclass(frozen=True)
class Aggregate:
    """One output column: ``name = func(field)``; ``field`` is None for count."""

    name: str
    func: str
    field: str | None

    @property
    def expr(self) -> str:
        return self.func if self.field is None else f"{self.func}({self.field})"


@dataclass(frozen=True)
class Output:
    """A directory output (``jsonl`` or ``parquet``), ``stdout``, or a database table
    (``sqlite`` or ``postgresql``: ``url`` and ``table``; results only)."""

    kind: Literal["jsonl", "parquet", "stdout", "sqlite", "postgresql"]
    path: str | None = None
    base_dir: Path = Path(".")
    url: str | None = None
    table: str | None = None

    @property
    def resolved(self) -> Path:
        if self.path is None:
            raise SpecError(f"an output of kind {self.kind!r} has no path")
        return self.base_dir / self.path


@dataclass(frozen=True)
class Checkpoints:
    """Where and how often to checkpoint; ``keep`` verified checkpoints are retained."""

    path: str = ""
    every_events: int | None = None
    every_ms: int | None = None
    keep: int = 3
    base_dir: Path = Path(".")
    #: write deltas (only the keys whose windows changed) between full snapshots
    incremental: bool = False
    #: with ``incremental``: a full snapshot every this many checkpoints
    full_every: int = 10
    #: encode, write and publish checkpoints on a writer thread while processing
    #: continues (sinks commit after the publish either way)
    asynchronous: bool = True
    #: instead of ``path``: a store URL, ``sqlite:///ckpt.db`` (relative to ``base_dir``)
    url: str | None = None
    #: freshness: a checkpoint older than this many seconds is STALE (not resumed
    #: from); None: any age
    max_age_s: float | None = None

    @property
    def resolved(self) -> Path:
        return self.base_dir / self.path

    def open_store(self, pipeline: str) -> Any:
        """The checkpoint store this section names (a CheckpointStore)."""
        from sealstream.checkpoint.stores import open_store

        return open_store(self.url if self.url else self.resolved, pipeline, self.base_dir)


@dataclass(frozen=True)
class Pipeline:
    """A complete, validated pipeline definition. See the module docstring."""

    name: str
    source: FileSource
    window: Window
    aggregates: Mapping[str, str]
    sink: Output
    watermark: Watermark = field(default_factory=Watermark)
    late: Output | None = None
    errors: Output | None = None
    checkpoint: Checkpoints | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    max_bad_ratio: float | None = None

    def __post_init__(self) -> None:
        validate(self)

    @property
    def parsed_aggregates(self) -> list[Aggregate]:
        return [parse_aggregate(n, e) for n, e in self.aggregates.items()]

    def field_plan(self) -> FieldPlan:
        kinds: dict[str, FieldKind] = {}
        for agg in self.parsed_aggregates:
            if agg.field is None:
                continue
            numeric = agg.func in NUMERIC_FUNCTIONS
            if numeric or agg.field not in kinds:
                kinds[agg.field] = "numeric" if numeric else "any"
        return FieldPlan(key=self.source.key, time=self.source.time, fields=kinds)

    def fingerprint_fields(self) -> dict[str, Any]:
        """What the saved state depends on; changing any of these changes the fingerprint."""
        return {
            "format": STATE_FORMAT_VERSION,
            "pipeline": self.name,
            "source": {
                "kind": self.source.kind,
                "partitions": [n for n, _ in self.source.partitions()],
                "key": self.source.key,
                "time": self.source.time,
            },
            "watermark": {"max_delay_ms": self.watermark.max_delay_ms},
            "window": _window_dict(self.window),
            "aggregates": {a.name: a.expr for a in self.parsed_aggregates},
        }

    def fingerprint(self) -> str:
        blob = json.dumps(self.fingerprint_fields(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def _window_dict(w: Window) -> dict[str, Any]:
    if isinstance(w, Tumbling):
        return {"kind": "tumbling", "size_ms": w.size_ms, "lateness_ms": w.allowed_lateness_ms}
    if isinstance(w, Sliding):
        return {
            "kind": "sliding",
            "size_ms": w.size_ms,
            "slide_ms": w.slide_ms,
            "lateness_ms": w.allowed_lateness_ms,
        }
    return {"kind": "session", "gap_ms": w.gap_ms, "lateness_ms": w.allowed_lateness_ms}


def parse_aggregate(name: str, expr: object) -> Aggregate:
    """Parse ``"sum(amount)"`` into an :class:`Aggregate`, or raise SpecError."""
    setting = f"aggregates.{name}"
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise SpecError(f"aggregates: output name {name!r} is not a valid name")
    if name in RESERVED_OUTPUT_NAMES:
        raise SpecError(f"{setting}: {name!r} is reserved for the result's identity")
    if not isinstance(expr, str):
        raise SpecError(f"{setting}: expected a string like \"sum(amount)\", got {expr!r}")
    m = _AGG_RE.match(expr)
    if not m:
        raise SpecError(
            f"{setting} = {expr!r}: unknown aggregate; use one of "
            "count, sum(f), min(f), max(f), mean(f), first(f), last(f)"
        )
    func, fld = m.group(1), m.group(2)
    if func == "count":
        if fld:
            raise SpecError(f"{setting} = {expr!r}: count takes no field (it counts records)")
        return Aggregate(name, "count", None)
    if not fld:
        raise SpecError(f"{setting} = {expr!r}: {func} needs a field, e.g. {func}(amount)")
    if "," in fld:
        raise SpecError(f"{setting} = {expr!r}: {func} takes one field")
    return Aggregate(name, func, fld)


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
        ("source", p.source, (FileSource,), "a FileSource"),
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


def validate(p: Pipeline) -> None:
    """Check a pipeline's settings; raise SpecError naming the first bad one."""
    _check_types(p)
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
    if p.source.kind not in ("jsonl", "csv", "parquet"):
        raise SpecError(f"source.kind: {p.source.kind!r} is not one of jsonl, csv, parquet")
    if not p.source.paths:
        raise SpecError("source.paths: at least one input file is needed")
    for setting, val in (("source.key", p.source.key), ("source.time", p.source.time)):
        if not isinstance(val, str) or not val:
            raise SpecError(f"{setting}: must be a non-empty field name, got {val!r}")
    if p.source.key == p.source.time:
        raise SpecError(f"source.key and source.time are the same field {p.source.key!r}")
    _positive("watermark.max_delay_ms", p.watermark.max_delay_ms, zero_ok=True)
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
    for a in aggs:
        if a.field is not None and a.field in (p.source.key,):
            raise SpecError(f"aggregates.{a.name}: {a.expr} reads the key field")
    outputs = [("sink", p.sink), ("late", p.late), ("errors", p.errors)]
    seen: dict[Path, str] = {}
    for section, out in outputs:
        if out is None:
            continue
        allowed = (("jsonl", "parquet", "stdout", "sqlite", "postgresql") if section == "sink"
                   else ("jsonl", "stdout"))
        if out.kind not in allowed:
            raise SpecError(f"{section}.kind: {out.kind!r} is not one of {', '.join(allowed)}")
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


# --------------------------------------------------------------------------- TOML

_SECTIONS: dict[str, set[str]] = {
    "pipeline": {"name", "batch_size", "max_bad_ratio"},
    "source": {"kind", "paths", "path", "key", "time"},
    "watermark": {"max_delay_ms"},
    "window": {"kind", "size_ms", "slide_ms", "gap_ms", "allowed_lateness_ms"},
    "aggregates": set(),
    "sink": {"kind", "path", "url", "table"},
    "late": {"kind", "path", "url", "table"},
    "errors": {"kind", "path", "url", "table"},
    "checkpoint": {"path", "url", "every_events", "every_ms", "keep", "incremental",
                   "full_every", "asynchronous", "max_age_s"},
}
_REQUIRED = ("pipeline", "source", "window", "aggregates", "sink")


def load_spec(path: str | Path) -> Pipeline:
    """Load and validate a TOML spec; relative paths are relative to the spec file.

    Raises SpecError with the file name (and line, for TOML syntax errors).
    """
    spec_path = Path(path)
    try:
        raw = spec_path.read_bytes()
    except FileNotFoundError:
        raise SpecError(f"{spec_path}: spec file not found") from None
    except OSError as exc:
        raise SpecError(f"{spec_path}: cannot read spec file ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise SpecError(f"{spec_path}: line {line}, column {col}: not UTF-8 "
                        f"(byte 0x{raw[exc.start]:02x})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{spec_path}: invalid TOML: {exc}") from None
    try:
        return pipeline_from_dict(data, base_dir=spec_path.resolve().parent)
    except SpecError as exc:
        raise SpecError(f"{spec_path}: {exc}") from None


def _get(section: dict[str, Any], sec: str, key: str, typ: type, default: Any = None) -> Any:
    if key not in section:
        if default is _MISSING:
            raise SpecError(f"{sec}.{key}: required setting is missing")
        return default
    val = section[key]
    if typ is int and (isinstance(val, bool) or not isinstance(val, int)):
        raise SpecError(f"{sec}.{key}: expected an integer, got {val!r}")
    if typ is str and not isinstance(val, str):
        raise SpecError(f"{sec}.{key}: expected a string, got {val!r}")
    if typ is bool and not isinstance(val, bool):
        raise SpecError(f"{sec}.{key}: expected true or false, got {val!r}")
    return val


_MISSING = object()


def pipeline_from_dict(data: dict[str, Any], base_dir: Path = Path(".")) -> Pipeline:
    """Build a :class:`Pipeline` from a parsed spec; raise SpecError on the first problem."""
    for sec in data:
        if sec not in _SECTIONS:
            raise SpecError(f"unknown section [{sec}]; expected one of {', '.join(_SECTIONS)}")
        if not isinstance(data[sec], dict):
            raise SpecError(f"{sec}: expected a [{sec}] table, got {data[sec]!r}")
        allowed = _SECTIONS[sec]
        if allowed:
            for key in data[sec]:
                if key not in allowed:
                    raise SpecError(
                        f"{sec}.{key}: unknown setting; [{sec}] takes {', '.join(sorted(allowed))}"
                    )
    for sec in _REQUIRED:
        if sec not in data:
            raise SpecError(f"[{sec}] section is missing")
    pl_sec, src, win = data["pipeline"], data["source"], data["window"]
    name = _get(pl_sec, "pipeline", "name", str, _MISSING)
    batch_size = _get(pl_sec, "pipeline", "batch_size", int, DEFAULT_BATCH_SIZE)
    max_bad_ratio = (check_bad_ratio("pipeline.max_bad_ratio", pl_sec["max_bad_ratio"])
                     if "max_bad_ratio" in pl_sec else None)

    kind = _get(src, "source", "kind", str, _MISSING)
    if "paths" in src and "path" in src:
        raise SpecError("source: give either paths or path, not both")
    raw_paths = src.get("paths", src.get("path"))
    if raw_paths is None:
        raise SpecError("source.paths: required setting is missing")
    if isinstance(raw_paths, str):
        raw_paths = [raw_paths]
    if not isinstance(raw_paths, list) or not all(isinstance(x, str) for x in raw_paths):
        raise SpecError(f"source.paths: expected a list of file paths, got {raw_paths!r}")
    source = FileSource(
        kind=kind,
        paths=tuple(raw_paths),
        key=_get(src, "source", "key", str, _MISSING),
        time=_get(src, "source", "time", str, _MISSING),
        base_dir=base_dir,
    )
    wm = Watermark(_get(data.get("watermark", {}), "watermark", "max_delay_ms", int, 0))

    wkind = _get(win, "window", "kind", str, _MISSING)
    lateness = _get(win, "window", "allowed_lateness_ms", int, 0)
    window: Window
    expected = {
        "tumbling": {"size_ms"},
        "sliding": {"size_ms", "slide_ms"},
        "session": {"gap_ms"},
    }
    if wkind not in expected:
        raise SpecError(f"window.kind: {wkind!r} is not one of tumbling, sliding, session")
    for key in ("size_ms", "slide_ms", "gap_ms"):
        if key in win and key not in expected[wkind]:
            raise SpecError(f"window.{key}: not a setting of a {wkind} window")
    if wkind == "tumbling":
        window = Tumbling(_get(win, "window", "size_ms", int, _MISSING), lateness)
    elif wkind == "sliding":
        window = Sliding(
            _get(win, "window", "size_ms", int, _MISSING),
            _get(win, "window", "slide_ms", int, _MISSING),
            lateness,
        )
    else:
        window = Session(_get(win, "window", "gap_ms", int, _MISSING), lateness)

    aggs = data["aggregates"]

    def output(sec: str) -> Output | None:
        if sec not in data:
            return None
        okind = _get(data[sec], sec, "kind", str, _MISSING)
        opath = _get(data[sec], sec, "path", str, None)
        return Output(kind=okind, path=opath, base_dir=base_dir,
                      url=_get(data[sec], sec, "url", str, None),
                      table=_get(data[sec], sec, "table", str, None))

    ckpt = None
    if "checkpoint" in data:
        c = data["checkpoint"]
        url = _get(c, "checkpoint", "url", str, None)
        ckpt = Checkpoints(
            path=_get(c, "checkpoint", "path", str, _MISSING if url is None else ""),
            url=url,
            every_events=_get(c, "checkpoint", "every_events", int, None),
            every_ms=_get(c, "checkpoint", "every_ms", int, None),
            keep=_get(c, "checkpoint", "keep", int, 3),
            incremental=_get(c, "checkpoint", "incremental", bool, False),
            full_every=_get(c, "checkpoint", "full_every", int, 10),
            asynchronous=_get(c, "checkpoint", "asynchronous", bool, True),
            max_age_s=(check_max_age("checkpoint.max_age_s", c["max_age_s"])
                       if "max_age_s" in c else None),
            base_dir=base_dir,
        )
    sink = output("sink")
    assert sink is not None
    return Pipeline(
        name=name,
        source=source,
        window=window,
        aggregates=dict(aggs),
        sink=sink,
        watermark=wm,
        late=output("late"),
        errors=output("errors"),
        checkpoint=ckpt,
        batch_size=batch_size,
        max_bad_ratio=max_bad_ratio,
    )


def with_batch_size(p: Pipeline, batch_size: int) -> Pipeline:
    """A copy of ``p`` reading ``batch_size`` records per partition per step."""
    return replace(p, batch_size=batch_size)


def with_max_age(p: Pipeline, max_age_s: float) -> Pipeline:
    """A copy of ``p`` whose checkpoints older than ``max_age_s`` seconds are STALE."""
    if p.checkpoint is None:
        raise SpecError("--max-age: the spec has no [checkpoint] section")
    return replace(p, checkpoint=replace(p.checkpoint, max_age_s=max_age_s))


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value


ABSENT = "(absent)"


def definition_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[
    tuple[str, Any, Any]
]:
    """``(setting, old value, new value)`` for every setting of
    :meth:`Pipeline.fingerprint_fields` that differs, in a stable order.

    A setting present on one side only has :data:`ABSENT` on the other.
    """
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    _flatten("", old, a)
    _flatten("", new, b)
    out = []
    for k in list(a) + [k for k in b if k not in a]:
        va, vb = a.get(k, ABSENT), b.get(k, ABSENT)
        if va != vb:
            out.append((k, va, vb))
    return out


def definition_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Readable lines ``window.size_ms: 60000 -> 30000``, one per changed setting."""

    def fmt(v: Any) -> str:
        return v if v is ABSENT else json.dumps(v)

    return [f"{k}: {fmt(va)} -> {fmt(vb)}" for k, va, vb in definition_changes(old, new)]
