"""`sealstream replay`: an interval re-run into an isolated destination, real runs
in subprocesses; the live outputs and checkpoints stay byte-identical."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scenarios._story import assert_same_output, committed, make_input, run, write_spec

LATENESS = 500


def replay(spec: Path, origin: str, to: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("SEALSTREAM_CRASH_AT", None)
    return subprocess.run(
        [sys.executable, "-m", "sealstream", "replay", str(spec), "--from", origin,
         "--to", str(to), *extra],
        env=env, capture_output=True, text=True, timeout=120,
    )


def snapshot(d: Path, skip: tuple[str, ...] = ()) -> dict[str, bytes]:
    return {
        str(f.relative_to(d)): f.read_bytes()
        for f in sorted(d.rglob("*"))
        if f.is_file() and f.relative_to(d).parts[0] not in skip
    }


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("live")
    names = make_input(d, bad_every=97)
    spec = write_spec(d, names, errors=True, keep=50)
    res = run(spec)
    assert res.returncode == 0, res.stderr
    return d


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("replay*"))
    return dst


def test_replay_from_start_equals_a_normal_run_and_leaves_live_untouched(
    live: Path, tmp_path: Path
) -> None:
    before = snapshot(live, skip=("replay-start",))
    dest = live / "replay-start"
    res = replay(live / "spec.toml", "start", dest, "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["replay"]["partial_windows"] is False
    assert summary["replay"]["to"] == str(dest.resolve())
    assert_same_output(dest, live)
    assert committed(dest, "out") and committed(dest, "late") and committed(dest, "errors")
    assert list((dest / "ckpt").glob("cp-*")), "the replay keeps its own checkpoints"
    assert snapshot(live, skip=("replay-start",)) == before
    # running the same replay again resumes from its own checkpoints: nothing changes
    out_before = snapshot(dest, skip=("ckpt",))
    again = replay(live / "spec.toml", "start", dest, "--quiet")
    assert again.returncode == 0, again.stderr
    assert snapshot(dest, skip=("ckpt",)) == out_before
    assert snapshot(live, skip=("replay-start",)) == before


def _manifests(ckpt: Path) -> list[dict[str, Any]]:
    return [json.loads((cp / "MANIFEST.json").read_text()) for cp in sorted(ckpt.glob("cp-*"))]


def test_replay_from_a_checkpoint_equals_what_the_live_run_emitted_after_it(
    live: Path, tmp_path: Path
) -> None:
    mids = [m for m in _manifests(live / "ckpt")
            if m["state"]["open_windows"] > 0 and m["watermark"]["global_ms"] < 2**62]
    assert len(mids) >= 3
    doc = mids[len(mids) // 2]
    cid, w = doc["id"], doc["watermark"]["global_ms"]
    pos = {p["partition"]: p["next_offset"] for p in doc["positions"]}
    before = snapshot(live)
    dest = tmp_path / "replay-id"
    res = replay(live / "spec.toml", str(cid), dest, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["replay"]["from"] == f"checkpoint {cid}"
    assert snapshot(live) == before

    want = {(json.dumps(r["key"]), r["window_start"], r["window_end"]): r
            for r in committed(live, "out") if r["window_end"] + LATENESS > w}
    got = {(json.dumps(r["key"]), r["window_start"], r["window_end"]): r
           for r in committed(dest, "out")}
    assert len(got) == len(committed(dest, "out"))
    assert want.keys() == got.keys() and want
    for k, r in got.items():
        for f, v in r.items():
            e = want[k][f]
            if isinstance(v, float):
                assert v == pytest.approx(e, rel=1e-9), (k, f)
            else:
                assert v == e and type(v) is type(e), (k, f)
    for sub in ("late", "errors"):
        want_ids = sorted((r["_partition"], r["_offset"]) for r in committed(live, sub)
                          if r["_offset"] >= pos[r["_partition"]])
        got_ids = sorted((r["_partition"], r["_offset"]) for r in committed(dest, sub))
        assert got_ids == want_ids, sub


def test_replay_from_offsets_is_a_run_with_the_earlier_lines_left_out(
    live: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "replay-off"
    res = replay(live / "spec.toml", "p0=100,in/p2.jsonl=37", dest, "--json")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)["replay"]
    assert info["partial_windows"] is True and "partial" in info["notes"][0]
    # expected: a fresh run where those lines are blank (offsets keep their numbers)
    ref = tmp_path / "blanked"
    names = make_input(ref, bad_every=97)
    for name, n in (("in/p0.jsonl", 100), ("in/p2.jsonl", 37)):
        lines = (ref / name).read_text().split("\n")
        (ref / name).write_text("\n".join([""] * n + lines[n:]))
    spec = write_spec(ref, names, errors=True)
    assert run(spec).returncode == 0
    assert_same_output(dest, ref)
    text = replay(live / "spec.toml", "p0=100", tmp_path / "replay-off2")
    assert text.returncode == 0, text.stderr
    assert "windows spanning the start are partial" in text.stdout


@pytest.mark.parametrize("where", ["out", "ckpt", "late", ".", "ckpt/inner", "in"])
def test_a_live_destination_is_refused(live: Path, where: str) -> None:
    before = snapshot(live)
    res = replay(live / "spec.toml", "start", live / where)
    assert res.returncode == 2, res.stderr
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "--to" in err and ("live" in err or "input file" in err)
    assert snapshot(live) == before


def test_from_a_checkpoint_that_does_not_verify_names_the_verdict(
    live: Path, tmp_path: Path
) -> None:
    d = _copy(live, tmp_path / "job")
    cp = sorted((d / "ckpt").glob("cp-*"))[-2]
    state = cp / "state.arrow"
    data = bytearray(state.read_bytes())
    data[-10] ^= 0xFF
    state.write_bytes(bytes(data))
    cid = int(cp.name.split("-")[1])
    before = snapshot(d)
    res = replay(d / "spec.toml", str(cid), tmp_path / "dest")
    assert res.returncode == 1
    assert "INCONSISTENT_STATE" in res.stderr and "HASH_MISMATCH" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert snapshot(d) == before
    missing = replay(d / "spec.toml", "999999", tmp_path / "dest2")
    assert missing.returncode == 2 and "no checkpoint 999999" in missing.stderr


@pytest.mark.parametrize("origin", ["p9=1", "p0=x", "later", "p0=1,p0=2"])
def test_bad_origins_are_usage_errors(live: Path, tmp_path: Path, origin: str) -> None:
    res = replay(live / "spec.toml", origin, tmp_path / "dest")
    assert res.returncode == 2
    assert "--from" in res.stderr and "Traceback" not in res.stderr


def test_a_destination_of_another_replay_is_refused(live: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    assert replay(live / "spec.toml", "p0=10", dest, "--quiet").returncode == 0
    res = replay(live / "spec.toml", "start", dest)
    assert res.returncode == 2 and "another origin" in res.stderr
