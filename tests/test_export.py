"""``sealstream checkpoints export``: typed values, the spec's column order, a private
file, and a word when the export of an encrypted store is plaintext.

The checkpoints come from a real run (``sealstream run`` in a subprocess, SIGKILLed
right after its 2nd checkpoint, so windows are left open) over events whose fields
are strings, integers, floats, booleans and a mix of them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from sealstream.checkpoint.manifest import KEY_ENV
from sealstream.cli import main
from sealstream.inspect import typed_json

ENC_ENV = "SEALSTREAM_ENCRYPTION_KEY"
ENC_KEY = "11" * 32
T0 = 1_700_000_000_000
# deliberately not in name order: results (and exports) follow the spec's order
SPEC_ORDER = ["zcount", "last_path", "total", "b_mixed", "first_n", "avg", "a_flag"]
MIXED = [1, 2.5, "x", None, "1"]


def _events() -> list[dict[str, Any]]:
    out = []
    for i in range(240):
        out.append({
            "user": ["u1", "u2", 3][i % 3],
            "ts": T0 + i * 100,
            "path": ["/search", '/q"uote', "/é"][i % 3 if i % 2 else 0],
            "n": i * 10**9,  # integers, some beyond 32 bits
            "amount": i * 0.5,
            "v": MIXED[(i // 3) % len(MIXED)],
            "flag": i % 4 == 0,
        })
    return out


SPEC = """
[pipeline]
name = "export-story"
batch_size = 40

[source]
kind = "jsonl"
paths = ["in/p0.jsonl"]
key = "user"
time = "ts"

[watermark]
max_delay_ms = 0

[window]
kind = "tumbling"
size_ms = 1000000

[aggregates]
zcount = "count"
last_path = "last(path)"
total = "sum(amount)"
b_mixed = "last(v)"
first_n = "first(n)"
avg = "mean(amount)"
a_flag = "last(flag)"

[sink]
kind = "jsonl"
path = "out"

[checkpoint]
path = "ckpt"
every_events = 60
"""


def _story(d: Path, *, encrypted: bool) -> Path:
    (d / "in").mkdir(parents=True)
    (d / "in" / "p0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in _events()))
    (d / "spec.toml").write_text(SPEC)
    env = {k: v for k, v in os.environ.items()
           if k not in ("SEALSTREAM_CRASH_AT", KEY_ENV, ENC_ENV)}
    env["SEALSTREAM_CRASH_AT"] = "after_retention:2"
    if encrypted:
        env[ENC_ENV] = ENC_KEY
    res = subprocess.run([sys.executable, "-m", "sealstream", "run", str(d / "spec.toml"),
                          "--quiet"], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == -9, res.stderr  # SIGKILLed at the crash point
    return d


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _story(tmp_path_factory.mktemp("plain"), encrypted=False)


@pytest.fixture(scope="module")
def encrypted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _story(tmp_path_factory.mktemp("encrypted"), encrypted=True)


@pytest.fixture
def job(plain: Path, tmp_path: Path) -> Path:
    d = tmp_path / "job"
    shutil.copytree(plain, d)
    return d


@pytest.fixture(autouse=True)
def _no_keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(ENC_ENV, raising=False)
    yield


def export(capsys: pytest.CaptureFixture[str], d: Path, to: Path, *extra: str
           ) -> tuple[str, str]:
    rc = main(["checkpoints", "export", str(d / "ckpt"), "--to", str(to), *extra])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "Traceback" not in out + err
    return out, err


# --------------------------------------------------------------------------- order and types
def test_jsonl_export_follows_the_spec_order(job: Path, capsys: pytest.CaptureFixture[str]
                                              ) -> None:
    to = job / "open.jsonl"
    export(capsys, job, to)
    rows = [json.loads(line) for line in to.read_text().splitlines()]
    assert len(rows) == 3  # one open window per key
    for row in rows:
        assert list(row) == ["key", "window_start", "window_end", *SPEC_ORDER]
    by_key = {r["key"]: r for r in rows}
    assert set(by_key) == {"u1", "u2", 3}
    assert all(isinstance(r["last_path"], str) and not r["last_path"].startswith('"')
               for r in rows)
    assert all(type(r["first_n"]) is int and type(r["a_flag"]) is bool for r in rows)


def test_parquet_export_is_typed_and_follows_the_spec_order(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export(capsys, job, job / "open.jsonl")
    lines = [json.loads(x) for x in (job / "open.jsonl").read_text().splitlines()]
    export(capsys, job, job / "open.parquet")
    table = pl.read_parquet(job / "open.parquet")
    assert table.columns == ["key", "window_start", "window_end", *SPEC_ORDER]
    assert dict(table.schema) == {
        "key": pl.String, "window_start": pl.Int64, "window_end": pl.Int64,
        "zcount": pl.Int64, "last_path": pl.String, "total": pl.Float64,
        "b_mixed": pl.String, "first_n": pl.Int64, "avg": pl.Float64, "a_flag": pl.Boolean,
    }
    rows = {str(r["key"]): r for r in table.to_dicts()}
    for line in lines:
        got = rows[str(line["key"])]
        # strings as themselves (not JSON text '"/search"'), numbers and booleans typed
        for name in ("zcount", "last_path", "total", "first_n", "avg", "a_flag"):
            assert got[name] == line[name] and type(got[name]) is type(line[name]), name
        # a mixed column is text: strings as themselves, other values as JSON text
        want = line["b_mixed"]
        assert got["b_mixed"] == (want if isinstance(want, str) else json.dumps(want))
    assert {r["last_path"] for r in rows.values()} <= {"/search", '/q"uote', "/é"}


@pytest.mark.parametrize("texts, dtype, values", [
    (['"a"', None, '"/q\\"uote"', '"\\u00e9"'], pl.String, ["a", None, '/q"uote', "é"]),
    (["1", "-20", None, "null"], pl.Int64, [1, -20, None, None]),
    (["1", str(2**70)], pl.Float64, [1.0, float(2**70)]),
    (["1", "2.5", "1e-07"], pl.Float64, [1.0, 2.5, 1e-07]),
    (["true", "false", None], pl.Boolean, [True, False, None]),
    (['"x"', "1", "2.5", "true", '{"a":1}', None], pl.String,
     ["x", "1", "2.5", "true", '{"a":1}', None]),
    ([None, None], pl.String, [None, None]),
])
def test_typed_json_decisions(texts: list[str | None], dtype: pl.DataType,
                              values: list[Any]) -> None:
    got = typed_json(pl.Series("v", texts, dtype=pl.String))
    assert got.name == "v" and got.dtype == dtype
    assert got.to_list() == values


# --------------------------------------------------------------------------- a private file
@pytest.mark.parametrize("name", ["open.jsonl", "open.parquet"])
def test_export_is_written_0600(job: Path, capsys: pytest.CaptureFixture[str],
                                name: str) -> None:
    old = os.umask(0o022)
    try:
        to = job / name
        export(capsys, job, to)
        assert to.stat().st_mode & 0o777 == 0o600
        to.chmod(0o644)  # a replaced file does not keep a wider mode
        export(capsys, job, to, "--replace")
        assert to.stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


def test_plaintext_export_of_an_encrypted_store_says_so(
    encrypted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENC_ENV, ENC_KEY)
    to = tmp_path / "open.jsonl"
    out, err = export(capsys, encrypted, to)
    assert out.startswith("exported 3 open windows")
    assert err.splitlines() == [
        "note: the export is plaintext although the checkpoints are encrypted at rest "
        "(written with mode 0600): keep it as safe as the key"]
    assert to.stat().st_mode & 0o777 == 0o600
    assert json.loads(to.read_text().splitlines()[0])["zcount"] > 0  # plaintext indeed
    out, err = export(capsys, encrypted, tmp_path / "open.parquet", "--json")
    data = json.loads(out)
    assert data["note"].startswith("the export is plaintext") and data["mode"] == "0600"


def test_no_note_for_a_plaintext_store(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, err = export(capsys, job, job / "open.jsonl")
    assert err == "" and "export is plaintext" not in out
