"""Tests of the deterministic event generator and the spec writer."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from sealstream.testing.datagen import generate, partition_sizes, toml_dumps, write_spec

SCHEMA = {"user": pl.String, "ts": pl.Int64, "amount": pl.Float64}


def _read_jsonl(path: Path) -> pl.DataFrame:
    return pl.read_ndjson(path, schema=SCHEMA)


def _gap_below_running_max(ts: np.ndarray) -> np.ndarray:
    """For each event, how far its time is below the max of the times before it (0 if above)."""
    before = np.empty_like(ts)
    before[0] = np.iinfo(np.int64).min
    before[1:] = np.maximum.accumulate(ts)[:-1]
    return np.where(before > ts, before - ts, 0)


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    kw = dict(events=5_000, keys=100, partitions=3, late_fraction=0.01, bad_fraction=0.01)
    a = generate(tmp_path / "a", seed=7, **kw)
    b = generate(tmp_path / "b", seed=7, **kw)
    c = generate(tmp_path / "c", seed=8, **kw)
    assert [p.name for p in a] == ["p0.jsonl", "p1.jsonl", "p2.jsonl"]
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert [p.read_bytes() for p in a] != [p.read_bytes() for p in c]


def test_counts_and_record_shape(tmp_path: Path) -> None:
    paths = generate(tmp_path, events=10_001, keys=50, partitions=4)
    lines = [p.read_text().splitlines() for p in paths]
    assert [len(x) for x in lines] == partition_sizes(10_001, 4) == [2501, 2500, 2500, 2500]
    first = json.loads(lines[0][0])
    assert list(first) == ["user", "ts", "amount"]
    assert isinstance(first["ts"], int) and isinstance(first["amount"], float)
    df = pl.concat([_read_jsonl(p) for p in paths])
    assert df["user"].str.contains(r"^u\d{5}$").all()
    assert df["user"].n_unique() <= 50
    # Skewed: the hottest key is u00000 and well above the uniform share.
    top = df["user"].value_counts(sort=True).row(0)
    assert top[0] == "u00000" and top[1] > 2 * len(df) / 50
    assert (df["ts"] >= 1_700_000_000_000).all()
    assert (df["amount"] > 0).all()


def test_uniform_and_integer_amounts(tmp_path: Path) -> None:
    (p,) = generate(tmp_path, events=20_000, keys=10, skew=0.0, float_amounts=False)
    recs = [json.loads(line) for line in p.read_text().splitlines()]
    assert all(isinstance(r["amount"], int) for r in recs)
    counts = pl.Series([r["user"] for r in recs]).value_counts()["count"]
    assert counts.min() > 1_500 and counts.max() < 2_500


@pytest.mark.parametrize("disorder_ms", [0, 1, 800, 5_000])
def test_disorder_bound_holds(tmp_path: Path, disorder_ms: int) -> None:
    paths = generate(tmp_path, events=30_000, keys=100, partitions=2, disorder_ms=disorder_ms)
    for p in paths:
        ts = _read_jsonl(p)["ts"].to_numpy()
        gaps = _gap_below_running_max(ts)
        assert gaps.max() <= disorder_ms
        if disorder_ms >= 800:
            assert gaps.max() > disorder_ms * 0.9  # the bound is actually used
        assert ts[-1] - ts[0] > 5_000  # about 1000 events per second per partition


def test_late_events_exact_count_and_distance(tmp_path: Path) -> None:
    paths = generate(
        tmp_path, events=20_000, keys=100, partitions=2, late_fraction=0.05, late_by_ms=120_000
    )
    late = 0
    for p in paths:
        gaps = _gap_below_running_max(_read_jsonl(p)["ts"].to_numpy())
        on_time = gaps <= 800
        assert (gaps[~on_time] >= 120_000).all()
        assert (gaps[~on_time] <= 120_800).all()
        late += int((~on_time).sum())
    assert late == 1_000


def test_late_events_are_late_for_a_tumbling_window(tmp_path: Path) -> None:
    """Reference check of the documented guarantee with the semantics' watermark."""
    size, max_delay = 60_000, 1_000
    (p,) = generate(tmp_path, events=20_000, keys=10, late_fraction=0.02, late_by_ms=61_000)
    ts = _read_jsonl(p)["ts"].to_numpy()
    before = np.empty_like(ts)
    before[0] = np.iinfo(np.int64).min // 2
    before[1:] = np.maximum.accumulate(ts)[:-1]
    end = (ts // size + 1) * size
    is_late = end <= before - max_delay
    assert int(is_late.sum()) == 400


def test_bad_records(tmp_path: Path) -> None:
    paths = generate(tmp_path, events=3_000, keys=10, partitions=3, bad_fraction=0.1)
    reasons = {"invalid": 0, "no_ts": 0, "amount": 0}
    good = 0
    for p in paths:
        for line in p.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                reasons["invalid"] += 1
                continue
            if "ts" not in rec:
                reasons["no_ts"] += 1
            elif not isinstance(rec["amount"], int | float):
                reasons["amount"] += 1
            else:
                good += 1
    assert reasons == {"invalid": 100, "no_ts": 100, "amount": 100}
    assert good == 2_700


def test_csv_and_parquet(tmp_path: Path) -> None:
    csv = generate(tmp_path / "c", events=1_000, keys=10, partitions=2, fmt="csv")
    assert csv[0].name == "p0.csv"
    assert csv[0].read_text().splitlines()[0] == "user,ts,amount"
    df = pl.read_csv(csv[0])
    assert df.height == 500 and df.schema["ts"] == pl.Int64
    pq = generate(tmp_path / "q", events=1_000, keys=10, fmt="parquet", bad_fraction=0.03)
    table = pl.read_parquet(pq[0])
    assert table.height == 1_000
    assert table.schema == {"user": pl.String, "ts": pl.Int64, "amount": pl.Float64}
    assert table.filter(pl.col("ts").is_null() | pl.col("user").is_null()).height == 30
    # Same events as the JSONL rendering of the same seed.
    js = _read_jsonl(generate(tmp_path / "j", events=1_000, keys=10)[0])
    ref = pl.read_parquet(generate(tmp_path / "q2", events=1_000, keys=10, fmt="parquet")[0])
    assert js.equals(ref)


def test_large_generation_is_vectorised(tmp_path: Path) -> None:
    import time

    t0 = time.perf_counter()
    paths = generate(tmp_path, events=300_000, keys=10_000, partitions=3)
    assert time.perf_counter() - t0 < 5
    assert sum(p.stat().st_size for p in paths) > 300_000 * 40


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fmt"):
        generate(tmp_path, events=1, keys=1, fmt="xml")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="late_fraction"):
        generate(tmp_path, events=1, keys=1, late_fraction=2.0)


def test_write_spec_roundtrip(tmp_path: Path) -> None:
    from sealstream.pipeline import Session, Sliding, Tumbling, load_spec

    paths = generate(tmp_path / "in", events=100, keys=5, partitions=2)
    spec = write_spec(
        tmp_path / "job.toml",
        paths=paths,
        name='pay "ments" \\ ü',
        max_delay_ms=1_000,
        allowed_lateness_ms=500,
        aggregates={"n": "count", "total": "sum(amount)", "a.vg": "mean(amount)"},
        sink="out",
        late="late",
        errors=tmp_path / "errors",
        checkpoint="ckpt",
        checkpoint_every_ms=1_000,
        checkpoint_every_events=10_000,
    )
    data = tomllib.loads(spec.read_text())
    assert data["pipeline"]["name"] == 'pay "ments" \\ ü'
    assert data["source"] == {
        "kind": "jsonl",
        "paths": ["in/p0.jsonl", "in/p1.jsonl"],
        "key": "user",
        "time": "ts",
    }
    assert data["window"] == {"kind": "tumbling", "size_ms": 60_000, "allowed_lateness_ms": 500}
    assert data["aggregates"]["a.vg"] == "mean(amount)"
    assert data["errors"] == {"kind": "jsonl", "path": "errors"}
    assert data["checkpoint"] == {"path": "ckpt", "every_events": 10_000, "every_ms": 1_000}

    p = load_spec(spec)
    assert isinstance(p.window, Tumbling) and p.window.allowed_lateness_ms == 500
    assert [n for n, _ in p.source.partitions()] == ["in/p0.jsonl", "in/p1.jsonl"]
    assert p.watermark.max_delay_ms == 1_000
    assert p.checkpoint is not None and p.checkpoint.every_ms == 1_000
    assert p.late is not None and p.late.resolved == tmp_path.resolve() / "late"

    s2 = write_spec(
        tmp_path / "sub" / "s.toml",
        paths=[str(paths[0].resolve())],
        window="sliding",
        size_ms=10_000,
        slide_ms=2_000,
        sink={"kind": "parquet", "path": "o"},
    )
    p2 = load_spec(s2)
    assert isinstance(p2.window, Sliding) and p2.window.slide_ms == 2_000
    assert p2.sink.kind == "parquet" and p2.checkpoint is None and p2.late is None
    s3 = write_spec(tmp_path / "s3.toml", paths=paths, window="session", gap_ms=5_000)
    p3 = load_spec(s3)
    assert isinstance(p3.window, Session) and p3.window.gap_ms == 5_000


def test_toml_dumps_quotes_everything() -> None:
    text = toml_dumps(
        {"a b": {"x.y": "tab\there\x7f\x01", "f": 1.5, "t": True, "l": [1, "two"], "n": None}}
    )
    assert tomllib.loads(text) == {
        "a b": {"x.y": "tab\there\x7f\x01", "f": 1.5, "t": True, "l": [1, "two"]}
    }


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sealstream.testing.datagen import main

    assert main([str(tmp_path), "--events", "10", "--partitions", "2", "--fmt", "csv"]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "p0.csv"), str(tmp_path / "p1.csv")]
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--bad-fraction", "3"])
