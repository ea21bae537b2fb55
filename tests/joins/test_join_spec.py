"""Several-source specs: the spec and Python forms agree, a bad setting is one line
naming it (exit 2), and a changed join definition is refused on resume with a diff."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sealstream import FileSource, Join, Output, Pipeline, Sources, Tumbling, run
from sealstream.checkpoint.manifest import KEY_ENV
from sealstream.cli import main

SPEC = """\
[pipeline]
name = "ctr"

[sources.views]
kind = "csv"
paths = ["in/views.csv"]
key = "ad_id"
time = "time"

[sources.clicks]
kind = "jsonl"
paths = ["in/clicks.jsonl"]
key = "ad"
time = "ts"

[window]
kind = "tumbling"
size_ms = 10

[aggregates]
clicks.n = "count"
views.n = "count"
views.spend = "sum(cost)"

[join]
type = "inner"
fields.ctr = "clicks.n / views.n"

[sink]
kind = "jsonl"
path = "out"

[checkpoint]
path = "ckpt"
"""

CLICKS = [{"ad": "a", "ts": 1}, {"ad": "a", "ts": 4}, {"ad": "b", "ts": 5},
          {"ad": "a", "ts": 15}]
VIEWS = "ad_id,time,cost\na,2,1.5\na,3,2\na,8,1\nb,12,4\nc,13,1\n"


@pytest.fixture(autouse=True)
def _no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)


def _job(d: Path, spec: str = SPEC) -> Path:
    (d / "in").mkdir(parents=True, exist_ok=True)
    (d / "in" / "clicks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CLICKS))
    (d / "in" / "views.csv").write_text(VIEWS)
    (d / "spec.toml").write_text(spec)
    return d / "spec.toml"


def _results(d: Path) -> list[str]:
    return sorted(line for f in (d / "out").glob("*.jsonl")
                  for line in f.read_text().splitlines() if line)


def test_spec_and_python_forms_give_the_same_results(tmp_path: Path) -> None:
    spec = _job(tmp_path / "spec")
    assert main(["run", str(spec), "--quiet"]) == 0
    assert _results(tmp_path / "spec") == [
        '{"key":"a","window_start":0,"window_end":10,"clicks.n":2,"views.n":3,'
        '"views.spend":4.5,"ctr":0.6666666666666666}',
    ]
    d = tmp_path / "python"
    _job(d)
    p = Pipeline(
        name="ctr",
        source=Sources({
            "views": FileSource("csv", ("in/views.csv",), "ad_id", "time", base_dir=d),
            "clicks": FileSource("jsonl", ("in/clicks.jsonl",), "ad", "ts", base_dir=d),
        }),
        window=Tumbling(size_ms=10),
        aggregates={"clicks.n": "count", "views.n": "count", "views.spend": "sum(cost)"},
        join=Join(type="inner", fields={"ctr": "clicks.n / views.n"}),
        sink=Output(kind="jsonl", path="out", base_dir=d),
    )
    run(p)
    assert _results(d) == _results(tmp_path / "spec")


BAD = {
    "unknown source": (('clicks.n = "count"', 'ads.n = "count"'),
                       "aggregates.ads.n: 'ads' is not a source; the sources are clicks, views"),
    "no source named": (('clicks.n = "count"', 'n = "count"'),
                        "aggregates.n: in a several-source job an aggregate is named "
                        "SOURCE.NAME"),
    "derived reads a missing aggregate": (
        ('fields.ctr = "clicks.n / views.n"', 'fields.ctr = "clicks.m / views.n"'),
        "join.fields.ctr = 'clicks.m / views.n': 'clicks.m' is not an aggregate"),
    "derived reads a plain field": (
        ('fields.ctr = "clicks.n / views.n"', 'fields.ctr = "cost / views.n"'),
        "join.fields.ctr = 'cost / views.n': 'cost' is not an aggregate"),
    "join type": (('type = "inner"', 'type = "outer"'),
                  "join.type: 'outer' is not one of inner, left"),
    "left side unknown": (('type = "inner"', 'type = "left"\nleft = "ads"'),
                          "join.left: 'ads' is not a source"),
    "file settings in a kafka source": (('kind = "jsonl"', 'kind = "kafka"'),
                                        "sources.clicks.paths: unknown setting; "
                                        "[sources.clicks] takes bootstrap, client"),
    "per-source where outside its table": (
        ('time = "ts"', 'time = "ts"\nwhere = "ad = \'a\'"'),
        "sources.clicks.where: a source's filter and derived fields go in its "
        "[sources.clicks.transform] table"),
    "per-source types": (('time = "ts"', 'time = "ts"\ntypes = {cost = "decimal(9, 2)"}'),
                         "sources.clicks.types: declared types are not supported yet"),
    "per-source bad where": (
        ('time = "ts"', 'time = "ts"\ntransform.where = "ad = = \'a\'"'),
        "sources.clicks.transform.where"),
    "per-source bad field": (
        ('time = "ts"', 'time = "ts"\ntransform.fields.x = "nosuchfn(ad)"'),
        "sources.clicks.transform.fields.x"),
    "per-source unknown transform setting": (
        ('time = "ts"', 'time = "ts"\ntransform.select = "ad"'),
        "sources.clicks.transform.select: unknown setting"),
    "per-source derived key": (
        ('time = "ts"', 'time = "ts"\ntransform.fields.ad = "upper(ad)"'),
        "sources.clicks.transform.fields.ad: deriving a source's key or time field is not "
        "supported yet"),
    "count_if": (('clicks.n = "count"', 'clicks.n = "count_if(ad = \'a\')"'),
                 "aggregates.clicks.n: count_if is not supported yet"),
    "missing file": (('"in/views.csv"', '"in/nope.csv"'),
                     "sources.views.paths: input file 'in/nope.csv' does not exist"),
    "one file, two sources": (('"in/views.csv"', '"in/clicks.jsonl"'),
                              "sources.views.paths: partition 'in/clicks.jsonl' is also "
                              "named by source 'clicks'"),
    "enrich": (("[sink]", '[[enrich]]\nname = "ads"\nkind = "csv"\npath = "in/views.csv"\n'
                          'on = "ad_id"\n\n[sink]'),
               "[[enrich]]: enrichment is not supported yet in a several-source job"),
    "archive": (("[sink]", '[archive]\nurl = "arch"\n\n[sink]'),
                "[archive]: the raw-event archive is not supported yet in a several-source "
                "job; it is for a job with one kafka or nats [source] (remove the section)"),
    "both forms": (("[sources.views]", '[source]\nkind = "jsonl"\n\n[sources.views]'),
                   "[source] and [sources.NAME]: give one source, or several, not both"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_setting_is_one_line_naming_it(case: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    (old, new), want = BAD[case]
    assert old in SPEC
    spec = _job(tmp_path, SPEC.replace(old, new, 1))
    rc = main(["run", str(spec)])
    _, err = capsys.readouterr()
    assert rc == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert want in lines[0], lines[0]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_changed_join_is_refused_on_resume(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    spec = _job(tmp_path)
    assert main(["run", str(spec), "--quiet"]) == 0
    capsys.readouterr()
    spec.write_text(SPEC.replace('type = "inner"', 'type = "left"'))
    (tmp_path / "in" / "clicks.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in [*CLICKS, {"ad": "a", "ts": 30}]))
    rc = main(["run", str(spec), "--quiet"])
    _, err = capsys.readouterr()
    assert rc != 0
    assert 'join.type: "inner" -> "left"' in err, err


def test_python_form_refuses_enrich_and_archive(tmp_path: Path) -> None:
    from sealstream.archive import ArchiveSettings
    from sealstream.enrich import Enrich
    from sealstream.errors import SpecError

    _job(tmp_path)
    base = {
        "name": "ctr",
        "source": Sources({
            "clicks": FileSource("jsonl", ("in/clicks.jsonl",), key="ad", time="ts",
                                 base_dir=tmp_path),
            "views": FileSource("csv", ("in/views.csv",), key="ad_id", time="time",
                                base_dir=tmp_path)}),
        "window": Tumbling(size_ms=10),
        "aggregates": {"clicks.n": "count", "views.n": "count"},
        "sink": Output(kind="jsonl", path="out", base_dir=tmp_path),
    }
    with pytest.raises(SpecError, match=r"^\[\[enrich\]\]: enrichment is not supported yet"):
        Pipeline(**base, enrich=(Enrich(name="ads", kind="csv", path="in/views.csv",
                                        on=("ad_id",), base_dir=tmp_path),))
    with pytest.raises(SpecError, match=r"^\[archive\]: the raw-event archive is not supported yet "
                                        r"in a several-source job"):
        Pipeline(**base, archive=ArchiveSettings(url=str(tmp_path / "arch")))
