"""Incremental checkpoints (`[checkpoint] incremental = true`): deltas between full
snapshots give exactly the output of full snapshots through crashes; a checkpoint
depends on its base and deltas, which the guard verifies and retention keeps; a
damaged base falls back to the restore point kept for that case."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import polars as pl
import pytest
from _story import (
    assert_same_output,
    in_process,
    make_input,
    run,
    run_here,
    uninterrupted,
    write_spec,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from sealstream.sources._base import KEY, KEY_IS_INT
from sealstream.state import incremental
from sealstream.state.codec import decode_table, encode_table

STORY = {"errors": True, "bad_every": 97}


expected = uninterrupted(**STORY)


def _spec(d: Path, full_every: int = 3, keep: int = 3) -> Path:
    spec = write_spec(d, make_input(d, bad_every=97), errors=True, keep=keep)
    spec.write_text(spec.read_text().replace(
        "[checkpoint]\n", f"[checkpoint]\nincremental = true\nfull_every = {full_every}\n"))
    return spec


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return in_process("checkpoints", *args)


def _manifest(d: Path, cid: int) -> dict[str, object]:
    doc: dict[str, object] = json.loads((d / "ckpt" / f"cp-{cid:012d}" / "MANIFEST.json")
                                        .read_text())
    return doc


# ------------------------------------------------------------------ the delta algebra
_rows = st.lists(st.tuples(st.sampled_from(["a", "b", "c", "1", "2"]), st.booleans(),
                           st.integers(0, 4), st.integers(-3, 3)), max_size=25)


def _state(rows: list[tuple[str, bool, int, int]]) -> pl.DataFrame:
    uniq = {(k, ki, w): v for k, ki, w, v in rows}
    return pl.DataFrame(
        {KEY: [k for k, _, _ in uniq], KEY_IS_INT: [ki for _, ki, _ in uniq],
         "window_start": [w for _, _, w in uniq], "window_end": [w + 1 for _, _, w in uniq],
         "#count": [v for v in uniq.values()]},
        schema={KEY: pl.String, KEY_IS_INT: pl.Boolean, "window_start": pl.Int64,
                "window_end": pl.Int64, "#count": pl.Int64})


@settings(max_examples=200, deadline=None)
@given(prev_rows=_rows, new_rows=_rows, drop=st.lists(st.integers(0, 30), max_size=10))
def test_delta_rebuilds_the_state_exactly(prev_rows: list[tuple[str, bool, int, int]],
                                          new_rows: list[tuple[str, bool, int, int]],
                                          drop: list[int]) -> None:
    """Events touch some keys (any change to their rows); the watermark removes rows of
    any key. Base + delta == the new state, row for row."""
    prev = _state(prev_rows)
    touched = _state(new_rows).select(incremental.KEYS).unique()
    kept = prev.join(touched, on=incremental.KEYS, how="anti").with_row_index("i")
    kept = kept.filter(~pl.col("i").is_in(drop)).drop("i")  # fired by the watermark
    cur = pl.concat([kept, _state(new_rows)])
    keys = incremental.changed_keys(prev, cur, touched)
    delta, _ = decode_table(incremental.encode_delta(cur, keys, {"m": 1}))
    rebuilt = incremental.apply_delta(prev, delta)
    assert sorted(rebuilt.rows()) == sorted(cur.rows())


def test_a_delta_is_small_when_few_keys_change() -> None:
    n = 200_000
    rng = random.Random(1)
    prev = pl.DataFrame({KEY: [f"user-{i}" for i in range(n)], KEY_IS_INT: [False] * n,
                         "window_start": [0] * n, "window_end": [60_000] * n,
                         "#count": [rng.randint(1, 9) for _ in range(n)]})
    touched = prev.sample(n // 100, seed=2).select(incremental.KEYS)
    cur = prev.with_columns(
        pl.when(pl.col(KEY).is_in(touched[KEY].implode())).then(pl.col("#count") + 1)
        .otherwise(pl.col("#count")).alias("#count"))
    full = len(encode_table(cur, {"m": 1}))
    delta = len(incremental.encode_delta(cur, incremental.changed_keys(prev, cur, touched),
                                         {"m": 1}))
    assert delta <= 0.05 * full, (delta, full)


# ------------------------------------------------------------------ end to end
def test_output_equals_full_snapshots_and_chains_are_verified(tmp_path: Path,
                                                              expected: Path) -> None:
    spec = _spec(tmp_path)
    res = run_here(spec)
    assert res.returncode == 0, res.stderr
    assert_same_output(tmp_path, expected)
    listed = json.loads(_cli("list", str(tmp_path / "ckpt"), "--json").stdout)["checkpoints"]
    present = {c["id"] for c in listed}
    deltas = 0
    for c in listed:
        files = _manifest(tmp_path, c["id"])["files"]
        assert isinstance(files, dict)
        if "base" not in files:
            continue
        deltas += 1  # a delta names its base and the deltas since; all of them are kept
        assert str(files["state"]["path"]).endswith("state.delta.arrow")
        chain = [files[r]["path"] for r in files if r == "base" or r.startswith("delta:")]
        assert {int(str(p).split("/")[0][3:]) for p in chain} <= present
        assert set(map(str, chain)) <= set(c["files"])  # `list` shows the dependencies
    assert deltas >= 1
    verified = json.loads(_cli("verify", str(tmp_path / "ckpt"), "--json").stdout)
    assert {c["verdict"] for c in verified["checkpoints"]} == {"ATOMIC_CHECKPOINT"}
    shown = json.loads(_cli("inspect", str(tmp_path / "ckpt"), "--json").stdout)
    assert shown["state"]["read"] is True


@pytest.mark.parametrize("point,nth", [("after_write_state", 2), ("before_manifest_publish", 5),
                                       ("after_manifest_publish", 4), ("after_retention", 5)])
def test_kill_then_resume_from_a_delta(tmp_path: Path, expected: Path, point: str,
                                       nth: int) -> None:
    spec = _spec(tmp_path)
    crashed = run(spec, crash_at=f"{point}:{nth}")
    assert crashed.returncode == -9, crashed.stderr
    resumed = run_here(spec)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_output(tmp_path, expected)


def test_damaged_base_falls_back_to_the_kept_restore_point(tmp_path: Path,
                                                           expected: Path) -> None:
    spec = _spec(tmp_path, full_every=3, keep=2)
    assert run(spec, crash_at="after_retention:5").returncode == -9
    listed = json.loads(_cli("list", str(tmp_path / "ckpt"), "--json").stdout)["checkpoints"]
    newest = listed[-1]["id"]
    files = _manifest(tmp_path, newest)["files"]
    assert isinstance(files, dict) and "base" in files, "checkpoint 5 should be a delta"
    base = tmp_path / "ckpt" / str(files["base"]["path"])
    data = bytearray(base.read_bytes())
    data[len(data) // 2] ^= 0x10
    base.write_bytes(bytes(data))
    verified = json.loads(_cli("verify", str(tmp_path / "ckpt"), "--json").stdout)
    judged = {c["id"]: c["verdict"] for c in verified["checkpoints"]}
    assert judged[newest] == "INCONSISTENT_STATE"
    fallback = verified["resume_from"]
    assert fallback is not None and fallback < int(str(base.parent.name)[3:])
    resumed = run_here(spec)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_output(tmp_path, expected)


@pytest.mark.parametrize("first,then", [(False, True), (True, False)])
def test_switching_incremental_on_or_off_between_runs(tmp_path: Path, expected: Path,
                                                      first: bool, then: bool) -> None:
    spec = _spec(tmp_path)
    text = spec.read_text()
    plain = text.replace("incremental = true\n", "")
    spec.write_text(text if first else plain)
    assert run(spec, crash_at="after_retention:5").returncode == -9
    spec.write_text(text if then else plain)
    resumed = run_here(spec)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_output(tmp_path, expected)
    verified = json.loads(_cli("verify", str(tmp_path / "ckpt"), "--json").stdout)
    assert {c["verdict"] for c in verified["checkpoints"]} == {"ATOMIC_CHECKPOINT"}


WINDOWS = {
    "sliding": 'kind = "sliding"\nsize_ms = 3000\nslide_ms = 1000\nallowed_lateness_ms = 0',
    "sliding-uneven": 'kind = "sliding"\nsize_ms = 2500\nslide_ms = 1000\n'
                      'allowed_lateness_ms = 300',
    "session": 'kind = "session"\ngap_ms = 1500\nallowed_lateness_ms = 200',
}


@pytest.mark.parametrize("kind", sorted(WINDOWS))
def test_every_window_kind_through_kills(tmp_path: Path, kind: str) -> None:
    """Sliding fragments change when their windows fire, without an event of their key:
    deltas must carry them too. Killed at every step of two delta checkpoints."""
    story = {"window": WINDOWS[kind], "every_events": 150, "batch_size": 40}
    ref = tmp_path / "ref"  # uninterrupted, so in this process (the kills stay real)
    assert run_here(write_spec(ref, make_input(ref), **story)).returncode == 0
    for point in ("after_write_state:3", "after_retention:5"):
        d = tmp_path / point.replace(":", "-")
        spec = write_spec(d, make_input(d), window=WINDOWS[kind], every_events=150,
                          batch_size=40)
        spec.write_text(spec.read_text().replace(
            "[checkpoint]\n", "[checkpoint]\nincremental = true\nfull_every = 4\n"))
        assert run(spec, crash_at=point).returncode == -9
        res = run(spec, crash_at="after_retention:2")  # killed once more from a delta
        assert res.returncode in (-9, 0), res.stderr
        res = run_here(spec)
        assert res.returncode == 0, res.stderr
        assert_same_output(d, ref)


@pytest.mark.parametrize("kind", sorted(WINDOWS) + ["tumbling"])
def test_every_delta_rebuilds_the_live_state(tmp_path: Path, kind: str) -> None:
    """After every checkpoint of an incremental run, base + deltas equal the operator's
    state at that instant, row for row (the property restores rely on)."""
    from sealstream._runtime.engine import Job
    from sealstream.checkpoint.stores import LocalCheckpointStore
    from sealstream.pipeline import load_spec

    window = WINDOWS.get(kind, 'kind = "tumbling"\nsize_ms = 2000\nallowed_lateness_ms = 500')
    spec = write_spec(tmp_path, make_input(tmp_path, events=1500), window=window,
                      every_events=60, batch_size=20)
    spec.write_text(spec.read_text().replace(
        "[checkpoint]\n", "[checkpoint]\nincremental = true\nfull_every = 6\nkeep = 50\n")
        .replace("keep = 3\n", ""))
    store = LocalCheckpointStore(tmp_path / "ckpt")
    checked: list[int] = []

    def compare(job: Job) -> bool:
        assert job.operator is not None
        cid = max(store.ids())
        doc = store.read_manifest(cid)
        assert doc is not None
        state, _ = incremental.load_chain(doc["files"], store.read)
        live = job.operator.snapshot()
        assert sorted(state.rows()) == sorted(live.rows()), f"checkpoint {cid}"
        checked.append(cid)
        return False

    Job(load_spec(spec), stop_when=compare).run()
    deltas = [c for c in checked
              if "base" in (store.read_manifest(c) or {}).get("files", {})]
    assert len(checked) > 10 and len(deltas) > 5
