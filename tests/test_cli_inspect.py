"""``sealstream checkpoints inspect|diff|export|prune`` on real checkpoints.

Every checkpoint here was written by a real run (``sealstream run`` in a
subprocess, SIGKILLed by ``SEALSTREAM_CRASH_AT`` right after its 4th checkpoint,
so open windows are left behind), then copied per test and, where the story
needs it, damaged the way a disk or a crash damages it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from sealstream.checkpoint.manifest import KEY_ENV, seal
from sealstream.checkpoint.stores import LocalCheckpointStore
from sealstream.cli import main

T0 = 1_700_000_000_000
KEYS: list[int | str] = [1, "a", 2, "b"]
EVENTS = 240
WINDOW_MS = 1000
TUMBLING = f'kind = "tumbling"\nsize_ms = {WINDOW_MS}'
SESSION = 'kind = "session"\ngap_ms = 300'


# --------------------------------------------------------------------------- the story
def _amount(k: int | str, i: int) -> int | float | None:
    if k == 1:
        return i % 7  # integers only: sums stay integers
    if k == "a":
        return i * 0.5  # floats only
    if k == 2:
        return None if i % 3 == 0 else i % 5  # integers and nulls
    return float(i % 4) if i % 2 else i % 4  # integers and floats mixed


def make_inputs(d: Path) -> list[str]:
    """Two partitions, in order (no late events), keys 1, "a", 2, "b" in turn."""
    (d / "in").mkdir(parents=True)
    names = []
    for p in range(2):
        lines = []
        for i in range(EVENTS):
            k = KEYS[(i + p) % len(KEYS)]
            lines.append(json.dumps({"k": k, "ts": T0 + i * 50 + p * 7, "amount": _amount(k, i)}))
        name = f"in/p{p}.jsonl"
        (d / name).write_text("\n".join(lines) + "\n")
        names.append(name)
    return names


def write_spec(d: Path, names: list[str], window: str) -> Path:
    spec = d / "spec.toml"
    spec.write_text(f"""
[pipeline]
name = "inspect-story"
batch_size = 50

[source]
kind = "jsonl"
paths = {json.dumps(names)}
key = "k"
time = "ts"

[watermark]
max_delay_ms = 200

[window]
{window}

[aggregates]
n = "count"
total = "sum(amount)"
avg = "mean(amount)"
lo = "min(amount)"
hi = "max(amount)"
first_amount = "first(amount)"
last_amount = "last(amount)"

[sink]
kind = "jsonl"
path = "out"

[checkpoint]
path = "ckpt"
every_events = 100
keep = 10
""")
    return spec


def run(spec: Path, crash_at: str | None, key: str | None = None) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("SEALSTREAM_CRASH_AT", KEY_ENV)}
    if crash_at:
        env["SEALSTREAM_CRASH_AT"] = crash_at
    if key:
        env[KEY_ENV] = key
    res = subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                         env=env, capture_output=True, text=True, timeout=120)
    if crash_at:
        assert res.returncode == -9, res.stderr  # SIGKILLed at the crash point
    else:
        assert res.returncode == 0, res.stderr


def story(d: Path, *, window: str = TUMBLING, crash_at: str = "after_retention:4",
          key: str | None = None) -> Path:
    spec = write_spec(d, make_inputs(d), window)
    run(spec, crash_at, key)
    return d


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return story(tmp_path_factory.mktemp("base"))


@pytest.fixture
def job(base: Path, tmp_path: Path) -> Path:
    """A private copy of the story (input, spec, output, checkpoints)."""
    d = tmp_path / "job"
    shutil.copytree(base, d)
    return d


@pytest.fixture(autouse=True)
def _no_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(KEY_ENV, raising=False)
    yield


def cli_json(capsys: pytest.CaptureFixture[str], *args: str, rc: int = 0) -> Any:
    got = main(["checkpoints", *args, "--json"])
    out, err = capsys.readouterr()
    assert got == rc, err
    assert "Traceback" not in err
    return json.loads(out)


def cli_error(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = main(["checkpoints", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sealstream: error: "), err
    return rc, lines[0]


def cp(d: Path, cid: int) -> Path:
    return d / "ckpt" / f"cp-{cid:012d}"


def ids_on_disk(d: Path) -> list[int]:
    return LocalCheckpointStore(d / "ckpt").ids()


def flip_byte(path: Path) -> None:
    """Corrupt a file without changing its size (a HASH_MISMATCH, not a truncation)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


# --------------------------------------------------------------------------- recomputation
def expected_windows(d: Path, positions: dict[str, int]) -> dict[tuple[Any, int], dict[str, Any]]:
    """Recompute every window's partial aggregates from the input consumed up to
    ``positions`` (no event of the story is late, so nothing is dropped)."""
    acc: dict[tuple[Any, int], list[tuple[int, Any]]] = {}
    for name, upto in positions.items():
        for line in (d / name).read_text().splitlines()[:upto]:
            rec = json.loads(line)
            start = rec["ts"] - rec["ts"] % WINDOW_MS
            acc.setdefault((rec["k"], start), []).append((rec["ts"], rec["amount"]))
    out = {}
    for ident, events in acc.items():
        values = [v for _, v in sorted(events, key=lambda e: e[0]) if v is not None]
        total: Any = None
        if values:
            total = sum(values)
            total = float(total) if any(isinstance(v, float) for v in values) else total
        out[ident] = {
            "n": len(events),
            "total": total,
            "avg": sum(values) / len(values) if values else None,
            "lo": min(values) if values else None,
            "hi": max(values) if values else None,
            "first_amount": values[0] if values else None,
            "last_amount": values[-1] if values else None,
        }
    return out


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return type(a) is type(b) and math.isclose(a, b, rel_tol=1e-12)
    return type(a) is type(b) and a == b


# --------------------------------------------------------------------------- inspect
def test_story_left_open_windows_behind(base: Path) -> None:
    assert ids_on_disk(base) == [1, 2, 3, 4]
    for cid in (1, 2, 3, 4):
        doc = json.loads((cp(base, cid) / "MANIFEST.json").read_text())
        assert doc["state"]["open_windows"] > 0
        assert not any(doc["watermark"]["exhausted"])


def test_inspect_defaults_to_newest(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = cli_json(capsys, "inspect", str(job / "ckpt"))
    doc = json.loads((cp(job, 4) / "MANIFEST.json").read_text())
    assert data["id"] == 4 and data["complete"] is True
    assert (data["verdict"], data["reason"]) == ("ATOMIC_CHECKPOINT", "OK")
    assert data["pipeline"] == "inspect-story" and data["fingerprint"] == doc["fingerprint"]
    assert data["format"] == 1 and data["state_format"] == 1
    assert data["parent"] == 3 and data["epoch"] == doc["epoch"]
    assert data["signer"] == {"alg": "sha256", "keyed": False, "key_set": False,
                              "description": data["signer"]["description"]}
    assert "unkeyed" in data["signer"]["description"]
    assert 0 <= data["age_ms"] < 3_600_000
    assert data["created_iso"].endswith("Z")
    # positions and watermarks per partition, in the manifest's order
    parts = data["partitions"]
    assert [p["partition"] for p in parts] == ["in/p0.jsonl", "in/p1.jsonl"]
    assert [p["next_offset"] for p in parts] == [p["next_offset"] for p in doc["positions"]]
    assert [p["watermark_ms"] for p in parts] == doc["watermark"]["partition_ms"]
    assert all(p["watermark_iso"].startswith("2023-11-14T") for p in parts)
    assert data["watermark"]["global_ms"] == doc["watermark"]["global_ms"]
    assert data["watermark"]["global_ms"] == min(p["watermark_ms"] for p in parts)
    assert data["watermark"]["global_iso"].endswith("Z")
    # open windows: read from the state itself, consistent with the manifest
    w = data["windows"]
    assert w["read"] is True and w["kind"] == "tumbling"
    assert w["open"] == w["open_recorded"] == doc["state"]["open_windows"] > 0
    assert w["keys"] == len(KEYS)
    assert w["oldest_start_ms"] % WINDOW_MS == 0
    assert w["oldest_start_ms"] + WINDOW_MS > data["watermark"]["global_ms"]
    assert data["state"]["bytes"] == (cp(job, 4) / "state.arrow").stat().st_size
    # receipts: totals and the last epoch's counts
    r = data["receipts"]
    assert r["totals"]["results"] == doc["receipts"]["results"] > 0
    receipts = json.loads((cp(job, 4) / "receipts.json").read_text())["epochs"][-1]
    assert r["last_epoch"]["epoch"] == doc["epoch"]
    assert r["last_epoch"]["results"] == receipts["results"]["count"]
    assert data["counters"]["events"] == doc["counters"]["events"]
    assert data["problems"] == []
    # receipt_ids: the epoch's result ids, the leaves of its Merkle receipt (when it has any)
    assert {f["role"] for f in data["files"]} == (
        {"state", "receipts", "receipt_ids"} if receipts["results"]["count"]
        else {"state", "receipts"})
    assert all(f["sha256_ok"] for f in data["files"])


def test_inspect_by_id_and_table(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_json(capsys, "inspect", str(job / "ckpt"), "2")["id"] == 2
    assert cli_json(capsys, "inspect", str(job / "ckpt"), "cp-000000000003")["id"] == 3
    assert main(["checkpoints", "inspect", str(job / "ckpt"), "1"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    for needle in ("checkpoint 1", "ATOMIC_CHECKPOINT", "in/p0.jsonl", "open windows",
                   "tumbling", "sha256 (unkeyed"):
        assert needle in out, needle


def test_inspect_corrupt_state(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flip_byte(cp(job, 4) / "state.arrow")
    data = cli_json(capsys, "inspect", str(job / "ckpt"))
    assert (data["verdict"], data["reason"]) == ("INCONSISTENT_STATE", "HASH_MISMATCH")
    # what the manifest says is still shown; the damaged state is not parsed
    assert data["windows"]["read"] is False
    assert data["windows"]["open"] == data["windows"]["open_recorded"] > 0
    assert data["state"]["read"] is False and "SHA-256" in data["state"]["error"]
    assert [p["next_offset"] for p in data["partitions"]] != [None, None]
    state = next(f for f in data["files"] if f["role"] == "state")
    assert state["sha256_ok"] is False
    assert main(["checkpoints", "inspect", str(job / "ckpt")]) == 0
    out, _ = capsys.readouterr()
    assert "HASH_MISMATCH" in out and "mismatch" in out


@pytest.mark.parametrize("what", ["FIFO", "symlink"])
def test_inspect_a_state_that_is_not_a_regular_file(
        job: Path, capsys: pytest.CaptureFixture[str], what: str) -> None:
    """inspect shows the guard's verdict on a checkpoint whose state is a FIFO or a
    symbolic link, as for any other damage, instead of failing (exit 1) on it."""
    state = cp(job, 4) / "state.arrow"
    if what == "FIFO":
        state.unlink()
        os.mkfifo(state)
    else:
        moved = job / "elsewhere.arrow"
        state.rename(moved)
        state.symlink_to(moved)
    data = cli_json(capsys, "inspect", str(job / "ckpt"), "4")
    assert (data["verdict"], data["reason"]) == ("INCONSISTENT_STATE", "NOT_A_REGULAR_FILE")
    assert data["state"]["read"] is False and "cannot be read" in data["state"]["error"]
    entry = next(f for f in data["files"] if f["role"] == "state")
    assert entry["bytes"] is None and entry["sha256_ok"] is None


def test_inspect_truncated_manifest(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = cp(job, 4) / "MANIFEST.json"
    m.write_bytes(m.read_bytes()[:100])
    data = cli_json(capsys, "inspect", str(job / "ckpt"), "4")
    assert (data["verdict"], data["reason"]) == ("PARTIAL_CHECKPOINT_REJECT",
                                                 "MANIFEST_UNREADABLE")
    assert data["complete"] is False and data["pipeline"] is None
    assert data["windows"]["open"] is None and data["windows"]["read"] is False
    # the state and receipts, and the receipt ids of an epoch with results
    assert {f["path"] for f in data["files"]} - {"cp-000000000004/receipt-ids.arrow"} == {
        "cp-000000000004/state.arrow", "cp-000000000004/receipts.json"}
    assert data["state"]["bytes"] == (cp(job, 4) / "state.arrow").stat().st_size
    assert data["problems"]
    assert main(["checkpoints", "inspect", str(job / "ckpt"), "4"]) == 0
    out, _ = capsys.readouterr()
    assert "MANIFEST_UNREADABLE" in out


def test_inspect_crashed_writer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A writer killed before publishing its manifest leaves a partial checkpoint."""
    d = story(tmp_path / "job", crash_at="before_manifest_publish:3")
    assert ids_on_disk(d) == [1, 2, 3]
    data = cli_json(capsys, "inspect", str(d / "ckpt"))
    assert data["id"] == 3
    assert (data["verdict"], data["reason"]) == ("PARTIAL_CHECKPOINT_REJECT", "NO_MANIFEST")
    roles = {f["path"].split("/")[1]: f["role"] for f in data["files"]}
    roles.pop("receipt-ids.arrow", None)  # written when the epoch has results
    assert roles == {"state.arrow": "unrecorded", "receipts.json": "unrecorded",
                     ".MANIFEST.json.tmp": "staging"}
    assert data["state"]["bytes"] > 0 and data["windows"]["open"] is None
    assert data["partitions"] == []
    # the older ones are fine
    assert cli_json(capsys, "inspect", str(d / "ckpt"), "2")["verdict"] == "ATOMIC_CHECKPOINT"


# --------------------------------------------------------------------------- diff
def test_diff_what_advanced(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = cli_json(capsys, "inspect", str(job / "ckpt"), "1")
    b = cli_json(capsys, "inspect", str(job / "ckpt"), "4")
    data = cli_json(capsys, "diff", str(job / "ckpt"), "1", "4")
    assert data["a"]["id"] == 1 and data["b"]["id"] == 4 and data["same_pipeline"]
    for p, pa, pb in zip(data["partitions"], a["partitions"], b["partitions"], strict=True):
        assert p["next_offset"] == [pa["next_offset"], pb["next_offset"]]
        assert p["delta"] == pb["next_offset"] - pa["next_offset"] > 0
        assert p["watermark_delta_ms"] == pb["watermark_ms"] - pa["watermark_ms"] > 0
    wm = data["watermark"]
    assert wm["delta_ms"] == b["watermark"]["global_ms"] - a["watermark"]["global_ms"] > 0
    w = data["windows"]
    assert w["open"] == [a["windows"]["open"], b["windows"]["open"]]
    assert w["extended"] == 0  # tumbling windows never change identity
    assert w["open"][0] - w["closed"] + w["opened"] == w["open"][1]
    assert w["closed"] > 0 and w["opened"] > 0 and w["still_open"] == w["open"][0] - w["closed"]
    # every window open in A and gone in B fired, so it was emitted (plus windows
    # that opened and fired in between)
    emitted = b["receipts"]["totals"]["results"] - a["receipts"]["totals"]["results"]
    assert data["emitted"]["results"] == emitted >= w["closed"]
    assert data["counters"]["windows_fired"]["delta"] == emitted
    assert data["counters"]["events"]["delta"] == sum(p["delta"] for p in data["partitions"])
    sb = data["state_bytes"]
    assert sb["delta"] == sb["b"] - sb["a"] and sb["a"] == a["state"]["bytes"]
    # readable form
    assert main(["checkpoints", "diff", str(job / "ckpt"), "1", "4"]) == 0
    out, _ = capsys.readouterr()
    assert "opened" in out and "in/p1.jsonl" in out


def test_diff_sessions_extend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every key's session keeps growing: no session closes or opens between 1 and 4."""
    d = story(tmp_path / "job", window=SESSION)
    data = cli_json(capsys, "diff", str(d / "ckpt"), "1", "4")
    w = data["windows"]
    assert w["open"] == [len(KEYS), len(KEYS)]
    assert (w["extended"], w["opened"], w["closed"], w["still_open"]) == (len(KEYS), 0, 0, 0)
    assert cli_json(capsys, "inspect", str(d / "ckpt"))["windows"]["kind"] == "session"


def test_diff_refuses_unverifiable_state(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flip_byte(cp(job, 2) / "state.arrow")
    rc, line = cli_error(capsys, "diff", str(job / "ckpt"), "2", "4")
    assert rc == 1 and "cannot diff" in line and "checkpoint 2" in line
    (cp(job, 3) / "state.arrow").unlink()
    rc, line = cli_error(capsys, "diff", str(job / "ckpt"), "1", "3")
    assert rc == 1 and "checkpoint 3" in line and "missing" in line


# --------------------------------------------------------------------------- export
def test_export_is_the_partial_state(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    info = cli_json(capsys, "inspect", str(job / "ckpt"))
    out = job / "open.jsonl"
    exported = cli_json(capsys, "export", str(job / "ckpt"), "--to", str(out))
    assert exported["rows"] == info["windows"]["open"] and exported["forced"] is False
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == info["windows"]["open"]
    positions = {p["partition"]: p["next_offset"] for p in info["partitions"]}
    expected = expected_windows(job, positions)
    assert {type(r["key"]) for r in rows} == {int, str}  # key is an int when it was one
    for r in rows:
        assert r["window_end"] - r["window_start"] == WINDOW_MS
        want = expected[(r["key"], r["window_start"])]
        for name, value in want.items():
            assert same(r[name], value), (r, name, value)
    ints = [r for r in rows if r["key"] == 1 and r["total"] is not None]
    assert ints and all(isinstance(r["total"], int) for r in ints)  # no float seen: int
    floats = [r for r in rows if r["key"] == "a" and r["total"] is not None]
    assert floats and all(isinstance(r["total"], float) for r in floats)

    pq = job / "open.parquet"
    assert cli_json(capsys, "export", str(job / "ckpt"), "4", "--to", str(pq))["rows"] == len(rows)
    table = pl.read_parquet(pq)
    assert table.height == len(rows)
    assert table.columns[:3] == ["key", "window_start", "window_end"]
    assert {"n", "total", "avg", "lo", "hi", "first_amount", "last_amount"} <= set(table.columns)
    assert table["n"].sum() == sum(r["n"] for r in rows)
    # readable form names the file
    before = out.read_bytes()
    rc, line = cli_error(capsys, "export", str(job / "ckpt"), "2", "--to", str(out))
    assert rc == 2 and "--replace" in line and out.read_bytes() == before  # not replaced
    assert main(["checkpoints", "export", str(job / "ckpt"), "2", "--to", str(out),
                 "--replace"]) == 0
    text, _ = capsys.readouterr()
    assert "open.jsonl" in text
    n2 = cli_json(capsys, "inspect", str(job / "ckpt"), "2")["windows"]["open"]
    assert len(out.read_text().splitlines()) == n2


def test_export_only_atomic(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flip_byte(cp(job, 4) / "state.arrow")
    out = job / "x.jsonl"
    rc, line = cli_error(capsys, "export", str(job / "ckpt"), "--to", str(out))
    assert rc == 1 and "INCONSISTENT_STATE" in line and "--force" in line
    # forcing cannot make damaged bytes readable
    rc, line = cli_error(capsys, "export", str(job / "ckpt"), "--to", str(out), "--force")
    assert rc == 1 and "SHA-256" in line
    assert not out.exists()
    rc, line = cli_error(capsys, "export", str(job / "ckpt"), "--to", str(job / "x.csv"))
    assert rc == 2 and ".parquet or .jsonl" in line
    inside = cp(job, 3) / "open.jsonl"
    rc, line = cli_error(capsys, "export", str(job / "ckpt"), "3", "--to", str(inside),
                         "--replace")
    assert rc == 2 and "inside the checkpoint directory" in line and not inside.exists()


def test_keyed_checkpoints(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                           monkeypatch: pytest.MonkeyPatch) -> None:
    d = story(tmp_path / "job", key="s3cret")
    ckpt = str(d / "ckpt")
    # without the key: signed but not verifiable
    data = cli_json(capsys, "inspect", ckpt)
    assert (data["verdict"], data["reason"]) == ("INCONSISTENT_STATE", "SIGNED_WITHOUT_KEY")
    assert data["signer"]["alg"] == "hmac-sha256" and data["signer"]["keyed"] is True
    assert data["windows"]["read"] is True  # the state matches its manifest hash
    rc, line = cli_error(capsys, "export", ckpt, "--to", str(d / "x.jsonl"))
    assert rc == 1 and "SIGNED_WITHOUT_KEY" in line
    forced = cli_json(capsys, "export", ckpt, "--to", str(d / "x.jsonl"), "--force")
    assert forced["forced"] is True and forced["rows"] == data["windows"]["open"]
    rc, line = cli_error(capsys, "diff", ckpt, "1", "2")
    assert rc == 1 and "SIGNED_WITHOUT_KEY" in line
    # prune touches nothing when nothing verifies (a missing key must not destroy)
    before = ids_on_disk(d)
    assert main(["checkpoints", "prune", ckpt, "--keep", "1"]) == 1
    capsys.readouterr()
    assert ids_on_disk(d) == before and not (d / "ckpt" / "rejected").exists()
    # with the key
    monkeypatch.setenv(KEY_ENV, "s3cret")
    data = cli_json(capsys, "inspect", ckpt)
    assert data["verdict"] == "ATOMIC_CHECKPOINT" and data["signer"]["key_set"] is True
    assert cli_json(capsys, "diff", ckpt, "1", "4")["windows"]["open"][1] == \
        data["windows"]["open"]


# --------------------------------------------------------------------------- prune
def test_prune_keeps_n_newest(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = str(job / "ckpt")
    plan = cli_json(capsys, "prune", ckpt, "--keep", "2", "--dry-run")
    assert plan["dry_run"] is True and plan["deleted"] == [1, 2] and plan["kept"] == [3, 4]
    assert ids_on_disk(job) == [1, 2, 3, 4]  # a dry run changes nothing
    done = cli_json(capsys, "prune", ckpt, "--keep", "2")
    assert done["kept"] == [3, 4] and done["deleted"] == [1, 2] and done["moved"] == []
    assert done["newest_atomic"] == 4 and done["job_running"] is None
    assert ids_on_disk(job) == [3, 4]
    assert sorted(p.name for p in (job / "ckpt").iterdir()) == [
        "LOCK", "cp-000000000003", "cp-000000000004"]
    verified = cli_json(capsys, "verify", ckpt)
    assert [c["verdict"] for c in verified["checkpoints"]] == ["ATOMIC_CHECKPOINT"] * 2
    # pruning again is a no-op; the readable form says what it kept
    assert main(["checkpoints", "prune", ckpt, "--keep", "2"]) == 0
    out, _ = capsys.readouterr()
    assert "kept 2 ATOMIC checkpoint(s): 3, 4" in out
    # the pruned job resumes from its newest checkpoint and finishes
    run(job / "spec.toml", None)
    final = cli_json(capsys, "inspect", ckpt)
    assert final["windows"]["open"] == 0 and final["windows"]["oldest_start_ms"] is None
    # finished: the watermark the data reached (semantics section 10), not +inf
    newest = [q["max_time_ms"] for q in final["partitions"]]
    assert final["watermark"]["global_ms"] == min(newest) - final["watermark"]["max_delay_ms"]
    # no partition stays ended: a later run may find more data in it
    assert all(not p["exhausted"] and p["watermark_ms"] == p["max_time_ms"]
               - final["watermark"]["max_delay_ms"] for p in final["partitions"])
    for name in ("final.jsonl", "final.parquet"):
        assert cli_json(capsys, "export", ckpt, "--to", str(job / name))["rows"] == 0
    assert (job / "final.jsonl").read_text() == ""
    assert pl.read_parquet(job / "final.parquet").height == 0


def test_prune_corrupt_newest(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flip_byte(cp(job, 4) / "state.arrow")
    done = cli_json(capsys, "prune", str(job / "ckpt"), "--keep", "1")
    assert done["kept"] == [3] and done["newest_atomic"] == 3 and done["deleted"] == [1, 2]
    assert [(m["id"], m["verdict"], m["reason"]) for m in done["moved"]] == [
        (4, "INCONSISTENT_STATE", "HASH_MISMATCH")]
    assert ids_on_disk(job) == [3]
    moved = job / "ckpt" / done["moved"][0]["to"]
    assert moved.parent.name == "rejected" and moved.name.startswith("cp-000000000004-HASH_")
    assert (moved / "state.arrow").is_file() and (moved / "MANIFEST.json").is_file()


def test_prune_while_a_job_holds_the_lock(job: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    flip_byte(cp(job, 4) / "state.arrow")  # newer than the newest ATOMIC: maybe being written
    (cp(job, 2) / "receipts.json").unlink()  # files missing: maybe being deleted by the job
    store = LocalCheckpointStore(job / "ckpt")
    with store.locked():
        plan = cli_json(capsys, "prune", str(job / "ckpt"), "--keep", "1", "--dry-run")
        assert plan["job_running"] is not None
        done = cli_json(capsys, "prune", str(job / "ckpt"), "--keep", "1")
        assert main(["checkpoints", "prune", str(job / "ckpt"), "--keep", "1"]) == 0
        out, _ = capsys.readouterr()
    assert "a job holds the directory" in out
    assert done["job_running"] is not None and "pid" in done["job_running"]
    assert done["kept"] == [3] and done["newest_atomic"] == 3
    assert done["deleted"] == [] and done["moved"] == []
    why = {u["id"]: u["why"] for u in done["untouched"]}
    assert sorted(why) == [1, 2, 4]
    assert "oldest" in why[1] and "NO_RECEIPTS" in why[2] and "newer" in why[4]
    assert ids_on_disk(job) == [1, 2, 3, 4]
    assert plan["untouched"] == done["untouched"]
    # once the job is gone: older ATOMIC ones are deleted, invalid ones go to rejected/
    done = cli_json(capsys, "prune", str(job / "ckpt"), "--keep", "1")
    assert done["job_running"] is None and done["deleted"] == [1]
    assert [(m["id"], m["reason"]) for m in done["moved"]] == [(2, "NO_RECEIPTS"),
                                                               (4, "HASH_MISMATCH")]
    assert ids_on_disk(job) == [3]
    assert len(list((job / "ckpt" / "rejected").iterdir())) == 2


def test_prune_tolerates_concurrent_removal(job: Path) -> None:
    from sealstream.cli._prune import _apply
    from sealstream.inspect import plan_prune

    store = LocalCheckpointStore(job / "ckpt")
    flip_byte(cp(job, 3) / "state.arrow")
    plan = plan_prune(store, 1, job_running=True)
    assert plan.keep == [4] and plan.delete == [2] and [m[0] for m in plan.move] == [3]
    assert [u[0] for u in plan.untouched] == [1]  # the oldest: the job removes it next
    # the job's own retention removes 2 and moves 3 aside in between
    shutil.rmtree(cp(job, 2))
    store.move_aside(3, "superseded-invalid")
    done = _apply(store, plan, 1, holder="job")
    assert done["deleted"] == [] and done["moved"] == [] and done["vanished"] == [2, 3]
    assert ids_on_disk(job) == [1, 4]


def test_prune_keeps_referenced_files(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint whose directory holds a file a kept checkpoint names is not removed
    (as an incremental checkpoint names its base snapshot: the one kind of name that may
    point into an older checkpoint's directory)."""
    m = cp(job, 4) / "MANIFEST.json"
    body = json.loads(m.read_text())
    body.pop("signature")
    shared = cp(job, 1) / "state.arrow"
    body["files"]["base"] = {"path": "cp-000000000001/state.arrow",
                                 "sha256": hashlib.sha256(shared.read_bytes()).hexdigest(),
                                 "bytes": shared.stat().st_size}
    m.write_bytes(seal(body, None))
    assert cli_json(capsys, "inspect", str(job / "ckpt"))["verdict"] == "ATOMIC_CHECKPOINT"
    done = cli_json(capsys, "prune", str(job / "ckpt"), "--keep", "1")
    assert done["kept"] == [4] and done["deleted"] == [2, 3]
    assert done["untouched"] == [{"id": 1, "why": "holds files that checkpoint 4 references"}]
    assert ids_on_disk(job) == [1, 4]


# --------------------------------------------------------------------------- usage errors
@pytest.mark.parametrize("args", [
    ["inspect", "{missing}"],
    ["inspect", "{ckpt}", "9"],
    ["inspect", "{ckpt}", "nope"],
    ["diff", "{missing}", "1", "2"],
    ["diff", "{ckpt}", "1", "99"],
    ["export", "{missing}", "--to", "{tmp}/x.jsonl"],
    ["export", "{ckpt}", "7", "--to", "{tmp}/x.jsonl"],
    ["prune", "{missing}", "--keep", "1"],
])
def test_usage_errors_exit_2(job: Path, tmp_path: Path, args: list[str],
                             capsys: pytest.CaptureFixture[str]) -> None:
    fill = {"missing": str(tmp_path / "nowhere"), "ckpt": str(job / "ckpt"),
            "tmp": str(tmp_path)}
    rc, line = cli_error(capsys, *[a.format(**fill) for a in args])
    assert rc == 2
    assert "does not exist" in line or "not found" in line


def test_prune_keep_must_be_positive(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _ = cli_error(capsys, "prune", str(job / "ckpt"), "--keep", "0")
    assert rc == 2
    assert ids_on_disk(job) == [1, 2, 3, 4]


def test_empty_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, line = cli_error(capsys, "inspect", str(tmp_path))
    assert rc == 2 and "no checkpoints" in line
    done = cli_json(capsys, "prune", str(tmp_path), "--keep", "3")
    assert done["kept"] == [] and done["deleted"] == [] and done["newest_atomic"] is None
