"""``[[enrich]]`` from files: each event gets the row of the reference table
valid at its event time, before the transform and the windows (docs/enrich.md)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from _enrich import jsonl, results, run, spec_text

from sealstream.checkpoint.manifest import KEY_ENV

EVENTS = [
    {"user": "u1", "ts": 1000, "amount": 10},
    {"user": "u2", "ts": 2000, "amount": 5},
    {"user": 7, "ts": 3000, "amount": 2},
    {"user": "u1", "ts": 6000, "amount": 7},
    {"user": "u3", "ts": 6500, "amount": 1},
    {"user": "u1", "ts": 4999, "amount": 3},
]
TABLE = pl.DataFrame({
    "user": ["u1", "u1", "u2", "7"],
    "country": ["FR", "DE", "US", "JP"],
    "discount": [0.1, 0.2, 0.0, 0.5],
    "since": [0, 5000, 0, 0],
})


@pytest.fixture(autouse=True)
def _no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)


def write_table(d: Path, kind: str, frame: pl.DataFrame = TABLE) -> str:
    path = d / f"users.{kind}"
    if kind == "csv":
        frame.write_csv(path)
    elif kind == "parquet":
        frame.write_parquet(path)
    else:
        frame.write_ndjson(path)
    return path.name


def job(d: Path, kind: str = "csv", on_missing: str = "null", valid_from: bool = True,
        **kw: object) -> Path:
    (d / "in").mkdir(parents=True, exist_ok=True)
    (d / "in" / "p0.jsonl").write_text(jsonl(EVENTS))
    name = write_table(d, kind)
    enrich = (f'[[enrich]]\nname = "users"\nkind = "{kind}"\npath = "{name}"\non = "user"\n'
              f'on_missing = "{on_missing}"\n' + ('valid_from = "since"\n' if valid_from else ""))
    spec = d / "spec.toml"
    spec.write_text(spec_text(enrich, **kw))  # type: ignore[arg-type]
    return spec


@pytest.mark.parametrize("kind", ["csv", "parquet", "jsonl"])
def test_each_event_joins_the_row_valid_at_its_time(
        tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    spec = job(tmp_path, kind, aggregates='n = "count"\nc = "last(country)"\n'
               'd = "sum(disc)"', transform='[transform]\nfields.disc = "amount * discount"')
    code, err = run(spec, capsys)
    assert code == 0, err
    got = {r["key"]: r for r in results(tmp_path)}
    # u1 at 1000 and 4999: FR (0.1); at 6000: DE (0.2); the integer key 7 matches "7"
    assert got["u1"]["c"] == "DE" and got["u1"]["d"] == pytest.approx(1.0 + 0.3 + 1.4)
    assert got["u2"] == {"key": "u2", "window_start": 0, "window_end": 10000, "n": 1,
                         "c": "US", "d": 0.0}
    assert got[7]["c"] == "JP" and got[7]["d"] == pytest.approx(1.0)
    assert got["u3"]["c"] is None and got["u3"]["d"] is None and got["u3"]["n"] == 1


def test_without_valid_from_the_table_is_one_version(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path
    (d / "in").mkdir()
    (d / "in" / "p0.jsonl").write_text(jsonl(EVENTS))
    write_table(d, "csv", TABLE.filter(pl.col("since") == 0).drop("since"))
    spec = d / "spec.toml"
    spec.write_text(spec_text('[[enrich]]\nname = "users"\nkind = "csv"\npath = "users.csv"\n'
                              'on = "user"\n'))
    assert run(spec, capsys)[0] == 0
    assert {r["key"]: r["c"] for r in results(d)} == {"u1": "FR", "u2": "US", 7: "JP",
                                                     "u3": None}


def test_enriched_columns_feed_a_compound_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = job(tmp_path, key='["country"]', aggregates='n = "count"\ns = "sum(amount)"',
               on_missing="drop")
    code, err = run(spec, capsys)
    assert code == 0, err
    got = {r["country"]: (r["n"], r["s"]) for r in results(tmp_path)}
    assert got == {"FR": (2, 13), "DE": (1, 7), "US": (1, 5), "JP": (1, 2)}


def test_on_missing_drop_leaves_the_event_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = job(tmp_path, on_missing="drop")
    assert run(spec, capsys)[0] == 0
    assert "u3" not in {r["key"] for r in results(tmp_path)}
    assert len(results(tmp_path)) == 3


def test_on_missing_error_names_partition_and_offset(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = job(tmp_path, on_missing="error")
    code, err = run(spec, capsys)
    assert code == 1
    assert err.splitlines() == [
        "sealstream: error: in/p0.jsonl: offset 4: enrich.users: the reference table has "
        "no row for user='u3' valid at the event's time 6500 ms (on_missing = \"error\")"]
    # the checkpoints before the event stand: nothing committed is lost
    first = results(tmp_path)
    assert first == []  # no window had closed yet
    assert any((tmp_path / "ckpt").glob("cp-*/MANIFEST.json"))


def test_an_event_before_the_first_version_has_no_row(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path
    (d / "in").mkdir()
    (d / "in" / "p0.jsonl").write_text(jsonl([{"user": "u1", "ts": 100, "amount": 1},
                                              {"user": "u1", "ts": 20000, "amount": 1}]))
    write_table(d, "csv", pl.DataFrame({"user": ["u1"], "country": ["FR"],
                                        "since": ["1970-01-01T00:00:01Z"]}))
    spec = d / "spec.toml"
    spec.write_text(spec_text('[[enrich]]\nname = "users"\nkind = "csv"\npath = "users.csv"\n'
                              'on = "user"\nvalid_from = "since"\n'))
    assert run(spec, capsys)[0] == 0
    assert sorted((r["window_start"], r["c"] or "") for r in results(d)) == [(0, ""),
                                                                            (20000, "FR")]


def test_the_python_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sealstream as ss

    (tmp_path / "orders").mkdir()
    (tmp_path / "orders" / "o.jsonl").write_text(jsonl(EVENTS))
    write_table(tmp_path, "csv")
    monkeypatch.chdir(tmp_path)
    job = ss.Pipeline(
        name="orders-by-country",
        source=ss.FileSource(kind="jsonl", paths=("orders/*.jsonl",), key=("country",),
                             time="ts"),
        enrich=[ss.Enrich(name="users", kind="csv", path="users.csv", on=("user",),
                          valid_from="since", on_missing="drop")],
        window=ss.Tumbling(size_ms=60_000),
        aggregates={"orders": "count", "revenue": "sum(amount)"},
        sink=ss.Output(kind="jsonl", path="out"),
    )
    assert "enrich" in job.fingerprint_fields()
    ss.run(job)
    got = {r["country"]: (r["orders"], r["revenue"]) for r in results(tmp_path)}
    assert got == {"FR": (2, 13), "DE": (1, 7), "US": (1, 5), "JP": (1, 2)}


def test_the_public_surface() -> None:
    import sealstream.enrich as enrich

    assert enrich.__all__ == sorted(enrich.__all__)
    for name in enrich.__all__:
        assert hasattr(enrich, name)


def test_csv_key_columns_keep_their_text(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path
    (d / "in").mkdir()
    (d / "in" / "p0.jsonl").write_text(jsonl([{"user": "007", "ts": 1, "amount": 1},
                                              {"user": 7, "ts": 2, "amount": 1}]))
    (d / "users.csv").write_text("user,country\n007,UK\n7,JP\n")
    spec = d / "spec.toml"
    spec.write_text(spec_text('[[enrich]]\nname = "users"\nkind = "csv"\npath = "users.csv"\n'
                              'on = "user"\n'))
    assert run(spec, capsys)[0] == 0
    assert {r["key"]: r["c"] for r in results(d)} == {"007": "UK", 7: "JP"}


def test_on_a_field_of_a_compound_key(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    spec = job(tmp_path, key='["user", "country"]', aggregates='n = "count"',
               on_missing="drop")
    code, err = run(spec, capsys)
    assert code == 0, err
    got = sorted((str(r["user"]), r["country"], r["n"]) for r in results(tmp_path))
    assert got == [("7", "JP", 1), ("u1", "DE", 1), ("u1", "FR", 2), ("u2", "US", 1)]


def test_on_a_derived_key_is_refused(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    spec = job(tmp_path, key='"kk"', transform='[transform]\nfields.kk = "amount + 1"')
    text = spec.read_text().replace('on = "user"', 'on = "kk"')
    spec.write_text(text)
    code, err = run(spec, capsys)
    assert code == 2
    assert err.splitlines() == ["sealstream: error: enrich.users.on: 'kk' is the key derived "
                                "by [transform]; enrichment runs before [transform]"]
