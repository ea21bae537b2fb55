"""Transforms: where the filter sits, derived fields, key and time, bad records
from expressions, refused expressions (exit 2 naming the setting and position), the
Python API, and the fit check of a changed transform."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import sealstream as ss
from sealstream.cli import main
from sealstream.errors import SpecError
from sealstream.pipeline import load_spec, pipeline_from_dict


def lines(d: Path, sub: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for f in sorted((d / sub).glob("*.jsonl")) if (d / sub).is_dir() else []:
        if not f.name.startswith((".", "_")):
            out += [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    return out


def job(d: Path, records: list[dict[str, Any]], *, transform: str = "", aggregates: str = "",
        key: str = '"k"', time: str = '"ts"', window: str = 'kind = "tumbling"\nsize_ms = 10',
        errors: bool = True, delay: int = 0, extra: str = "") -> Path:
    (d / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    text = f"""
[pipeline]
name = "t"
batch_size = 3
[source]
kind = "jsonl"
paths = ["in.jsonl"]
key = {key}
time = {time}
[watermark]
max_delay_ms = {delay}
[transform]
{transform}
[window]
{window}
[aggregates]
n = "count"
{aggregates}
[sink]
kind = "jsonl"
path = "out"
[late]
kind = "jsonl"
path = "late"
{extra}
"""
    if errors:
        text += '[errors]\nkind = "jsonl"\npath = "errors"\n'
    (d / "spec.toml").write_text(text)
    return d / "spec.toml"


def run(spec: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(["run", str(spec), "--quiet"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, err


# ------------------------------------------------------------------ the filter
def test_filtered_events_still_advance_the_watermark(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """An info event at t=100 is dropped by the filter, yet it moves the watermark to
    100: the error event at t=5 that follows is late, and the late output shows it as
    it was read."""
    spec = job(tmp_path, [{"k": "a", "ts": 100, "level": "info"},
                          {"k": "a", "ts": 5, "level": "error"},
                          {"k": "a", "ts": 101, "level": "error"}],
               transform="where = \"level = 'error'\"")
    rc, err = run(spec, capsys)
    assert rc == 0, err
    assert lines(tmp_path, "out") == [{"key": "a", "window_start": 100, "window_end": 110,
                                       "n": 1}]
    assert lines(tmp_path, "late") == [{"k": "a", "ts": 5, "level": "error",
                                        "_partition": "in.jsonl", "_offset": 1}]


def test_filter_null_is_false(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = job(tmp_path, [{"k": "a", "ts": 1, "v": 3}, {"k": "a", "ts": 2},
                          {"k": "a", "ts": 3, "v": 1}], transform='where = "v > 2"')
    rc, err = run(spec, capsys)
    assert rc == 0, err
    assert [r["n"] for r in lines(tmp_path, "out")] == [1]


# ------------------------------------------------------------------ derived fields, key, time
def test_derived_key_time_and_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = [
        {"service": "API", "when": "2024/01/02 03:04:05", "bytes": 2048, "user": "u1"},
        {"service": "api", "when": "2024/01/02 03:04:06", "bytes": 1024, "user": "u2"},
        {"service": "Db", "when": "2024/01/02 03:04:07", "bytes": 512, "user": "u1"},
    ]
    spec = job(tmp_path, records, key='"svc"', time='"t"',
               window='kind = "tumbling"\nsize_ms = 60000',
               transform='fields.svc = "lower(service)"\n'
                         "fields.t = \"strptime(\\\"when\\\", '%Y/%m/%d %H:%M:%S')\"\n"
                         'fields.kb = "bytes / 1024"',
               aggregates='kb = "sum(kb)"\nusers = "count_distinct(user)"')
    rc, err = run(spec, capsys)
    assert rc == 0, err
    start = 1704164640000  # 2024-01-02T03:04:00Z
    assert sorted(lines(tmp_path, "out"), key=lambda r: r["key"]) == [
        {"key": "api", "window_start": start, "window_end": start + 60000, "n": 2,
         "kb": 3.0, "users": 2},
        {"key": "db", "window_start": start, "window_end": start + 60000, "n": 1,
         "kb": 0.5, "users": 1},
    ]


def test_a_value_that_breaks_an_expression_makes_the_record_bad(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recs = [{"k": "a", "ts": 1, "lat": "12"}, {"k": "a", "ts": 2, "lat": "x"},
            {"k": "a", "ts": 3, "lat": 4}, {"k": "a", "ts": 4, "lat": "7"}]
    spec = job(tmp_path, recs, transform='fields.ms = "cast(lat as int)"',
               aggregates='total = "sum(ms)"')
    rc, err = run(spec, capsys)
    assert rc == 0, err
    bad = lines(tmp_path, "errors")
    assert [(b["_offset"], b["_line"]) for b in bad] == [(1, 2)]
    assert bad[0]["_reason"].startswith("transform.fields.ms = 'cast(lat as int)' failed")
    assert json.loads(bad[0]["_raw"]) == recs[1]
    assert lines(tmp_path, "out") == [{"key": "a", "window_start": 0, "window_end": 10,
                                       "n": 3, "total": 23}]


def test_a_failed_expression_without_errors_output_stops_naming_file_and_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = job(tmp_path, [{"k": "a", "ts": 1, "s": "b"}, {"k": "a", "ts": 2, "s": 5}],
               transform='fields.u = "upper(s)"', aggregates='u = "first(u)"', errors=False)
    rc, err = run(spec, capsys)
    assert rc == 1
    assert "in.jsonl: line 2: transform.fields.u = 'upper(s)' failed" in err


def test_a_derived_field_read_by_a_numeric_aggregate_must_be_a_number(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = job(tmp_path, [{"k": "a", "ts": 1, "s": "b"}, {"k": "a", "ts": 2, "s": 5}],
               transform='fields.u = "s"', aggregates='total = "sum(u)"')
    rc, err = run(spec, capsys)
    assert rc == 0, err
    assert [b["_offset"] for b in lines(tmp_path, "errors")] == [0]
    assert "non-numeric value" in lines(tmp_path, "errors")[0]["_reason"]
    assert lines(tmp_path, "out")[0]["total"] == 5


# ------------------------------------------------------------------ refused expressions
@pytest.mark.parametrize(("transform", "needles"), [
    ("where = \"level = 'e' and ts < now()\"",
     ["transform.where", "at position 22", "now is not deterministic"]),
    ('fields.r = "random() * 2"', ["transform.fields.r", "at position 1", "random"]),
    ('fields.c = "current_date"', ["transform.fields.c", "at position 1"]),
    ('fields.s = "sum(v)"', ["transform.fields.s", "at position 1", "sum() is not an allowed"]),
    ('fields.s = "v +* 2"', ["transform.fields.s", "not a valid expression"]),
    ('fields.w = "row_number() over (order by ts)"', ["transform.fields.w", "at position 1"]),
    ('fields._x = "v"', ["transform.fields", "reserved"]),
    ("where = 3", ["transform.where", "expected a string"]),
])
def test_impure_or_invalid_expressions_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              transform: str, needles: list[str]) -> None:
    spec = job(tmp_path, [{"k": "a", "ts": 1}], transform=transform)
    rc, err = run(spec, capsys)
    assert rc == 2
    assert len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


def test_count_if_condition_is_checked_too(tmp_path: Path) -> None:
    spec = job(tmp_path, [{"k": "a", "ts": 1}], aggregates='x = "count_if(rand() > 0.5)"')
    with pytest.raises(SpecError, match=r"aggregates\.x = 'rand\(\) > 0\.5': at position 1"):
        load_spec(spec)


# ------------------------------------------------------------------ the Python API
def test_python_api_with_polars_expressions(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"service": "API", "ts": 1, "level": "error", "ms": 10},
        {"service": "api", "ts": 2, "level": "info", "ms": 99},
        {"service": "api", "ts": 3, "level": "error", "ms": 30},
    ]))
    p = ss.Pipeline(
        name="py",
        source=ss.FileSource(kind="jsonl", paths=("in.jsonl",), key="svc", time="ts",
                             base_dir=tmp_path),
        window=ss.Tumbling(size_ms=60_000),
        aggregates={"n": "count", "p50": "median(ms)"},
        sink=ss.Output(kind="jsonl", path="out", base_dir=tmp_path),
        where=pl.col("level") == "error",
        fields={"svc": pl.col("service").str.to_lowercase()},
    )
    ss.run(p)
    assert lines(tmp_path, "out") == [{"key": "api", "window_start": 0, "window_end": 60000,
                                       "n": 2, "p50": 20.0}]


def test_python_api_refuses_expressions_that_are_not_row_wise(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text('{"k": "a", "ts": 1, "v": 1}\n')
    with pytest.raises(SpecError, match="transform.where.*not row-wise"):
        ss.Pipeline(
            name="py",
            source=ss.FileSource(kind="jsonl", paths=("in.jsonl",), key="k", time="ts",
                                 base_dir=tmp_path),
            window=ss.Tumbling(size_ms=10),
            aggregates={"n": "count"},
            sink=ss.Output(kind="jsonl", path="out", base_dir=tmp_path),
            where=pl.col("v") > pl.col("v").mean(),
        )


# ------------------------------------------------------------------ fingerprint
def _definition(**transform: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "pipeline": {"name": "f"},
        "source": {"kind": "jsonl", "paths": ["in.jsonl"], "key": "k", "time": "ts"},
        "window": {"kind": "tumbling", "size_ms": 10},
        "aggregates": {"n": "count"},
        "sink": {"kind": "jsonl", "path": "out"},
    }
    if transform:
        data["transform"] = transform
    return data


def test_fingerprint_without_a_transform_is_unchanged(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text("")
    p = pipeline_from_dict(_definition(), base_dir=tmp_path)
    assert "transform" not in p.fingerprint_fields()
    q = pipeline_from_dict(_definition(where="k = 'a'"), base_dir=tmp_path)
    assert q.fingerprint_fields()["transform"] == {"where": "k = 'a'"}
    assert p.fingerprint() != q.fingerprint()


def test_a_changed_filter_is_refused_on_resume_with_the_diff(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recs = [{"k": "a", "ts": t, "v": t % 3} for t in range(40)]
    spec = job(tmp_path, recs, transform='where = "v > 0"',
               extra='[checkpoint]\npath = "ckpt"\nevery_events = 5\n')
    rc, err = run(spec, capsys)
    assert rc == 0, err
    spec.write_text(spec.read_text().replace('where = "v > 0"', 'where = "v > 1"'))
    rc, err = run(spec, capsys)
    assert rc == 1
    assert 'transform.where: "v > 0" -> "v > 1"' in err


# ------------------------------------------------------------------ map_batches
def _py_pipeline(d: Path, **kw: Any) -> ss.Pipeline:
    return ss.Pipeline(
        name="mb",
        source=ss.FileSource(kind="jsonl", paths=("in.jsonl",), key="k", time="ts",
                             base_dir=d),
        window=ss.Tumbling(size_ms=100),
        sink=ss.Output(kind="jsonl", path="out", base_dir=d),
        errors=ss.Output(kind="jsonl", path="errors", base_dir=d),
        checkpoint=ss.Checkpoints(path="ckpt", every_events=2, base_dir=d),
        **kw,
    )


def _domain(frame: pl.DataFrame) -> pl.DataFrame:
    if frame.height and (frame["url"] == "boom").any():
        raise ValueError("cannot parse url")
    return frame.with_columns(
        pl.col("url").str.extract(r"^https?://([^/]+)", 1).alias("host"))


def test_map_batches_derives_fields_and_is_fingerprinted_by_its_version(tmp_path: Path) -> None:
    from sealstream.transforms import MapBatches

    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"k": "a", "ts": 1, "url": "https://x.org/a"},
        {"k": "a", "ts": 2, "url": "https://y.org/b"},
        {"k": "a", "ts": 3, "url": "boom"},
        {"k": "a", "ts": 4, "url": "http://x.org/c"},
    ]))
    mb = MapBatches(_domain, version="1", reads=("url",), writes=("host",))
    p = _py_pipeline(tmp_path, aggregates={"hosts": "count_distinct(host)", "n": "count"},
                     map_batches=mb, where="host <> 'y.org'")
    assert p.fingerprint_fields()["transform"]["map_batches"] == {
        "version": "1", "reads": ["url"], "writes": ["host"]}
    ss.run(p)
    assert lines(tmp_path, "out") == [{"key": "a", "window_start": 0, "window_end": 100,
                                       "hosts": 1, "n": 2}]
    bad = lines(tmp_path, "errors")
    assert [b["_offset"] for b in bad] == [2]
    assert bad[0]["_reason"] == "map_batches (version '1') failed: cannot parse url"
    changed = _py_pipeline(tmp_path, aggregates={"hosts": "count_distinct(host)", "n": "count"},
                           map_batches=MapBatches(_domain, version="2", reads=("url",),
                                                  writes=("host",)),
                           where="host <> 'y.org'")
    with pytest.raises(ss.SealstreamError, match=r'map_batches.version: "1" -> "2"'):
        ss.run(changed)


def test_map_batches_needs_a_version(tmp_path: Path) -> None:
    from sealstream.transforms import MapBatches

    (tmp_path / "in.jsonl").write_text("")
    with pytest.raises(SpecError, match="map_batches.version"):
        _py_pipeline(tmp_path, aggregates={"n": "count"},
                     map_batches=MapBatches(_domain, version="", reads=("url",),
                                            writes=("host",)))


@pytest.mark.parametrize("expr", [
    pl.col("x").map_elements(lambda v: v, return_dtype=pl.Int64), pl.col("x").sample(2),
    pl.col("x").sum().over("k"), pl.col("x") - pl.col("x").min(), pl.col("x").shift(1),
    pl.col("x").head(2), pl.col("x").rank(),
], ids=str)
def test_polars_expressions_that_read_other_rows_are_refused(expr: pl.Expr) -> None:
    from sealstream.transforms import check_polars

    with pytest.raises(SpecError, match="not row-wise and deterministic"):
        check_polars("transform.fields.x", expr)


@pytest.mark.parametrize("expr", [
    pl.col("sample_rate") > 1, pl.col("level") == "x.sum()", pl.col("s").str.len_chars(),
    pl.min_horizontal("a", "b"),
], ids=str)
def test_row_wise_polars_expressions_pass(expr: pl.Expr) -> None:
    from sealstream.transforms import check_polars

    assert check_polars("transform.fields.x", expr) is expr
