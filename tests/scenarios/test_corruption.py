"""Stories about broken checkpoints: delete, truncate or flip a byte in each
file of the newest checkpoint; the verdict is right, recovery falls back, and
the final output is exact. Signed checkpoints catch tampering."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _story import (
    assert_same_output,
    committed,
    make_input,
    run,
    uninterrupted,
    write_spec,
)

from sealstream.checkpoint import manifest as mf

PARTIAL = "PARTIAL_CHECKPOINT_REJECT"
INCONSISTENT = "INCONSISTENT_STATE"
ATOMIC = "ATOMIC_CHECKPOINT"


expected = uninterrupted(keep=20)


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A job killed after its 5th checkpoint was committed: several checkpoints, some output."""
    d = tmp_path_factory.mktemp("crashed")
    names = make_input(d)
    spec = write_spec(d, names, keep=20)
    assert run(spec, crash_at="after_retention:5").returncode == -9
    return d


def verify(d: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    import os

    e = dict(os.environ)
    e.pop(mf.KEY_ENV, None)
    e.update(env or {})
    res = subprocess.run(
        [sys.executable, "-m", "sealstream", "checkpoints", "verify", str(d / "ckpt"), "--json",
         *extra], capture_output=True, text=True, env=e,
    )
    return res.returncode, json.loads(res.stdout)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


FILES = ["MANIFEST.json", "state.arrow", "receipts.json"]
EXPECT = {
    ("delete", "MANIFEST.json"): PARTIAL,
    ("truncate", "MANIFEST.json"): PARTIAL,
    ("flip", "MANIFEST.json"): INCONSISTENT,
    ("delete", "state.arrow"): PARTIAL,
    ("truncate", "state.arrow"): PARTIAL,
    ("flip", "state.arrow"): INCONSISTENT,
    ("delete", "receipts.json"): PARTIAL,
    ("truncate", "receipts.json"): PARTIAL,
    ("flip", "receipts.json"): INCONSISTENT,
}


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:
        if path.name == "MANIFEST.json":
            i = data.index(b'"fingerprint": "') + len(b'"fingerprint": "') + 5
        else:
            i = len(data) // 2
        flipped = bytes([data[i] ^ 0x01])
        path.write_bytes(data[:i] + flipped + data[i + 1:])


@pytest.mark.parametrize("how,name", sorted(EXPECT))
def test_damaged_newest_checkpoint(
    tmp_path: Path, crashed: Path, expected: Path, how: str, name: str
) -> None:
    d = _copy(crashed, tmp_path / "job")
    rc, before = verify(d)
    assert rc == 0 and all(c["verdict"] == ATOMIC for c in before["checkpoints"])
    newest = sorted((d / "ckpt").glob("cp-*"))[-1]
    newest_id = before["checkpoints"][-1]["id"]
    _damage(newest / name, how)
    rc, after = verify(d)
    assert rc == 1
    verdicts = {c["id"]: c["verdict"] for c in after["checkpoints"]}
    assert verdicts[newest_id] == EXPECT[(how, name)], after
    assert after["resume_from"] == before["checkpoints"][-2]["id"]
    res = run(d / "spec.toml")
    assert res.returncode == 0, res.stderr
    assert_same_output(d, expected)
    # the rejected checkpoint was moved aside as evidence, not deleted
    assert list((d / "ckpt" / "rejected").glob(f"{newest.name}-*"))


def test_two_newest_checkpoints_deleted_falls_back_further(
    tmp_path: Path, crashed: Path, expected: Path
) -> None:
    d = _copy(crashed, tmp_path / "job")
    for cp in sorted((d / "ckpt").glob("cp-*"))[-2:]:
        shutil.rmtree(cp)
    assert run(d / "spec.toml").returncode == 0
    assert_same_output(d, expected)


def test_every_checkpoint_broken_refuses_to_start_then_start_over(
    tmp_path: Path, crashed: Path, expected: Path
) -> None:
    d = _copy(crashed, tmp_path / "job")
    cps = sorted((d / "ckpt").glob("cp-*"))
    for cp in cps:
        (cp / "state.arrow").write_bytes(b"garbage")
    before = sorted(p.relative_to(d) for p in d.rglob("*"))
    res = run(d / "spec.toml")
    assert res.returncode == 1
    assert "none is ATOMIC_CHECKPOINT" in res.stderr and "Traceback" not in res.stderr
    assert sorted(p.relative_to(d) for p in d.rglob("*")) == before  # nothing deleted
    res = run(d / "spec.toml", "--start-over")
    assert res.returncode == 0, res.stderr
    assert len(list((d / "ckpt" / "rejected").iterdir())) == len(cps)
    assert_same_output(d, expected)  # committed output is suppressed, not repeated


def test_watermark_and_positions_never_regress_across_restarts(tmp_path: Path) -> None:
    names = make_input(tmp_path)
    spec = write_spec(tmp_path, names, keep=50, every_events=60)
    for n in (3, 2, 2):
        assert run(spec, crash_at=f"after_manifest_publish:{n}").returncode == -9
    assert run(spec).returncode == 0
    docs = [json.loads((cp / "MANIFEST.json").read_text())
            for cp in sorted((tmp_path / "ckpt").glob("cp-*"))]
    assert len(docs) > 5
    for a, b in zip(docs, docs[1:], strict=False):
        assert b["parent"] == a["id"]
        assert b["watermark"]["global_ms"] >= a["watermark"]["global_ms"]
        for pa, pb in zip(a["positions"], b["positions"], strict=True):
            assert pb["next_offset"] >= pa["next_offset"]
            assert pb["resume"]["offset"] >= pa["resume"]["offset"]


def test_signed_checkpoints_catch_tampering(tmp_path: Path) -> None:
    key = {mf.KEY_ENV: "k-one"}
    names = make_input(tmp_path)
    spec = write_spec(tmp_path, names, keep=20)
    assert run(spec, crash_at="after_retention:4", env=key).returncode == -9
    rc, data = verify(tmp_path, env=key)
    assert rc == 0 and data["resume_from"] is not None
    rc, data = verify(tmp_path, env={mf.KEY_ENV: "k-two"})
    assert rc == 1 and {c["verdict"] for c in data["checkpoints"]} == {INCONSISTENT}
    rc, data = verify(tmp_path)
    assert rc == 1 and {c["reason"] for c in data["checkpoints"]} == {"SIGNED_WITHOUT_KEY"}
    # tamper: move the newest checkpoint's watermark and re-seal it without the key
    newest = sorted((tmp_path / "ckpt").glob("cp-*"))[-1] / "MANIFEST.json"
    doc = json.loads(newest.read_text())
    doc.pop("signature")
    doc["positions"][0]["next_offset"] += 10
    newest.write_bytes(mf.seal(doc, None))
    rc, data = verify(tmp_path, env=key)
    assert data["checkpoints"][-1]["reason"] == "UNSIGNED_WITH_KEY"
    assert data["checkpoints"][-1]["verdict"] == INCONSISTENT
    # a keyed re-seal with the wrong key is also caught
    newest.write_bytes(mf.seal(doc, b"k-two"))
    rc, data = verify(tmp_path, env=key)
    assert data["checkpoints"][-1]["reason"] == "SIGNATURE_MISMATCH"
    res = run(spec, env=key)
    assert res.returncode == 0, res.stderr


def test_second_run_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    from sealstream.checkpoint.store import LocalCheckpointStore

    names = make_input(tmp_path)
    spec = write_spec(tmp_path, names)
    with LocalCheckpointStore(tmp_path / "ckpt").locked():
        res = run(spec)
    assert res.returncode == 1
    assert "locked by another run" in res.stderr and "pid" in res.stderr
    assert committed(tmp_path, "out") == []


def test_a_tampered_parent_does_not_condemn_its_intact_child(
    tmp_path: Path, crashed: Path, expected: Path
) -> None:
    d = _copy(crashed, tmp_path / "job")
    cps = sorted((d / "ckpt").glob("cp-*"))
    parent = cps[-2] / "MANIFEST.json"
    doc = json.loads(parent.read_text())
    doc["positions"][0]["next_offset"] = 10**9  # would make the child look regressed
    parent.write_text(json.dumps(doc))
    rc, data = verify(d)
    verdicts = [c["verdict"] for c in data["checkpoints"]]
    assert verdicts[-2] == INCONSISTENT and verdicts[-1] == ATOMIC
    assert data["resume_from"] == data["checkpoints"][-1]["id"]
    assert run(d / "spec.toml").returncode == 0
    assert_same_output(d, expected)


def test_start_over_moves_valid_checkpoints_aside_too(
    tmp_path: Path, crashed: Path, expected: Path
) -> None:
    d = _copy(crashed, tmp_path / "job")
    n = len(list((d / "ckpt").glob("cp-*")))
    res = run(d / "spec.toml", "--start-over")
    assert res.returncode == 0, res.stderr
    assert len(list((d / "ckpt" / "rejected").glob("*-start-over-*"))) == n
    assert_same_output(d, expected)


@pytest.mark.parametrize("name", ["state.arrow", "receipts.json"])
def test_a_file_copied_from_the_parent_is_inconsistent(
    tmp_path: Path, crashed: Path, expected: Path, name: str
) -> None:
    """Every component present, one of them another checkpoint's whole file: the
    hash does not match (INCONSISTENT_STATE), whether that file is shorter or not;
    a write cut short (a prefix, not a whole file) stays PARTIAL."""
    d = _copy(crashed, tmp_path / "job")
    cps = sorted((d / "ckpt").glob("cp-*"))
    shutil.copyfile(cps[-2] / name, cps[-1] / name)
    rc, data = verify(d)
    assert rc == 1
    newest = data["checkpoints"][-1]
    assert (newest["verdict"], newest["reason"]) == (INCONSISTENT, "HASH_MISMATCH"), newest
    assert data["resume_from"] == data["checkpoints"][-2]["id"]
    assert run(d / "spec.toml").returncode == 0
    assert_same_output(d, expected)


@pytest.mark.parametrize("parent_damage", ["flip signature", "delete manifest"])
def test_a_regressed_child_of_a_damaged_parent_is_still_caught(
    tmp_path: Path, crashed: Path, expected: Path, parent_damage: str
) -> None:
    """Coherence falls back to the nearest older checkpoint whose manifest verifies
    when the parent cannot be trusted: a child whose positions went back (re-signed
    by a key holder, or written by a bug) is not resumed from."""
    key = {mf.KEY_ENV: "k-one"}
    d = tmp_path / "job"
    names = make_input(d)
    spec = write_spec(d, names, keep=20)
    assert run(spec, crash_at="after_retention:5", env=key).returncode == -9
    cps = sorted((d / "ckpt").glob("cp-*"))
    grand = json.loads((cps[-3] / "MANIFEST.json").read_text())
    child = json.loads((cps[-1] / "MANIFEST.json").read_text())
    child.pop("signature")
    child["positions"][0]["next_offset"] = grand["positions"][0]["next_offset"] - 1
    (cps[-1] / "MANIFEST.json").write_bytes(mf.seal(child, b"k-one"))
    parent = cps[-2] / "MANIFEST.json"
    if parent_damage == "delete manifest":
        parent.unlink()
    else:
        doc = json.loads(parent.read_text())
        doc["signature"]["value"] = "0" * len(doc["signature"]["value"])
        parent.write_text(json.dumps(doc))
    rc, data = verify(d, env=key)
    assert rc == 1
    newest = data["checkpoints"][-1]
    assert (newest["verdict"], newest["reason"]) == (INCONSISTENT, "POSITION_REGRESSION"), data
    assert data["resume_from"] == grand["id"]
    assert run(spec, env=key).returncode == 0
    assert_same_output(d, expected)


def test_start_over_with_a_file_where_rejected_goes(
    tmp_path: Path, crashed: Path, expected: Path
) -> None:
    d = _copy(crashed, tmp_path / "job")
    (d / "ckpt" / "rejected").write_text("mine\n")
    before = sorted(p.relative_to(d) for p in d.rglob("*"))
    res = run(d / "spec.toml", "--start-over")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "rejected" in res.stderr and "is a file, not a directory" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert sorted(p.relative_to(d) for p in d.rglob("*")) == before  # nothing moved
    (d / "ckpt" / "rejected").unlink()
    assert run(d / "spec.toml", "--start-over").returncode == 0
    assert_same_output(d, expected)
