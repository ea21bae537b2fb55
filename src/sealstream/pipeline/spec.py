"""The TOML spec loader: ``sealstream run SPEC.toml`` reads a spec into a
:class:`~sealstream.pipeline.Pipeline`; relative paths are relative to the spec file."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from sealstream.archive import ArchiveSettings
from sealstream.errors import SpecError
from sealstream.pipeline.join import Join
from sealstream.pipeline.kafka import KAFKA_SETTINGS, KafkaSourceSpec, kafka_source_from_dict
from sealstream.pipeline.model import (
    DEFAULT_BATCH_SIZE,
    Checkpoints,
    Output,
    Pipeline,
    Session,
    Sliding,
    Tumbling,
    Watermark,
    Window,
)
from sealstream.pipeline.nats import NATS_SETTINGS, NatsSourceSpec, nats_source_from_dict
from sealstream.pipeline.source import FileSource, Sources, SourceTransform
from sealstream.pipeline.validate import check_bad_ratio, check_max_age

_SECTIONS: dict[str, set[str]] = {
    "pipeline": {"name", "batch_size", "max_bad_ratio", "workers"},
    "source": {"kind", "paths", "path", "key", "time", "follow", "stop", "fail_after_ms",
               "poll_ms", "types", *KAFKA_SETTINGS, *NATS_SETTINGS},
    "watermark": {"max_delay_ms", "idle_ms"},
    "window": {"kind", "size_ms", "slide_ms", "gap_ms", "allowed_lateness_ms"},
    "transform": {"where", "fields"},
    "aggregates": set(),
    "sink": {"kind", "path", "url", "table", "bootstrap", "topic", "settings",
             "endpoint_url"},
    "late": {"kind", "path", "url", "table", "bootstrap", "topic", "settings",
             "endpoint_url"},
    "errors": {"kind", "path", "url", "table", "bootstrap", "topic", "settings",
               "endpoint_url"},
    "sources": set(),
    "join": {"type", "left", "fields"},
    "enrich": set(),  # [[enrich]]: an array of tables, checked by sealstream.enrich
    "checkpoint": {"path", "url", "every_events", "every_ms", "keep", "incremental",
                   "full_every", "asynchronous", "max_age_s", "require_receipts",
                   "endpoint_url"},
    "archive": {"url", "endpoint_url"},
}
_REQUIRED = ("pipeline", "source", "window", "aggregates", "sink")


def _settings(table: dict[str, Any], sec: str) -> tuple[tuple[str, str], ...]:
    """A kafka output's client settings: a table of names to strings, numbers or booleans."""
    raw = table.get("settings", {})
    if not isinstance(raw, dict):
        raise SpecError(f"{sec}.settings: expected a table of client settings, "
                        f'e.g. {{"linger.ms" = 5}}')
    out = []
    for k, v in raw.items():
        if isinstance(v, bool):
            v = "true" if v else "false"
        elif isinstance(v, int | float | str):
            v = str(v)
        else:
            raise SpecError(f"{sec}.settings.{k}: expected a string, number or boolean")
        out.append((str(k), v))
    return tuple(out)


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
        if sec == "enrich":
            continue
        if not isinstance(data[sec], dict):
            raise SpecError(f"{sec}: expected a [{sec}] table, got {data[sec]!r}")
        allowed = _SECTIONS[sec]
        if allowed:
            for key in data[sec]:
                if key not in allowed:
                    raise SpecError(
                        f"{sec}.{key}: unknown setting; [{sec}] takes {', '.join(sorted(allowed))}"
                    )
    several = _several_sources(data, base_dir)
    for sec in _REQUIRED:
        if sec not in data and not (sec == "source" and several is not None):
            raise SpecError(f"[{sec}] section is missing")
    pl_sec, src, win = data["pipeline"], data.get("source", {}), data["window"]
    name = _get(pl_sec, "pipeline", "name", str, _MISSING)
    batch_size = _get(pl_sec, "pipeline", "batch_size", int, DEFAULT_BATCH_SIZE)
    workers = _get(pl_sec, "pipeline", "workers", int, None)
    max_bad_ratio = (check_bad_ratio("pipeline.max_bad_ratio", pl_sec["max_bad_ratio"])
                     if "max_bad_ratio" in pl_sec else None)

    source: FileSource | KafkaSourceSpec | NatsSourceSpec | Sources
    if several is not None:
        source = several
    else:
        kind = _get(src, "source", "kind", str, _MISSING)
        source = (kafka_source_from_dict(src) if kind == "kafka"
                  else nats_source_from_dict(src) if kind == "nats"
                  else _file_source(src, kind, base_dir))
    wsec = data.get("watermark", {})
    wm = Watermark(_get(wsec, "watermark", "max_delay_ms", int, 0),
                   idle_ms=_get(wsec, "watermark", "idle_ms", int, None))

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
    if several is not None:  # clicks.n = "count" is the TOML table clicks = {n = "count"}
        flat: dict[str, Any] = {}
        for top, value in aggs.items():
            pairs = value.items() if isinstance(value, dict) else [(None, value)]
            for sub, expr in pairs:
                flat[top if sub is None else f"{top}.{sub}"] = expr
        aggs = flat

    def output(sec: str) -> Output | None:
        if sec not in data:
            return None
        okind = _get(data[sec], sec, "kind", str, _MISSING)
        opath = _get(data[sec], sec, "path", str, None)
        return Output(kind=okind, path=opath, base_dir=base_dir,
                      url=_get(data[sec], sec, "url", str, None),
                      table=_get(data[sec], sec, "table", str, None),
                      bootstrap=_get(data[sec], sec, "bootstrap", str, None),
                      topic=_get(data[sec], sec, "topic", str, None),
                      settings=_settings(data[sec], sec),
                      endpoint_url=_get(data[sec], sec, "endpoint_url", str, None))

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
            require_receipts=_get(c, "checkpoint", "require_receipts", bool, False),
            endpoint_url=_get(c, "checkpoint", "endpoint_url", str, None),
            base_dir=base_dir,
        )
    sink = output("sink")
    assert sink is not None
    where, fields = _transform(data.get("transform", {}))
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
        workers=workers,
        where=where,
        fields=fields,
        types=dict(src.get("types", {})) if isinstance(src.get("types", {}), dict)
        else src["types"],
        join=_join_section(data["join"]) if "join" in data else None,
        enrich=_enrich(data.get("enrich"), base_dir),
        archive=_archive(data["archive"], source, base_dir) if "archive" in data else None,
    )


def _several_sources(data: dict[str, Any], base_dir: Path) -> Sources | None:
    """``[sources.NAME]`` tables -> :class:`Sources` (None without any)."""
    if "sources" not in data:
        return None
    if "source" in data:
        raise SpecError("[source] and [sources.NAME]: give one source, or several, not both")
    members: dict[str, FileSource | KafkaSourceSpec | NatsSourceSpec] = {}
    transforms: dict[str, SourceTransform] = {}
    for name, table in data["sources"].items():
        sec = f"sources.{name}"
        if not isinstance(table, dict):
            raise SpecError(f"{sec}: expected a [{sec}] table, got {table!r}")
        kind = _get(table, sec, "kind", str, _MISSING)
        keys = (_KAFKA_KEYS if kind == "kafka" else _NATS_KEYS if kind == "nats"
                else _SOURCE_KEYS)
        for key in table:
            if key in ("where", "fields"):
                raise SpecError(f"{sec}.{key}: a source's filter and derived fields go in "
                                f"its [{sec}.transform] table, as [transform] for one source")
            if key == "types":
                raise SpecError(f"{sec}.types: declared types are not supported yet in a "
                                "several-source job")
            if key not in keys:
                raise SpecError(f"{sec}.{key}: unknown setting; [{sec}] takes "
                                f"{', '.join(sorted(keys))}")
        own = {k: v for k, v in table.items() if k != "transform"}
        try:
            members[name] = (kafka_source_from_dict(own) if kind == "kafka"
                             else nats_source_from_dict(own) if kind == "nats"
                             else _file_source(own, kind, base_dir))
        except SpecError as exc:
            raise SpecError(f"{sec}.{str(exc).removeprefix('source.')}") from None
        if "transform" in table:
            transforms[name] = _source_transform(table["transform"], sec)
    return Sources(members, transforms=transforms)


_SOURCE_KEYS = {"kind", "paths", "path", "key", "time", "transform", "follow", "stop",
                "poll_ms"}
_KAFKA_KEYS = set(KAFKA_SETTINGS) | {"kind", "key", "time", "transform"}
_NATS_KEYS = set(NATS_SETTINGS) | {"kind", "key", "time", "transform"}


def _source_transform(raw: object, sec: str) -> SourceTransform:
    """``[sources.NAME.transform]``: ``where`` and ``fields.NAME``, as ``[transform]``."""
    if not isinstance(raw, dict):
        raise SpecError(f"{sec}.transform: expected a [{sec}.transform] table, got {raw!r}")
    for key in raw:
        if key not in _SECTIONS["transform"]:
            raise SpecError(f"{sec}.transform.{key}: unknown setting; [{sec}.transform] takes "
                            f"{', '.join(sorted(_SECTIONS['transform']))}")
    try:
        where, fields = _transform(raw)
    except SpecError as exc:
        raise SpecError(f"{sec}.{exc}") from None
    return SourceTransform(where=where, fields=fields)


def _join_section(sec: dict[str, Any]) -> Join:
    """``[join]``: ``type = "inner" | "left"``, ``left = "SOURCE"``, ``[join.fields]``."""
    fields = sec.get("fields", {})
    if not isinstance(fields, dict):
        raise SpecError(f"join.fields: expected a table of name = expression, e.g. "
                        f'ctr = "clicks.n / views.n", got {fields!r}')
    return Join(type=_get(sec, "join", "type", str, "inner"),
                left=_get(sec, "join", "left", str, None), fields=dict(fields))


def _enrich(raw: object, base_dir: Path) -> tuple[Any, ...]:
    """``[[enrich]]`` tables (docs/enrich.md), or none."""
    if raw is None:
        return ()
    from sealstream.enrich import enrich_from_dict

    return enrich_from_dict(raw, base_dir)


def _archive(sec: dict[str, Any], source: Any, base_dir: Path) -> ArchiveSettings:
    """``[archive]``: the raw-event archive of a live source: a broker, or followed files
    (docs/object-storage.md)."""
    url = _get(sec, "archive", "url", str, _MISSING)
    if not url.strip():
        raise SpecError("archive.url: expected s3://BUCKET/PREFIX or a directory path")
    if source.kind == "sources":
        raise SpecError("[archive]: the raw-event archive is not supported yet in a "
                        "several-source job; it is for a job with one kafka or nats "
                        "[source] (remove the section)")
    followed = source.kind in ("jsonl", "csv") and bool(getattr(source, "follow", False))
    if source.kind not in ("kafka", "nats") and not followed:
        raise SpecError(f"[archive]: the raw-event archive is supported for kind = \"kafka\" "
                        "and \"nats\" sources and for followed jsonl/csv files (follow = "
                        f"true), not yet for a bounded {source.kind!r} source (it is re-read "
                        "from its files); remove the section")
    return ArchiveSettings(url=url, endpoint_url=_get(sec, "archive", "endpoint_url", str, None),
                           base_dir=base_dir)


def _file_source(src: dict[str, Any], kind: Any, base_dir: Path) -> FileSource:
    """``[source]`` of a file kind -> :class:`FileSource`."""
    for name in sorted(KAFKA_SETTINGS - {"stop", "fail_after_ms", "poll_ms"}):
        if name in src:
            raise SpecError(f"source.{name}: a setting of kind = \"kafka\", not of {kind!r}")
    for name in sorted(NATS_SETTINGS - KAFKA_SETTINGS):
        if name in src:
            raise SpecError(f"source.{name}: a setting of kind = \"nats\", not of {kind!r}")
    if "paths" in src and "path" in src:
        raise SpecError("source: give either paths or path, not both")
    raw_paths = src.get("paths", src.get("path"))
    if raw_paths is None:
        raise SpecError("source.paths: required setting is missing")
    if isinstance(raw_paths, str):
        raw_paths = [raw_paths]
    if not isinstance(raw_paths, list) or not all(isinstance(x, str) for x in raw_paths):
        raise SpecError(f"source.paths: expected a list of file paths, got {raw_paths!r}")
    return FileSource(
        kind=kind,
        paths=tuple(raw_paths),
        key=_key(src),
        time=_get(src, "source", "time", str, _MISSING),
        base_dir=base_dir,
        follow=_get(src, "source", "follow", bool, False),
        stop=_get(src, "source", "stop", str, None),
        fail_after_ms=_get(src, "source", "fail_after_ms", int, None),
        poll_ms=_get(src, "source", "poll_ms", int, 200),
    )


def _key(src: dict[str, Any]) -> str | tuple[str, ...]:
    """``key = "user"`` (results say ``key``) or ``key = ["tenant", "user"]`` (each
    field under its own name)."""
    if "key" not in src:
        raise SpecError("source.key: required setting is missing")
    key = src["key"]
    if isinstance(key, list):
        if not key or not all(isinstance(k, str) for k in key):
            raise SpecError(f"source.key: expected a field name or a list of field names, "
                            f"got {key!r}")
        return tuple(key)
    return _get(src, "source", "key", str, _MISSING)  # type: ignore[no-any-return]


def _transform(sec: dict[str, Any]) -> tuple[str | None, dict[str, str]]:
    """``[transform]``: ``where = "..."`` and ``fields.NAME = "..."`` (SQL expressions)."""
    where = _get(sec, "transform", "where", str, None)
    fields = sec.get("fields", {})
    if not isinstance(fields, dict):
        raise SpecError(f"transform.fields: expected a table of name = expression, e.g. "
                        f"fields.bytes_kb = \"bytes / 1024\", got {fields!r}")
    for name, text in fields.items():
        if not isinstance(text, str):
            raise SpecError(f"transform.fields.{name}: expected an expression (a string), "
                            f"got {text!r}")
    return where, dict(fields)


def with_workers(p: Pipeline, workers: int | None) -> Pipeline:
    """A copy of ``p`` run by ``workers`` Ray workers (None: one process)."""
    return replace(p, workers=workers)


def with_batch_size(p: Pipeline, batch_size: int) -> Pipeline:
    """A copy of ``p`` reading ``batch_size`` records per partition per step."""
    return replace(p, batch_size=batch_size)


def with_max_age(p: Pipeline, max_age_s: float) -> Pipeline:
    """A copy of ``p`` whose checkpoints older than ``max_age_s`` seconds are STALE."""
    if p.checkpoint is None:
        raise SpecError("--max-age: the spec has no [checkpoint] section")
    return replace(p, checkpoint=replace(p.checkpoint, max_age_s=max_age_s))


def with_require_receipts(p: Pipeline) -> Pipeline:
    """A copy of ``p`` that resumes only from checkpoints with signed receipt roots."""
    if p.checkpoint is None:
        raise SpecError("--require-receipts: the spec has no [checkpoint] section")
    return replace(p, checkpoint=replace(p.checkpoint, require_receipts=True))

