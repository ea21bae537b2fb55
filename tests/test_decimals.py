"""Exact decimals: a field declared ``decimal(P, S)`` (``[source] types``) is read
exactly from JSON numbers and strings, CSV text and Parquet decimal columns; its
sum, min, max and mean are exact (checked against Python's ``decimal``), written
without float noise in every sink, and byte-identical across batch sizes, a SIGKILL
and resume (full and incremental checkpoints) and a replay."""

from __future__ import annotations

import json
from decimal import ROUND_HALF_UP, Decimal, localcontext
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scenarios._story import in_process, run, run_here
from sealstream.cli import main
from sealstream.testing.specs import files_source, spec_text

AGGS = {"n": "count", "total": "sum(amount)", "low": "min(amount)", "high": "max(amount)",
        "avg": "mean(amount)"}


def write_spec(d: Path, names: list[str], *, kind: str = "jsonl", types: str = "decimal(18, 2)",
               sink: str = 'kind = "jsonl"\npath = "out"', checkpoint: str | None = None,
               every_events: int | None = None, size_ms: int = 1000,
               max_delay_ms: int = 10**9, aggregates: dict[str, str] = AGGS) -> Path:
    spec = d / "spec.toml"
    source = files_source(names, kind) + f'\ntypes = {{amount = "{types}"}}'
    spec.write_text(spec_text("dec", source, window=f'kind = "tumbling"\nsize_ms = {size_ms}',
                              aggregates=aggregates, sink=sink, errors=True,
                              max_delay_ms=max_delay_ms, checkpoint=checkpoint,
                              every_events=every_events))
    return spec


def results_bytes(d: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(d.glob("part-*.jsonl")))


def results(d: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in results_bytes(d).decode().splitlines()]


def reference(events: list[tuple[str, int, Decimal | None]], scale: int,
              size_ms: int) -> dict[tuple[str, int], dict[str, Any]]:
    """Python's decimal: exact sums, min, max; the mean at scale max(S, 6), half up."""
    groups: dict[tuple[str, int], list[Decimal | None]] = {}
    for key, t, v in events:
        groups.setdefault((key, t - t % size_ms), []).append(v)
    out = {}
    mean_scale = Decimal(1).scaleb(-max(scale, 6))
    for ident, values in groups.items():
        vs = [v for v in values if v is not None]

        def fmt(d: Decimal, s: int = scale) -> str:
            return f"{d:.{s}f}"
        with localcontext() as ctx:
            ctx.prec = 80
            out[ident] = {
                "n": len(values),
                "total": fmt(sum(vs, Decimal(0))) if vs else None,
                "low": fmt(min(vs)) if vs else None,
                "high": fmt(max(vs)) if vs else None,
                "avg": fmt((sum(vs, Decimal(0)) / len(vs)).quantize(
                    mean_scale, rounding=ROUND_HALF_UP), max(scale, 6)) if vs else None,
            }
    return out


@st.composite
def decimal_events(draw: st.DrawFn) -> tuple[int, list[tuple[str, int, Decimal | None]],
                                             list[str]]:
    scale = draw(st.integers(0, 4))
    n = draw(st.integers(1, 60))
    events, lines = [], []
    for _ in range(n):
        key = draw(st.sampled_from(["a", "b", "c"]))
        t = draw(st.integers(0, 4999))
        units = draw(st.one_of(st.none(), st.integers(-(10**14), 10**14),
                               st.integers(-999, 999)))
        value = None if units is None else Decimal(units).scaleb(-scale)
        if value is None:
            written = "null"
        else:
            text = f"{value:.{scale}f}"
            pad = draw(st.sampled_from(["", "0", "00"])) if scale else ""
            text += ("." if not scale and pad else "") + pad  # trailing zeros still fit
            written = json.dumps(text) if draw(st.booleans()) else text
        events.append((key, t, value))
        lines.append(f'{{"user": "{key}", "ts": {t}, "amount": {written}}}')
    return scale, events, lines


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=decimal_events())
def test_decimal_aggregates_are_exact_and_the_same_at_every_batch_size(
        case: tuple[int, list[tuple[str, int, Decimal | None]], list[str]],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    scale, events, lines = case
    d = tmp_path_factory.mktemp("dec")
    (d / "in.jsonl").write_text("\n".join(lines) + "\n")
    spec = write_spec(d, ["in.jsonl"], types=f"decimal(18, {scale})")
    outputs = []
    for batch_size in (1, 3, 64):
        for sub in ("out", "errors"):
            for f in (d / sub).glob("*"):
                f.unlink()
        assert main(["run", str(spec), "--quiet", "--batch-size", str(batch_size)]) == 0
        outputs.append(results_bytes(d / "out"))
        assert not results_bytes(d / "errors")
    assert outputs[0] == outputs[1] == outputs[2]
    got = {(r["key"], r["window_start"]): {k: r[k] for k in AGGS} for r in results(d / "out")}
    assert got == reference(events, scale, 1000)


def test_json_csv_and_parquet_decimals_are_read_exactly_and_misfits_are_bad_records(
        tmp_path: Path) -> None:
    rows = [("a", 100, "12.50"), ("a", 200, "0.10"), ("a", 300, "123456789012345.67"),
            ("b", 400, "-0.01"), ("b", 500, "0.125"), ("b", 600, "1e3"), ("b", 700, "7")]
    (tmp_path / "in.jsonl").write_text("".join(
        f'{{"user": "{k}", "ts": {t}, "amount": {v}}}\n' for k, t, v in rows))
    (tmp_path / "in.csv").write_text("user,ts,amount\n" + "".join(
        f"{k},{t},{v}\n" for k, t, v in rows))
    good = [r for r in rows if r[2] not in ("0.125", "1e3")]
    pl.DataFrame({"user": [r[0] for r in good], "ts": [r[1] for r in good],
                  "amount": pl.Series([r[2] for r in good]).str.to_decimal(scale=2)
                  .cast(pl.Decimal(18, 2))}).write_parquet(tmp_path / "in.parquet")
    expected = [
        {"key": "a", "window_start": 0, "window_end": 1000, "n": 3,
         "total": "123456789012358.27", "low": "0.10", "high": "123456789012345.67",
         "avg": "41152263004119.423333"},
        {"key": "b", "window_start": 0, "window_end": 1000, "n": 2, "total": "6.99",
         "low": "-0.01", "high": "7.00", "avg": "3.495000"},
    ]
    for kind, line_of_first_bad in (("jsonl", 5), ("csv", 6), ("parquet", None)):
        d = tmp_path / kind
        d.mkdir()
        spec = write_spec(d, [str(tmp_path / f"in.{kind}")], kind=kind)
        assert main(["run", str(spec), "--quiet"]) == 0
        assert results(d / "out") == expected, kind
        bad = [json.loads(x) for x in results_bytes(d / "errors").decode().splitlines()]
        if line_of_first_bad is None:
            assert bad == []
            continue
        assert [(b["_line"], b["_reason"]) for b in bad] == [
            (line_of_first_bad, "field 'amount' does not fit decimal(18, 2) (never rounded): "
             "0.125"),
            (line_of_first_bad + 1, "field 'amount' is not a decimal number: 1e3"),
        ], kind


def _input(d: Path, events: int = 3000) -> list[str]:
    """Partitions of amounts whose float sums are noisy (0.1 + 0.2 ...)."""
    (d / "in").mkdir()
    names = []
    for p in range(3):
        lines = [json.dumps({"user": f"u{(i * 7 + p) % 5}", "ts": i * 37 + p,
                             "amount": f"{(i * 13 + p) % 1000}.{(i * 7) % 100:02d}"})
                 .replace('"amount": "', '"amount": ').replace('"}', "}")
                 for i in range(events)]
        (d / "in" / f"p{p}.jsonl").write_text("\n".join(lines) + "\n")
        names.append(f"in/p{p}.jsonl")
    return names


@pytest.mark.parametrize("incremental", [False, True])
def test_a_sigkilled_run_resumes_to_byte_identical_decimal_results(
        tmp_path: Path, incremental: bool) -> None:
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    for d in (whole, killed):
        d.mkdir()
        names = _input(d)
        write_spec(d, names, checkpoint='path = "ckpt"' + (
            "\nincremental = true\nfull_every = 3" if incremental else ""),
            every_events=700, max_delay_ms=2000)
    assert run_here(whole / "spec.toml").returncode == 0
    # killed after a checkpoint with open decimal windows was published, then resumed
    crashed = run(killed / "spec.toml", crash_at="after_manifest_publish:3")
    assert crashed.returncode == -9, crashed.stderr
    assert list((killed / "ckpt").glob("cp-*"))
    assert run_here(killed / "spec.toml").returncode == 0
    expected = results_bytes(whole / "out")
    assert b"e-" not in expected and b'"total":"' in expected
    assert results_bytes(killed / "out") == expected
    # a replay from the start writes the same bytes too
    res = in_process("replay", str(whole / "spec.toml"), "--from", "start", "--to",
                     str(tmp_path / "replay"), "--quiet")
    assert res.returncode == 0, res.stderr
    assert results_bytes(tmp_path / "replay" / "out") == expected


def test_typed_sinks_hold_exact_decimals(tmp_path: Path) -> None:
    names = [str(p) for p in (tmp_path / "x",)]
    (tmp_path / "x").write_text("".join(
        json.dumps({"user": "u", "ts": i, "amount": f"0.{i % 10}{(i * 3) % 10}"}) + "\n"
        for i in range(100)))
    for kind, sink in (("jsonl", 'kind = "jsonl"\npath = "out"'),
                       ("parquet", 'kind = "parquet"\npath = "out"'),
                       ("sqlite", 'kind = "sqlite"\nurl = "sqlite:///r.db"\ntable = "r"')):
        d = tmp_path / kind
        d.mkdir()
        assert main(["run", str(write_spec(d, names, sink=sink)), "--quiet"]) == 0
    frame = pl.read_parquet(next((tmp_path / "parquet" / "out").glob("*.parquet")))
    assert frame.schema["total"] == pl.Decimal(38, 2)
    assert frame.schema["low"] == pl.Decimal(18, 2)
    assert frame.schema["avg"] == pl.Decimal(38, 6)
    expected = results(tmp_path / "jsonl" / "out")[0]
    assert str(frame.get_column("total")[0]) == expected["total"]
    import sqlite3

    with sqlite3.connect(tmp_path / "sqlite" / "r.db") as conn:
        row = conn.execute("SELECT total, typeof(total), avg FROM r").fetchone()
    assert row == (expected["total"], "text", expected["avg"])
    jsonl = str(tmp_path / "jsonl" / "out")
    for other in (["--table-b", "r", str(tmp_path / "sqlite" / "r.db")],
                  [str(tmp_path / "parquet" / "out")]):
        assert main(["compare", jsonl, *other[-1:], *other[:-1], "--rel-tol", "0"]) == 0


def test_postgresql_holds_exact_decimals(tmp_path: Path, pg_url: str) -> None:
    import psycopg

    (tmp_path / "x").write_text("".join(
        json.dumps({"user": "u", "ts": i, "amount": f"{10**15 + i}.{i % 100:02d}"}) + "\n"
        for i in range(50)))
    (tmp_path / "j").mkdir()
    (tmp_path / "p").mkdir()
    names = [str(tmp_path / "x")]
    assert main(["run", str(write_spec(tmp_path / "j", names)), "--quiet"]) == 0
    sink = f'kind = "postgresql"\nurl = "{pg_url}"\ntable = "r"'
    assert main(["run", str(write_spec(tmp_path / "p", names, sink=sink)), "--quiet"]) == 0
    expected = results(tmp_path / "j" / "out")[0]
    with psycopg.connect(pg_url) as conn:
        total, avg = conn.execute("SELECT total::text, avg::text FROM r").fetchone()  # type: ignore[misc]
    assert (total, avg) == (expected["total"], expected["avg"])
    assert Decimal(total) == sum((Decimal(f"{10**15 + i}.{i % 100:02d}") for i in range(50)),
                                 Decimal(0))
    assert main(["compare", str(tmp_path / "j" / "out"), pg_url, "--table-b", "r",
                 "--rel-tol", "0"]) == 0


@pytest.mark.parametrize(("types", "aggregates", "words"), [
    ("float", AGGS, 'expected "decimal(P, S)"'),
    ("decimal(19, 2)", AGGS, "1 <= P <= 18"),
    ("decimal(4, 5)", AGGS, "0 <= S <= P"),
    ("decimal(18, 2)", {"f": "first(amount)"}, "first(amount) over the decimal field"),
])
def test_unsupported_declarations_are_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], types: str,
        aggregates: dict[str, str], words: str) -> None:
    (tmp_path / "x").write_text('{"user": "u", "ts": 1, "amount": 1}\n')
    spec = write_spec(tmp_path, [str(tmp_path / "x")], types=types, aggregates=aggregates)
    assert main(["run", str(spec)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


def test_open_decimal_windows_export_exactly(tmp_path: Path) -> None:
    names = _input(tmp_path, events=600)
    write_spec(tmp_path, names, checkpoint='path = "ckpt"', every_events=300,
               max_delay_ms=10**9)
    assert run(tmp_path / "spec.toml", crash_at="after_manifest_publish:1").returncode == -9
    assert main(["checkpoints", "export", str(tmp_path / "ckpt"), "--to",
                 str(tmp_path / "open.jsonl")]) == 0
    rows = [json.loads(x) for x in (tmp_path / "open.jsonl").read_text().splitlines()]
    assert rows and all(isinstance(r["total"], str) for r in rows)
    assert all(len(r["total"].split(".")[1]) == 2 and len(r["avg"].split(".")[1]) == 6
               for r in rows)
