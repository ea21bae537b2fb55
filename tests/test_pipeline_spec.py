"""The TOML spec loader (semantics section 9): good specs load into the right
objects; each bad one raises one ``SpecError`` naming the setting and its value.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sealstream.errors import SpecError
from sealstream.pipeline import (
    Checkpoints,
    FileSource,
    Output,
    Pipeline,
    Session,
    Sliding,
    Tumbling,
    Watermark,
    load_spec,
    pipeline_from_dict,
    with_batch_size,
)

Spec = dict[str, Any]


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(v)


def toml_text(spec: Spec) -> str:
    """Render ``{section: {setting: value}}``; a non-dict section is a top-level value."""
    lines = [f"{json.dumps(sec)} = {toml_value(body)}" for sec, body in spec.items()
             if not isinstance(body, dict)]
    for sec, body in spec.items():
        if isinstance(body, dict):
            lines.append(f"\n[{sec}]")
            lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


def base_spec() -> Spec:
    return {
        "pipeline": {"name": "payments"},
        "source": {"kind": "jsonl", "paths": ["in/p0.jsonl", "in/p1.jsonl"],
                   "key": "user", "time": "ts"},
        "watermark": {"max_delay_ms": 1000},
        "window": {"kind": "tumbling", "size_ms": 60000, "allowed_lateness_ms": 0},
        "aggregates": {"n": "count", "total": "sum(amount)", "avg": "mean(amount)"},
        "sink": {"kind": "jsonl", "path": "out"},
        "late": {"kind": "jsonl", "path": "late"},
        "errors": {"kind": "jsonl", "path": "errors"},
        "checkpoint": {"path": "ckpt", "every_events": 100000},
    }


def write_inputs(directory: Path, names: tuple[str, ...] = ("in/p0.jsonl", "in/p1.jsonl")) -> None:
    for name in names:
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"user": "a", "ts": 1, "amount": 2}\n', encoding="utf-8")


def write_spec(directory: Path, spec: Spec, name: str = "spec.toml") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(toml_text(spec), encoding="utf-8")
    return path


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    d = tmp_path / "job"
    write_inputs(d)
    return d


def load(directory: Path, spec: Spec) -> Pipeline:
    return load_spec(write_spec(directory, spec))


# ====================================================================== good specs


def test_full_spec_from_the_contract(job_dir: Path) -> None:
    p = load(job_dir, base_spec())
    assert p.name == "payments"
    assert p.source == FileSource(kind="jsonl", paths=("in/p0.jsonl", "in/p1.jsonl"),
                                  key="user", time="ts", base_dir=job_dir.resolve())
    assert p.watermark == Watermark(1000)
    assert p.window == Tumbling(size_ms=60000, allowed_lateness_ms=0)
    assert dict(p.aggregates) == {"n": "count", "total": "sum(amount)", "avg": "mean(amount)"}
    assert [(a.name, a.func, a.field) for a in p.parsed_aggregates] == [
        ("n", "count", None), ("total", "sum", "amount"), ("avg", "mean", "amount")]
    assert p.sink.kind == "jsonl" and p.sink.resolved == job_dir.resolve() / "out"
    assert p.late is not None and p.late.resolved == job_dir.resolve() / "late"
    assert p.errors is not None and p.errors.resolved == job_dir.resolve() / "errors"
    assert p.checkpoint is not None and p.checkpoint.every_events == 100000
    assert p.checkpoint.resolved == job_dir.resolve() / "ckpt"


def test_minimal_spec_defaults(job_dir: Path) -> None:
    spec = base_spec()
    for optional in ("watermark", "late", "errors", "checkpoint"):
        del spec[optional]
    del spec["window"]["allowed_lateness_ms"]
    p = load(job_dir, spec)
    assert p.watermark == Watermark(0)
    assert p.window == Tumbling(60000, 0)
    assert p.late is None and p.errors is None and p.checkpoint is None
    assert p.batch_size == 262_144


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        ({"kind": "tumbling", "size_ms": 5000}, Tumbling(5000, 0)),
        ({"kind": "tumbling", "size_ms": 5000, "allowed_lateness_ms": 250}, Tumbling(5000, 250)),
        ({"kind": "sliding", "size_ms": 10000, "slide_ms": 2500}, Sliding(10000, 2500, 0)),
        ({"kind": "sliding", "size_ms": 10000, "slide_ms": 10000, "allowed_lateness_ms": 7},
         Sliding(10000, 10000, 7)),
        ({"kind": "session", "gap_ms": 30000}, Session(30000, 0)),
        ({"kind": "session", "gap_ms": 1, "allowed_lateness_ms": 100}, Session(1, 100)),
    ],
    ids=["tumbling", "tumbling-lateness", "sliding", "sliding-slide-eq-size", "session",
         "session-lateness"],
)
def test_each_window_kind(job_dir: Path, window: dict[str, Any], expected: Any) -> None:
    spec = base_spec()
    spec["window"] = window
    p = load(job_dir, spec)
    assert p.window == expected
    assert p.window.kind == window["kind"]


@pytest.mark.parametrize("func", ["sum", "min", "max", "mean", "first", "last"])
def test_each_aggregate_function(job_dir: Path, func: str) -> None:
    spec = base_spec()
    spec["aggregates"] = {"x": f"{func}(amount)", "spaced": f" {func} ( amount ) "}
    p = load(job_dir, spec)
    assert [(a.func, a.field) for a in p.parsed_aggregates] == [(func, "amount")] * 2


def test_globs_expand_sorted(tmp_path: Path) -> None:
    d = tmp_path / "job"
    write_inputs(d, ("in/p2.jsonl", "in/p10.jsonl", "in/p0.jsonl", "in/other.csv", "x.jsonl"))
    spec = base_spec()
    spec["source"]["paths"] = ["in/p*.jsonl", "x.jsonl"]
    p = load(d, spec)
    parts = p.source.partitions()
    assert [n for n, _ in parts] == ["in/p0.jsonl", "in/p10.jsonl", "in/p2.jsonl", "x.jsonl"]
    assert [path.resolve() for _, path in parts] == [
        (d / n).resolve() for n in ("in/p0.jsonl", "in/p10.jsonl", "in/p2.jsonl", "x.jsonl")]


def test_relative_paths_are_resolved_against_the_spec_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = tmp_path / "deep" / "job"
    write_inputs(job)
    spec_path = write_spec(job, base_spec())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for given in (spec_path, Path("..") / "deep" / "job" / "spec.toml"):
        p = load_spec(given)
        assert [path.resolve() for _, path in p.source.partitions()] == [
            (job / "in/p0.jsonl").resolve(), (job / "in/p1.jsonl").resolve()]
        assert [n for n, _ in p.source.partitions()] == ["in/p0.jsonl", "in/p1.jsonl"]
        assert p.sink.resolved.resolve() == (job / "out").resolve()
        assert p.late is not None and p.late.resolved.resolve() == (job / "late").resolve()
        assert p.checkpoint is not None
        assert p.checkpoint.resolved.resolve() == (job / "ckpt").resolve()


def test_absolute_paths_are_kept(tmp_path: Path, job_dir: Path) -> None:
    absolute = tmp_path / "abs.jsonl"
    absolute.write_text('{"user": "a", "ts": 1}\n', encoding="utf-8")
    spec = base_spec()
    spec["source"]["paths"] = [str(absolute)]
    spec["sink"]["path"] = str(tmp_path / "abs-out")
    p = load(job_dir, spec)
    assert p.source.partitions() == [(str(absolute), absolute)]
    assert p.sink.resolved == tmp_path / "abs-out"


def test_path_alias_for_a_single_file(job_dir: Path) -> None:
    spec = base_spec()
    del spec["source"]["paths"]
    spec["source"]["path"] = "in/p1.jsonl"
    p = load(job_dir, spec)
    assert p.source.paths == ("in/p1.jsonl",)
    assert [n for n, _ in p.source.partitions()] == ["in/p1.jsonl"]


def test_paths_may_be_a_single_string(job_dir: Path) -> None:
    spec = base_spec()
    spec["source"]["paths"] = "in/p0.jsonl"
    assert load(job_dir, spec).source.paths == ("in/p0.jsonl",)


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet"])
def test_each_source_kind(job_dir: Path, kind: str) -> None:
    spec = base_spec()
    spec["source"]["kind"] = kind
    assert load(job_dir, spec).source.kind == kind


def test_stdout_outputs_need_no_path(job_dir: Path) -> None:
    spec = base_spec()
    spec["sink"] = {"kind": "stdout"}
    spec["late"] = {"kind": "stdout"}
    del spec["errors"]
    p = load(job_dir, spec)
    assert p.sink == Output(kind="stdout", path=None, base_dir=job_dir.resolve())


def test_parquet_sink_and_checkpoint_settings(job_dir: Path) -> None:
    spec = base_spec()
    spec["sink"] = {"kind": "parquet", "path": "out"}
    spec["checkpoint"] = {"path": "ckpt", "every_ms": 5000, "keep": 5}
    spec["pipeline"]["batch_size"] = 128
    p = load(job_dir, spec)
    assert p.sink.kind == "parquet"
    assert p.checkpoint == Checkpoints(path="ckpt", every_events=None, every_ms=5000, keep=5,
                                       base_dir=job_dir.resolve())
    assert p.batch_size == 128
    assert with_batch_size(p, 7).batch_size == 7


def test_spec_loading_does_not_need_the_inputs(tmp_path: Path) -> None:
    """Missing inputs are found when partitions are listed, with the file named."""
    p = load(tmp_path, base_spec())
    with pytest.raises(SpecError) as exc:
        p.source.partitions()
    msg = str(exc.value)
    assert "source.paths" in msg and "in/p0.jsonl" in msg and "\n" not in msg


def test_glob_matching_nothing(job_dir: Path) -> None:
    spec = base_spec()
    spec["source"]["paths"] = ["in/*.parquet"]
    p = load(job_dir, spec)
    with pytest.raises(SpecError, match=r"source\.paths: 'in/\*\.parquet' matches no file"):
        p.source.partitions()


def test_partition_listed_twice(job_dir: Path) -> None:
    spec = base_spec()
    spec["source"]["paths"] = ["in/p0.jsonl", "in/*.jsonl"]
    p = load(job_dir, spec)
    with pytest.raises(SpecError, match=r"source\.paths: partition 'in/p0\.jsonl' is listed twice"):
        p.source.partitions()


# ====================================================================== bad specs

Mutation = Callable[[Spec], None]


def setv(section: str, key: str, value: Any) -> Mutation:
    def change(spec: Spec) -> None:
        spec.setdefault(section, {})[key] = value
    return change


def delv(section: str, key: str | None = None) -> Mutation:
    def change(spec: Spec) -> None:
        if key is None:
            del spec[section]
        else:
            del spec[section][key]
    return change


def both(*changes: Mutation) -> Mutation:
    def change(spec: Spec) -> None:
        for c in changes:
            c(spec)
    return change


SLIDING = setv("window", "kind", "sliding")
SESSION = both(setv("window", "kind", "session"), delv("window", "size_ms"))

# (mutation, substrings the one-line message must contain)
BAD: dict[str, tuple[Mutation, list[str]]] = {
    # [pipeline]
    "pipeline.name missing": (delv("pipeline", "name"), ["pipeline.name", "missing"]),
    "pipeline.name empty": (setv("pipeline", "name", "  "), ["pipeline.name", "'  '"]),
    "pipeline.name not a string": (setv("pipeline", "name", 5), ["pipeline.name", "5"]),
    "pipeline.batch_size zero": (setv("pipeline", "batch_size", 0), ["pipeline.batch_size", "0"]),
    "pipeline.batch_size float": (setv("pipeline", "batch_size", 1.5),
                                  ["pipeline.batch_size", "1.5"]),
    "pipeline typo": (setv("pipeline", "nmae", "x"), ["pipeline.nmae", "unknown setting"]),
    # [source]
    "source.kind unknown": (setv("source", "kind", "xml"), ["source.kind", "'xml'"]),
    "source.kind missing": (delv("source", "kind"), ["source.kind", "missing"]),
    "source.paths empty": (setv("source", "paths", []), ["source.paths"]),
    "source.paths not strings": (setv("source", "paths", [1, 2]), ["source.paths", "[1, 2]"]),
    "source.paths missing": (delv("source", "paths"), ["source.paths", "missing"]),
    "source path and paths": (setv("source", "path", "in/p0.jsonl"), ["source", "path"]),
    "source.key missing": (delv("source", "key"), ["source.key", "missing"]),
    "source.key empty": (setv("source", "key", ""), ["source.key", "''"]),
    "source.time not a string": (setv("source", "time", 3), ["source.time", "3"]),
    "source.key equals source.time": (setv("source", "time", "user"),
                                      ["source.key", "source.time", "'user'"]),
    "source typo": (setv("source", "keys", "user"), ["source.keys", "unknown setting"]),
    # [watermark]
    "watermark.max_delay_ms negative": (setv("watermark", "max_delay_ms", -1),
                                        ["watermark.max_delay_ms", "-1"]),
    "watermark.max_delay_ms string": (setv("watermark", "max_delay_ms", "1s"),
                                      ["watermark.max_delay_ms", "'1s'"]),
    "watermark typo": (setv("watermark", "max_delay", 5), ["watermark.max_delay", "unknown"]),
    # [window]
    "window.kind unknown": (setv("window", "kind", "hopping"), ["window.kind", "'hopping'"]),
    "window.kind missing": (delv("window", "kind"), ["window.kind", "missing"]),
    "window.size_ms zero": (setv("window", "size_ms", 0), ["window.size_ms", "0"]),
    "window.size_ms negative": (setv("window", "size_ms", -60000), ["window.size_ms", "-60000"]),
    "window.size_ms string": (setv("window", "size_ms", "60s"), ["window.size_ms", "'60s'"]),
    "window.size_ms float": (setv("window", "size_ms", 1.5), ["window.size_ms", "1.5"]),
    "window.size_ms boolean": (setv("window", "size_ms", True), ["window.size_ms", "True"]),
    "window.size_ms missing": (delv("window", "size_ms"), ["window.size_ms", "missing"]),
    "window typo": (setv("window", "size", 10), ["window.size", "unknown setting"]),
    "tumbling with gap_ms": (setv("window", "gap_ms", 10), ["window.gap_ms", "tumbling"]),
    "tumbling with slide_ms": (setv("window", "slide_ms", 10), ["window.slide_ms", "tumbling"]),
    "sliding slide > size": (both(SLIDING, setv("window", "slide_ms", 60001)),
                             ["window.slide_ms", "60001", "60000"]),
    "sliding slide zero": (both(SLIDING, setv("window", "slide_ms", 0)),
                           ["window.slide_ms", "0"]),
    "sliding slide missing": (SLIDING, ["window.slide_ms", "missing"]),
    "session gap zero": (both(SESSION, setv("window", "gap_ms", 0)), ["window.gap_ms", "0"]),
    "session gap missing": (SESSION, ["window.gap_ms", "missing"]),
    "session with size_ms": (both(SESSION, setv("window", "gap_ms", 5),
                                  setv("window", "size_ms", 5)), ["window.size_ms", "session"]),
    "negative lateness": (setv("window", "allowed_lateness_ms", -1),
                          ["window.allowed_lateness_ms", "-1"]),
    # beyond 10**15 ms a duration could carry a window's end past the engine's +inf
    "window.size_ms beyond int64": (setv("window", "size_ms", 99999999999999999999),
                                    ["window.size_ms", "99999999999999999999", "at most"]),
    "huge lateness": (setv("window", "allowed_lateness_ms", 2**62),
                      ["window.allowed_lateness_ms", str(2**62), "at most"]),
    "huge max_delay_ms": (setv("watermark", "max_delay_ms", 2**63 - 1),
                          ["watermark.max_delay_ms", str(2**63 - 1), "at most"]),
    "session gap huge": (both(SESSION, setv("window", "gap_ms", 10**15 + 1)),
                         ["window.gap_ms", str(10**15 + 1), "at most"]),
    # [aggregates]
    "unknown aggregate function": (setv("aggregates", "total", "mode(amount)"),
                                   ["aggregates.total", "mode(amount)"]),
    "count with a field": (setv("aggregates", "n", "count(amount)"),
                           ["aggregates.n", "count(amount)"]),
    "sum without field": (setv("aggregates", "total", "sum"), ["aggregates.total", "'sum'"]),
    "sum with empty parens": (setv("aggregates", "total", "sum()"),
                              ["aggregates.total", "sum()"]),
    "aggregate not a string": (setv("aggregates", "total", 5), ["aggregates.total", "5"]),
    "aggregate over two fields": (setv("aggregates", "total", "sum(a,b)"),
                                  ["aggregates.total", "sum(a,b)", "one field"]),
    "aggregate over the key": (setv("aggregates", "total", "sum(user)"),
                               ["aggregates.total", "sum(user)"]),
    "aggregate named like the identity": (setv("aggregates", "window_start", "count"),
                                          ["aggregates.window_start"]),
    "aggregate name invalid": (setv("aggregates", "a b", "count"), ["aggregates", "'a b'"]),
    "no aggregates": (lambda s: s.__setitem__("aggregates", {}), ["aggregates"]),
    # outputs
    "sink.kind unknown": (setv("sink", "kind", "csv"), ["sink.kind", "'csv'"]),
    "sink.kind missing": (delv("sink", "kind"), ["sink.kind", "missing"]),
    "sink.path missing": (delv("sink", "path"), ["sink.path"]),
    "sink typo": (setv("sink", "dir", "x"), ["sink.dir", "unknown setting"]),
    "late.kind parquet": (setv("late", "kind", "parquet"), ["late.kind", "'parquet'"]),
    "late and sink share a directory": (setv("late", "path", "out"), ["late.path", "'out'"]),
    "errors and sink share a directory (spelled differently)": (
        setv("errors", "path", "./out/"), ["errors.path", "'./out/'"]),
    "errors and late share a directory": (setv("errors", "path", "late"),
                                          ["errors.path", "'late'"]),
    "checkpoint in the sink directory": (setv("checkpoint", "path", "out"),
                                         ["checkpoint.path", "'out'"]),
    "checkpoint directory inside the sink's": (setv("checkpoint", "path", "out/ckpt"),
                                               ["checkpoint.path", "inside", "sink.path"]),
    "sink inside the checkpoint directory": (setv("sink", "path", "ckpt/out"),
                                             ["sink.path", "inside", "checkpoint.path"]),
    "late output inside the sink's": (setv("late", "path", "out/late"),
                                      ["late.path", "inside", "sink.path"]),
    "sink is the input directory": (setv("sink", "path", "in"),
                                    ["source.paths[0]", "'in/p0.jsonl'", "sink"]),
    "sink holds the input directory": (setv("sink", "path", "."),
                                       ["late.path", "'late'", "inside the sink directory '.'"]),
    "glob of the sink directory": (setv("source", "paths", ["out/*.jsonl"]),
                                   ["source.paths[0]", "'out/*.jsonl'", "sink"]),
    "stdout with a path": (setv("late", "kind", "stdout"), ["late.path", "stdout"]),
    # [checkpoint]
    "checkpoint.path missing": (delv("checkpoint", "path"), ["checkpoint.path", "missing"]),
    "checkpoint.every_events zero": (setv("checkpoint", "every_events", 0),
                                     ["checkpoint.every_events", "0"]),
    "checkpoint.every_ms negative": (setv("checkpoint", "every_ms", -5),
                                     ["checkpoint.every_ms", "-5"]),
    "checkpoint.keep zero": (setv("checkpoint", "keep", 0), ["checkpoint.keep", "0"]),
    "checkpoint typo": (setv("checkpoint", "every", 10), ["checkpoint.every", "unknown"]),
    # sections
    "unknown section (typo)": (lambda s: s.__setitem__("windows", {"kind": "tumbling"}),
                               ["windows", "unknown section"]),
    **{f"missing [{sec}]": (delv(sec), [f"[{sec}]", "missing"])
       for sec in ("pipeline", "source", "window", "aggregates", "sink")},
    "section is not a table": (lambda s: s.__setitem__("sink", "out"), ["sink", "'out'"]),
}


def bad_spec(name: str) -> Spec:
    spec = base_spec()
    BAD[name][0](spec)
    return spec


@pytest.mark.parametrize("name", list(BAD))
def test_bad_spec_names_the_setting_and_value(job_dir: Path, name: str) -> None:
    _, needles = BAD[name]
    spec_path = write_spec(job_dir, bad_spec(name))
    with pytest.raises(SpecError) as exc:
        load_spec(spec_path)
    msg = str(exc.value)
    assert "\n" not in msg, msg
    assert "spec.toml" in msg, msg
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    assert exc.value.exit_code == 2


def test_bad_spec_table_renders_valid_toml(job_dir: Path) -> None:
    """Guard against false positives: the base spec itself loads."""
    assert load(job_dir, base_spec()).name == "payments"


def test_invalid_toml_names_the_file_and_line(job_dir: Path) -> None:
    path = job_dir / "broken.toml"
    path.write_text('[pipeline]\nname = "x"\nsize_ms = = 3\n[source]\n', encoding="utf-8")
    with pytest.raises(SpecError) as exc:
        load_spec(path)
    msg = str(exc.value)
    assert "broken.toml" in msg and "line 3" in msg, msg
    assert "\n" not in msg


def test_duplicate_key_in_toml_is_invalid(job_dir: Path) -> None:
    path = job_dir / "dup.toml"
    path.write_text(toml_text(base_spec()) + '\n[window]\nkind = "session"\n', encoding="utf-8")
    with pytest.raises(SpecError) as exc:
        load_spec(path)
    assert "dup.toml" in str(exc.value) and "line" in str(exc.value)


def test_missing_spec_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as exc:
        load_spec(tmp_path / "nope.toml")
    assert "nope.toml" in str(exc.value) and "not found" in str(exc.value)


def test_spec_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes('[pipeline]\nname = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(SpecError) as exc:
        load_spec(path)
    assert "latin1.toml" in str(exc.value) and "\n" not in str(exc.value)


def test_pipeline_constructor_validates_too() -> None:
    src = FileSource(kind="jsonl", paths=("a.jsonl",), key="k", time="t")
    with pytest.raises(SpecError, match=r"window\.slide_ms"):
        Pipeline(name="p", source=src, window=Sliding(10, 20), aggregates={"n": "count"},
                 sink=Output(kind="jsonl", path="out"))
    with pytest.raises(SpecError, match=r"aggregates\.n"):
        pipeline_from_dict({**base_spec(), "aggregates": {"n": "count(x)"}})


# ====================================================================== fingerprint


def fingerprint(directory: Path, spec: Spec, inputs: tuple[str, ...] = ()) -> str:
    if inputs:
        write_inputs(directory, inputs)
    return load(directory, spec).fingerprint()


CHANGES_FINGERPRINT: dict[str, Mutation] = {
    "window size": setv("window", "size_ms", 30000),
    "window kind": both(SESSION, setv("window", "gap_ms", 60000)),
    "sliding slide": both(SLIDING, setv("window", "slide_ms", 1000)),
    "allowed lateness": setv("window", "allowed_lateness_ms", 1),
    "aggregate function": setv("aggregates", "total", "max(amount)"),
    "aggregate field": setv("aggregates", "total", "sum(fee)"),
    "aggregate added": setv("aggregates", "m", "min(amount)"),
    "aggregate renamed": lambda s: s.__setitem__(
        "aggregates", {"count_": "count", "total": "sum(amount)", "avg": "mean(amount)"}),
    "aggregate removed": lambda s: s["aggregates"].pop("avg"),
    "key field": setv("source", "key", "account"),
    "time field": setv("source", "time", "event_time"),
    "partitions (one fewer)": setv("source", "paths", ["in/p0.jsonl"]),
    "partitions (order)": setv("source", "paths", ["in/p1.jsonl", "in/p0.jsonl"]),
    "source kind": setv("source", "kind", "csv"),
    "max delay": setv("watermark", "max_delay_ms", 999),
    "pipeline name": setv("pipeline", "name", "refunds"),
}

KEEPS_FINGERPRINT: dict[str, Mutation] = {
    "sink path": setv("sink", "path", "results"),
    "sink kind": setv("sink", "kind", "parquet"),
    "late path": setv("late", "path", "late2"),
    "errors removed": delv("errors"),
    "checkpoint every_events": setv("checkpoint", "every_events", 7),
    "checkpoint every_ms": setv("checkpoint", "every_ms", 100),
    "checkpoint path": setv("checkpoint", "path", "ckpt2"),
    "checkpoint keep": setv("checkpoint", "keep", 10),
    "no checkpoint": delv("checkpoint"),
    "batch size": setv("pipeline", "batch_size", 1),
    "aggregate spacing": setv("aggregates", "total", " sum ( amount ) "),
    "key order in the file": lambda s: s.__setitem__(
        "source", dict(reversed(list(s["source"].items())))),
}


@pytest.mark.parametrize("name", list(CHANGES_FINGERPRINT))
def test_fingerprint_changes_with_what_the_state_depends_on(job_dir: Path, name: str) -> None:
    before = fingerprint(job_dir, base_spec())
    spec = base_spec()
    CHANGES_FINGERPRINT[name](spec)
    assert fingerprint(job_dir, spec) != before


@pytest.mark.parametrize("name", list(KEEPS_FINGERPRINT))
def test_fingerprint_ignores_what_the_state_does_not_depend_on(job_dir: Path, name: str) -> None:
    before = fingerprint(job_dir, base_spec())
    spec = base_spec()
    KEEPS_FINGERPRINT[name](spec)
    assert fingerprint(job_dir, spec) == before


def test_fingerprint_ignores_batch_size_override(job_dir: Path) -> None:
    p = load(job_dir, base_spec())
    assert with_batch_size(p, 3).fingerprint() == p.fingerprint()


def test_fingerprint_changes_when_a_partition_is_added(job_dir: Path) -> None:
    spec = base_spec()
    spec["source"]["paths"] = ["in/*.jsonl"]
    before = fingerprint(job_dir, spec)
    assert fingerprint(job_dir, spec, inputs=("in/p2.jsonl",)) != before


def test_fingerprint_is_stable_and_independent_of_the_job_location(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b" / "c"
    write_inputs(a)
    write_inputs(b)
    fa = fingerprint(a, base_spec())
    assert fa == fingerprint(a, base_spec())
    assert fa == fingerprint(b, base_spec())
    assert len(fa) == 64 and int(fa, 16) >= 0


def test_fingerprint_fields_are_plain_json(job_dir: Path) -> None:
    fields = load(job_dir, base_spec()).fingerprint_fields()
    assert json.loads(json.dumps(fields)) == fields
    assert copy.deepcopy(fields)["window"]["lateness_ms"] == 0


def test_python_api_parts_of_the_wrong_type_are_spec_errors(job_dir: Path) -> None:
    """Built in Python, a dict, string or number where a part belongs is a SpecError
    naming the part, not an AttributeError from deep inside."""
    import sealstream as ss

    good: dict[str, Any] = dict(
        name="p",
        source=ss.FileSource(kind="jsonl", paths=("in/p0.jsonl",), key="user", time="ts",
                             base_dir=job_dir),
        window=ss.Tumbling(size_ms=1000),
        aggregates={"n": "count"},
        sink=ss.Output(kind="jsonl", path="out", base_dir=job_dir),
    )
    ss.Pipeline(**good)
    for part, value, needle in [
        ("window", {"kind": "tumbling", "size_ms": 1000}, "window: expected a Tumbling"),
        ("watermark", 1000, "watermark: expected a Watermark"),
        ("sink", "out", "sink: expected an Output"),
        ("aggregates", ["count"], "aggregates: expected a mapping"),
        ("checkpoint", "ckpt", "checkpoint: expected a Checkpoints"),
        ("source", ss.FileSource(kind="jsonl", paths="in/p0.jsonl",  # type: ignore[arg-type]
                                 key="user", time="ts", base_dir=job_dir),
         "source.paths: expected a list of paths"),
    ]:
        with pytest.raises(SpecError, match=needle):
            ss.Pipeline(**{**good, part: value})
    for bad in (None, {"name": "p"}, 5):
        with pytest.raises(SpecError, match="run: expected a Pipeline or a spec path"):
            ss.run(bad)  # type: ignore[arg-type]


def test_run_takes_a_spec_path(job_dir: Path) -> None:
    import sealstream as ss

    spec = write_spec(job_dir, base_spec())
    summary = ss.run(spec)
    assert summary.counters.events == 2
    assert ss.run(str(spec)).resumed_from is not None  # a str works too; finished: resumes
