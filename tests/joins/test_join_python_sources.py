"""``Pipeline(sources={...})``, the Python spelling of ``[sources.NAME]`` tables as the
issue writes it (docs/joins.md): the same job as ``source=Sources({...})`` and as the
spec, with a transform per source; giving both forms, or neither, is one clear error."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sealstream import (
    FileSource,
    Join,
    Output,
    Pipeline,
    Sources,
    SourceTransform,
    SpecError,
    Tumbling,
    run,
)
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
"""

CLICKS = '{"ad":"a","ts":1}\n{"ad":"a","ts":4}\n{"ad":"b","ts":5}\n{"ad":"a","ts":15}\n'
VIEWS = "ad_id,time,cost\na,2,1.5\na,3,2\na,8,1\nb,12,4\nb,13,1\n"


def _job(d: Path) -> Path:
    (d / "in").mkdir(parents=True, exist_ok=True)
    (d / "in" / "clicks.jsonl").write_text(CLICKS)
    (d / "in" / "views.csv").write_text(VIEWS)
    (d / "spec.toml").write_text(SPEC)
    return d / "spec.toml"


def _results(d: Path) -> list[str]:
    return sorted(line for f in (d / "out").glob("*.jsonl")
                  for line in f.read_text().splitlines() if line)


@pytest.fixture(autouse=True)
def _no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)


def _members(d: Path) -> dict[str, FileSource]:
    return {"views": FileSource("csv", ("in/views.csv",), "ad_id", "time", base_dir=d),
            "clicks": FileSource("jsonl", ("in/clicks.jsonl",), "ad", "ts", base_dir=d)}


def _pipeline(d: Path, **source: object) -> Pipeline:
    return Pipeline(
        name="ctr",
        window=Tumbling(size_ms=10),
        aggregates={"clicks.n": "count", "views.n": "count", "views.spend": "sum(cost)"},
        join=Join(type="inner", fields={"ctr": "clicks.n / views.n"}),
        sink=Output(kind="jsonl", path="out", base_dir=d),
        **source,  # type: ignore[arg-type]
    )


def test_sources_mapping_equals_the_spec_and_the_sources_object(tmp_path: Path) -> None:
    spec = _job(tmp_path / "spec")
    assert main(["run", str(spec), "--quiet"]) == 0
    want = _results(tmp_path / "spec")
    assert want

    d = tmp_path / "mapping"
    _job(d)
    p = _pipeline(d, sources=_members(d))
    assert isinstance(p.source, Sources) and p.source.names == ("clicks", "views")
    assert p == _pipeline(d, source=Sources(_members(d)))  # one definition, two spellings
    assert p.fingerprint() == _pipeline(d, source=Sources(_members(d))).fingerprint()
    run(p)
    assert _results(d) == want
    # a copy with a change keeps the sources (replace() does not ask for sources= again)
    assert dataclasses.replace(p, batch_size=7).source == p.source


def test_sources_may_be_a_sources_object_with_transforms(tmp_path: Path) -> None:
    d = tmp_path / "job"
    _job(d)
    dear = Sources(_members(d), transforms={"views": SourceTransform(where="cost > 1")})
    run(_pipeline(d, sources=dear))
    assert _results(d) == ['{"key":"a","window_start":0,"window_end":10,"clicks.n":2,'
                           '"views.n":2,"views.spend":3.5,"ctr":1.0}']


def test_both_forms_or_neither_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"^source= and sources=: give one source, or "
                                        r"several, not both$"):
        _pipeline(tmp_path, sources=_members(tmp_path), source=Sources(_members(tmp_path)))
    with pytest.raises(SpecError, match=r"^source: required setting is missing "
                                        r"\(source= or sources=\)$"):
        _pipeline(tmp_path)
    with pytest.raises(SpecError, match=r"^sources: expected a table of NAME = source"):
        _pipeline(tmp_path, sources={})
    with pytest.raises(SpecError, match=r"^window: required setting is missing$"):
        Pipeline(name="x", sources=_members(tmp_path),
                 aggregates={"clicks.n": "count"}, sink=Output(kind="stdout"))
