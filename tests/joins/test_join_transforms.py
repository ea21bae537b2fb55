"""Per-source transforms in a several-source job (docs/joins.md): each source's own
``[sources.NAME.transform]`` (filter, derived fields) applied to that source's rows
before the union, checked against output computed by hand; a record an expression
fails on is a bad record naming its file and line; the spec and Python forms agree."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sealstream import (
    FileSource,
    Join,
    Output,
    Pipeline,
    Sources,
    SourceTransform,
    Tumbling,
    run,
)
from sealstream.checkpoint.manifest import KEY_ENV
from sealstream.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _join_case import ctr_spec, source_block  # noqa: E402

SPEC = ctr_spec(
    [source_block("clicks", "jsonl", settings={"paths": ["in/clicks.jsonl"]},
                  extra='[sources.clicks.transform]\nwhere = "bot = false"\n'
                        'fields.v2 = "v * 2"\n'),
     source_block("views", "csv", ("ad_id", "time", "cost"),
                  {"paths": ["in/views.csv"], "transform.where": "cost >= 2"})],
    left="views", name="filtered", batch_size=None, max_delay_ms=None, outputs=("errors",),
    window={"kind": "tumbling", "size_ms": 10},
    aggregates={"clicks.n": "count", "clicks.total": "sum(v2)", "views.n": "count",
                "views.spend": "sum(cost)"})

CLICKS = [
    {"ad": "a", "ts": 1, "v": 1, "bot": False},
    {"ad": "a", "ts": 2, "v": 5, "bot": True},    # filtered out by clicks' where
    {"ad": "a", "ts": 4, "v": 3, "bot": False},
    {"ad": "b", "ts": 5, "v": "x", "bot": False},  # v * 2 fails: a bad record, line 4
    {"ad": "b", "ts": 12, "v": 2, "bot": False},
    {"ad": "c", "ts": 13, "v": 7, "bot": False},
]
# views' where keeps cost >= 2: (a, 3, 2), (a, 8, 4), (b, 12, 2); (b, 5, 1) dropped,
# so window [0, 10) of b has no view and the left join (left = views) drops it; c has
# no view at all
VIEWS = "ad_id,time,cost\na,3,2\nb,5,1\na,8,4\nb,12,2\nc,13,1\n"

EXPECTED = [
    {"key": "a", "window_start": 0, "window_end": 10, "clicks.n": 2, "clicks.total": 8,
     "views.n": 2, "views.spend": 6, "ctr": 1.0},
    {"key": "b", "window_start": 10, "window_end": 20, "clicks.n": 1, "clicks.total": 4,
     "views.n": 1, "views.spend": 2, "ctr": 1.0},
]


@pytest.fixture(autouse=True)
def _no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)


def _job(d: Path, spec: str = SPEC) -> Path:
    (d / "in").mkdir(parents=True, exist_ok=True)
    (d / "in" / "clicks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CLICKS))
    (d / "in" / "views.csv").write_text(VIEWS)
    (d / "spec.toml").write_text(spec)
    return d / "spec.toml"


def _rows(d: Path, sub: str) -> list[dict[str, object]]:
    rows = [json.loads(line) for f in sorted((d / sub).glob("*.jsonl"))
            for line in f.read_text().splitlines() if line]
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))


def _numbers(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{k: float(v) if isinstance(v, int | float) and not isinstance(v, bool)
             and k not in ("window_start", "window_end") else v for k, v in r.items()}
            for r in rows]


def test_each_source_is_filtered_and_derived_before_the_union(tmp_path: Path) -> None:
    spec = _job(tmp_path)
    assert main(["run", str(spec), "--quiet"]) == 0
    got = sorted(_rows(tmp_path, "out"), key=lambda r: (r["key"], r["window_start"]))
    assert _numbers(got) == _numbers(EXPECTED)
    bad = _rows(tmp_path, "errors")
    assert len(bad) == 1, bad
    assert bad[0]["_partition"] == "in/clicks.jsonl" and bad[0]["_line"] == 4, bad[0]
    assert bad[0]["_raw"] == json.dumps(CLICKS[3]), bad[0]
    assert "sources.clicks.transform.fields.v2 = 'v * 2' failed" in bad[0]["_reason"], bad


def test_python_form_gives_the_same_results(tmp_path: Path) -> None:
    _job(tmp_path / "spec")
    assert main(["run", str(tmp_path / "spec" / "spec.toml"), "--quiet"]) == 0
    d = tmp_path / "py"
    _job(d)
    p = Pipeline(
        name="filtered",
        source=Sources(
            {"clicks": FileSource("jsonl", ("in/clicks.jsonl",), key="ad", time="ts",
                                  base_dir=d),
             "views": FileSource("csv", ("in/views.csv",), key="ad_id", time="time",
                                 base_dir=d)},
            transforms={"clicks": SourceTransform(where="bot = false",
                                                  fields={"v2": "v * 2"}),
                        "views": SourceTransform(where="cost >= 2")}),
        window=Tumbling(size_ms=10),
        aggregates={"clicks.n": "count", "clicks.total": "sum(v2)", "views.n": "count",
                    "views.spend": "sum(cost)"},
        join=Join(type="left", left="views", fields={"ctr": "clicks.n / views.n"}),
        sink=Output(kind="jsonl", path="out", base_dir=d),
        errors=Output(kind="jsonl", path="errors", base_dir=d),
    )
    run(p)
    assert _rows(d, "out") == _rows(tmp_path / "spec", "out")
    assert _rows(d, "errors") == _rows(tmp_path / "spec", "errors")


def test_a_changed_source_transform_is_refused_on_resume(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _job(tmp_path, SPEC + '\n[checkpoint]\npath = "ckpt"\n')
    assert main(["run", str(spec), "--quiet"]) == 0
    capsys.readouterr()
    spec.write_text(spec.read_text().replace("cost >= 2", "cost >= 3"))
    assert main(["run", str(spec), "--quiet"]) != 0
    _, err = capsys.readouterr()
    assert "sources.views.transform.where" in err and "cost >= 3" in err, err


WATERMARK_SPEC = """\
[pipeline]
name = "wm"
batch_size = 1

[sources.clicks]
kind = "jsonl"
paths = ["in/clicks.jsonl"]
key = "ad"
time = "ts"
transform.where = "bot = false"

[sources.views]
kind = "jsonl"
paths = ["in/views.jsonl"]
key = "ad"
time = "ts"

[window]
kind = "tumbling"
size_ms = 10

[aggregates]
clicks.n = "count"
views.n = "count"

[sink]
kind = "jsonl"
path = "out"

[late]
kind = "jsonl"
path = "late"
"""


@pytest.mark.parametrize("batch_size", [1, 2, 64])
def test_a_filtered_out_event_still_moves_the_watermark(tmp_path: Path,
                                                        batch_size: int) -> None:
    """As for one source, the filter drops events after the watermark has seen them:
    the bot click at 50 moves the clicks partition to 50, the views partition is at 100
    then, so W = 50 and the click at 2 (read after them) is late for [0, 10)."""
    (tmp_path / "in").mkdir()
    clicks = [{"ad": "a", "ts": 1, "bot": False}, {"ad": "a", "ts": 50, "bot": True},
              {"ad": "a", "ts": 2, "bot": False}]
    views = [{"ad": "a", "ts": 1}, {"ad": "a", "ts": 100}, {"ad": "a", "ts": 101}]
    (tmp_path / "in" / "clicks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in clicks))
    (tmp_path / "in" / "views.jsonl").write_text("".join(json.dumps(r) + "\n" for r in views))
    spec = tmp_path / "spec.toml"
    spec.write_text(WATERMARK_SPEC.replace("batch_size = 1", f"batch_size = {batch_size}"))
    assert main(["run", str(spec), "--quiet"]) == 0
    assert _numbers(_rows(tmp_path, "out")) == _numbers([
        {"key": "a", "window_start": 0, "window_end": 10, "clicks.n": 1, "views.n": 1}])
    late = _rows(tmp_path, "late")
    assert late == [{"ad": "a", "ts": 2, "bot": False, "_partition": "in/clicks.jsonl",
                     "_offset": 2}], late
