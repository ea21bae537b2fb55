"""Stories about broken checkpoints: delete, truncate or flip a byte in each
file of the newest checkpoint; the verdict is right, recovery falls back, and
the final output is exact. Signed checkpoints catch tampering."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from _story import (
    assert_same_output,
    committed,
    in_process,
    make_input,
    run,
    run_here,
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
    res = in_process("checkpoints", "verify", str(d / "ckpt"), "--json", *extra,
                     env={mf.KEY_ENV: None, **(env or {})})
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
    res = run_here(d / "spec.toml")
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
    assert run_here(d / "spec.toml").returncode == 0
    assert_same_output(d, expected)


def test_every_checkpoint_broken_refuses_to_start_then_start_over(
    tmp_path: Path, crashed: Path, expected: Path
) -> None:
    d = _copy(crashed, tmp_path / "job")
    cps = sorted((d / "ckpt").glob("cp-*"))
    for cp in cps:
        (cp / "state.arrow").write_bytes(b"garbage")
    before = sorted(p.relative_to(d) for p in d.rglob("*"))
    res = run_here(d / "spec.toml")
    assert res.returncode == 1
    assert "none is ATOMIC_CHECKPOINT" in res.stderr and "Traceback" not in res.stderr
    assert sorted(p.relative_to(d) for p in d.rglob("*")) == before  # nothing deleted
    res = run_here(d / "spec.toml", "--start-over")
    assert res.returncode == 0, res.stderr
    assert len(list((d / "ckpt" / "rejected").iterdir())) == len(cps)
    assert_same_output(d, expected)  # committed output is suppressed, not repeated


def test_watermark_and_positions_never_regress_across_restarts(tmp_path: Path) -> None:
    names = make_input(tmp_path)
    spec = write_spec(tmp_path, names, keep=50, every_events=60)
    for n in (3, 2, 2):
        assert run(spec, crash_at=f"after_manifest_publish:{n}").returncode == -9
    assert run_here(spec).returncode == 0
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
    res = run_here(spec, env=key)
    assert res.returncode == 0, res.stderr


def test_second_run_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    from sealstream.checkpoint.stores import LocalCheckpointStore

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
    assert run_here(d / "spec.toml").returncode == 0
    assert_same_output(d, expected)


def test_start_over_moves_valid_checkpoints_aside_too(
    tmp_path: Path, crashed: Path, expected: Path
) -> None:
    d = _copy(crashed, tmp_path / "job")
    n = len(list((d / "ckpt").glob("cp-*")))
    res = run_here(d / "spec.toml", "--start-over")
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
    assert run_here(d / "spec.toml").returncode == 0
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
    assert run_here(spec, env=key).returncode == 0
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
    assert run_here(d / "spec.toml", "--start-over").returncode == 0
    assert_same_output(d, expected)


# ---------------------------------------------------------------- forged manifests
# A forged checkpoint must be judged from its manifest alone before anything it names is
# read: no absolute path, no FIFO, no device, no unbounded document. The subprocesses get
# a timeout and an address-space limit only as safety nets (on the code before the fix
# they hung forever or read /dev/zero until memory ran out); the assertions are the
# verdicts and the exact output.

KEY = {mf.KEY_ENV: "k-forged"}


def _limited() -> None:
    import resource

    # Address space, not memory: a `run` reserves about 1.7 GB with two malloc arenas (its
    # Polars, Arrow and tokio threads), and more when glibc makes an arena per contended
    # thread, which it did under load (a CI run at 3 GiB failed to spawn a thread). The net
    # only has to stop an unbounded read, so it is wide and the arenas are capped.
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))


def _guarded(args: list[str], env: dict[str, str] | None) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ)
    e.pop(mf.KEY_ENV, None)
    e.pop("SEALSTREAM_CRASH_AT", None)
    e.update(env or {})
    e["MALLOC_ARENA_MAX"] = "2"
    return subprocess.run([sys.executable, "-m", "sealstream", *args], capture_output=True,
                          text=True, env=e, timeout=120, preexec_fn=_limited)


def _verify_guarded(d: Path, env: dict[str, str] | None) -> dict:
    res = _guarded(["checkpoints", "verify", str(d / "ckpt"), "--json"], env)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    return json.loads(res.stdout)


def _here(args: list[str], env: dict[str, str] | None) -> subprocess.CompletedProcess[str]:
    """As :func:`_guarded`, in this process, for the forgeries that name nothing a
    reader could hang on or read without bound (a manifest re-sealed around a bad
    number or parent, or one too large to be read): the verdicts and output asserted
    are the same, and a traceback fails the test by raising here."""
    return in_process(*args, env={mf.KEY_ENV: None, "SEALSTREAM_CRASH_AT": None,
                                  "SEALSTREAM_PAUSE_AT": None, **(env or {})})


def _verify_here(d: Path, env: dict[str, str] | None) -> dict:
    res = _here(["checkpoints", "verify", str(d / "ckpt"), "--json"], env)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def crashed_keyed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As ``crashed``, with signed checkpoints (SEALSTREAM_CHECKPOINT_KEY set)."""
    d = tmp_path_factory.mktemp("crashed-keyed")
    spec = write_spec(d, make_input(d), keep=20)
    assert run(spec, crash_at="after_retention:5", env=KEY).returncode == -9
    return d


def _reseal(manifest: Path, change: Callable[[dict], None]) -> None:
    """Change the manifest and seal it again without the key (what a forger can do)."""
    doc = json.loads(manifest.read_text())
    doc.pop("signature")
    change(doc)
    manifest.write_bytes(mf.seal(doc, None))


def _forge(cp: Path, how: str, outside: Path) -> None:
    manifest = cp / "MANIFEST.json"
    if how == "absolute /dev/zero":
        def to_zero(doc: dict) -> None:
            doc["files"]["state"]["path"] = "/dev/zero"
            doc["files"]["state"]["bytes"] = 1 << 40
        _reseal(manifest, to_zero)
    elif how == "absolute path to a file":
        outside.write_bytes((cp / "state.arrow").read_bytes())
        _reseal(manifest, lambda doc: doc["files"]["state"].update(path=str(outside)))
    elif how == "path with ..":
        _reseal(manifest, lambda doc: doc["files"]["state"].update(
            path=f"{cp.name}/../{cp.name}/state.arrow"))
    elif how == "FIFO as state.arrow":
        (cp / "state.arrow").unlink()
        os.mkfifo(cp / "state.arrow")
    elif how == "FIFO outside":
        os.mkfifo(outside)
        _reseal(manifest, lambda doc: doc["files"]["state"].update(path=str(outside)))
    elif how == "symlink as state.arrow":
        target = cp / "state.arrow"
        outside.write_bytes(target.read_bytes())
        target.unlink()
        target.symlink_to(outside)
    else:
        raise AssertionError(how)


FORGERIES = ["absolute /dev/zero", "absolute path to a file", "path with ..",
             "FIFO as state.arrow", "FIFO outside", "symlink as state.arrow"]


@pytest.mark.parametrize("keyed", [False, True], ids=["no key", "with key"])
@pytest.mark.parametrize("how", FORGERIES)
def test_a_forged_manifest_is_judged_before_anything_it_names_is_read(
    tmp_path: Path, crashed: Path, crashed_keyed: Path, expected: Path, how: str,
    keyed: bool,
) -> None:
    d = _copy(crashed_keyed if keyed else crashed, tmp_path / "job")
    env = KEY if keyed else None
    newest = sorted((d / "ckpt").glob("cp-*"))[-1]
    _forge(newest, how, tmp_path / "outside")
    data = _verify_guarded(d, env)
    verdict = data["checkpoints"][-1]
    assert verdict["verdict"] == INCONSISTENT, verdict
    if keyed and how not in ("FIFO as state.arrow", "symlink as state.arrow"):
        # re-sealed without the key: not authentic, so nothing it names was read
        assert verdict["reason"] == "UNSIGNED_WITH_KEY", verdict
    elif how.startswith(("absolute", "path", "FIFO outside")):
        assert verdict["reason"] == "FILE_PATH_INVALID", verdict
    else:
        assert verdict["reason"] == "NOT_A_REGULAR_FILE", verdict
    assert data["resume_from"] == data["checkpoints"][-2]["id"]
    res = _guarded(["run", str(d / "spec.toml"), "--quiet"], env)
    assert res.returncode == 0, res.stderr
    assert_same_output(d, expected)
    if how == "absolute path to a file":
        assert (tmp_path / "outside").exists()  # moved aside with its checkpoint: not ours


@pytest.mark.parametrize("what", ["manifest", "receipts"])
def test_a_deeply_nested_document_is_rejected_and_recovery_falls_back(
    tmp_path: Path, crashed: Path, expected: Path, what: str
) -> None:
    d = _copy(crashed, tmp_path / "job")
    newest = sorted((d / "ckpt").glob("cp-*"))[-1]
    deep = b"[" * 100_000
    if what == "manifest":
        (newest / "MANIFEST.json").write_bytes(deep)
    else:  # receipts that hash right: a forger re-seals the manifest around them
        (newest / "receipts.json").write_bytes(deep)
        _reseal(newest / "MANIFEST.json", lambda doc: doc["files"]["receipts"].update(
            sha256=hashlib.sha256(deep).hexdigest(), bytes=len(deep)))
    data = _verify_guarded(d, None)
    verdict = data["checkpoints"][-1]
    want = "MANIFEST_UNREADABLE" if what == "manifest" else "NO_RECEIPTS"
    assert (verdict["verdict"], verdict["reason"]) == (PARTIAL, want), verdict
    if what == "manifest":
        assert "nested deeper than 64 levels" in verdict["message"]
        shown = _guarded(["checkpoints", "inspect", str(d / "ckpt"), str(verdict["id"])], None)
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
        assert "manifest is nested deeper than 64 levels" in shown.stdout
    assert data["resume_from"] == data["checkpoints"][-2]["id"]
    res = _guarded(["run", str(d / "spec.toml"), "--quiet"], None)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert_same_output(d, expected)


def test_an_oversized_manifest_is_rejected_unread(
    tmp_path: Path, crashed: Path, expected: Path
) -> None:
    d = _copy(crashed, tmp_path / "job")
    newest = sorted((d / "ckpt").glob("cp-*"))[-1]
    with open(newest / "MANIFEST.json", "ab") as f:
        f.write(b" " * (mf.MAX_JSON_BYTES + 1))  # still valid JSON: only its size is wrong
    data = _verify_here(d, None)
    verdict = data["checkpoints"][-1]
    assert (verdict["verdict"], verdict["reason"]) == (PARTIAL, "MANIFEST_UNREADABLE"), verdict
    assert f"larger than {mf.MAX_JSON_BYTES} bytes" in verdict["message"]
    assert data["resume_from"] == data["checkpoints"][-2]["id"]
    assert _here(["run", str(d / "spec.toml"), "--quiet"], None).returncode == 0
    assert_same_output(d, expected)


def test_a_state_with_an_arrow_extension_type_is_inconsistent(
    tmp_path: Path, crashed: Path, expected: Path
) -> None:
    """A validly signed state whose schema carries an extension type: only the schema
    check stands between it and Polars (which panicked on it)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    d = _copy(crashed, tmp_path / "job")
    newest = sorted((d / "ckpt").glob("cp-*"))[-1]
    table = ipc.open_stream(pa.BufferReader((newest / "state.arrow").read_bytes())).read_all()

    class Odd(pa.ExtensionType):
        def __init__(self) -> None:
            super().__init__(pa.int64(), "forged.odd")

        def __arrow_ext_serialize__(self) -> bytes:
            return b""

        @classmethod
        def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> Odd:
            return cls()

    odd = pa.ExtensionArray.from_storage(Odd(), pa.array(range(table.num_rows), pa.int64()))
    forged = table.append_column(pa.field("odd", Odd()), [odd]).replace_schema_metadata(
        table.schema.metadata)
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, forged.schema) as writer:
        writer.write_table(forged)
    data_bytes = sink.getvalue().to_pybytes()
    (newest / "state.arrow").write_bytes(data_bytes)

    def point_at(doc: dict) -> None:
        doc["files"]["state"].update(sha256=hashlib.sha256(data_bytes).hexdigest(),
                                     bytes=len(data_bytes))
        doc["state"]["sha256"] = doc["files"]["state"]["sha256"]
    _reseal(newest / "MANIFEST.json", point_at)
    data = _verify_guarded(d, None)
    verdict = data["checkpoints"][-1]
    assert (verdict["verdict"], verdict["reason"]) == (INCONSISTENT, "STATE_SCHEMA"), verdict
    assert "forged.odd" in verdict["message"]
    assert data["resume_from"] == data["checkpoints"][-2]["id"]
    res = _guarded(["run", str(d / "spec.toml"), "--quiet"], None)
    assert res.returncode == 0 and "panic" not in res.stderr, res.stderr
    assert_same_output(d, expected)


def _strict_json(text: str) -> dict:
    """Parse as RFC 8259 JSON: NaN and Infinity are not JSON."""
    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


# where a forger puts a number that JSON cannot hold, and how it is spelt in the file
NON_FINITE = [
    ("lateness_ms", "Infinity"),
    ("lateness_ms", "1e999"),
    ("next_offset", "Infinity"),
    ("next_offset", "-1e999"),
    ("created_ms", "Infinity"),
    ("created_ms", "NaN"),
]


@pytest.mark.parametrize("field,number", NON_FINITE)
def test_a_resealed_manifest_with_a_non_finite_number_is_rejected(
    tmp_path: Path, crashed: Path, expected: Path, field: str, number: str
) -> None:
    """Python's JSON parser reads `Infinity`, `NaN` and `1e999` (an overflow to inf);
    none of them is JSON and no writer produces one. A forger re-sealing the manifest
    around one gets a rejecting verdict, not a traceback out of the guard (it did
    int(inf) -> OverflowError), and `list --json` stays strict JSON."""
    d = _copy(crashed, tmp_path / "job")
    newest = sorted((d / "ckpt").glob("cp-*"))[-1]
    manifest = newest / "MANIFEST.json"
    value = float(number)  # inf, -inf or nan: what Python's parser makes of the text

    def plant(doc: dict) -> None:
        if field == "next_offset":
            doc["positions"][0]["next_offset"] = value
        else:
            doc[field] = value
    _reseal(manifest, plant)  # json.dumps spells it Infinity / -Infinity / NaN
    if "e" in number:  # 1e999 parses to the same inf, so the digest still verifies
        manifest.write_text(manifest.read_text().replace("Infinity", "1e999"))
    assert number in manifest.read_text()
    data = _verify_here(d, None)
    verdict = data["checkpoints"][-1]
    assert (verdict["verdict"], verdict["reason"]) == (PARTIAL, "MANIFEST_UNREADABLE"), verdict
    assert "manifest is not JSON" in verdict["message"], verdict
    assert data["resume_from"] == data["checkpoints"][-2]["id"]
    listed = _here(["checkpoints", "list", str(d / "ckpt"), "--json"], None)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    cps = _strict_json(listed.stdout)["checkpoints"]
    assert cps[-1]["id"] == verdict["id"] and cps[-1]["complete"] is False, cps[-1]
    shown = _here(["checkpoints", "inspect", str(d / "ckpt"), str(verdict["id"]),
                   "--json"], None)
    assert "Traceback" not in shown.stderr, shown.stderr
    res = _here(["run", str(d / "spec.toml"), "--quiet"], None)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert_same_output(d, expected)


def test_a_checkpoint_naming_no_parent_is_still_held_to_its_predecessor(
    tmp_path: Path, crashed: Path, expected: Path
) -> None:
    """Only a chain's first checkpoint names no parent, and then no older checkpoint is
    kept (a fresh job, or --start-over moved them aside). A re-sealed manifest that drops
    its parent to hide positions that went back is held to the newest older checkpoint
    that verifies, as when its parent is gone."""
    d = _copy(crashed, tmp_path / "job")
    newest = sorted((d / "ckpt").glob("cp-*"))[-1]

    def regress(doc: dict) -> None:
        doc["parent"] = None
        doc["positions"][0]["next_offset"] = 1
        doc["positions"][0]["resume"]["offset"] = 0
    _reseal(newest / "MANIFEST.json", regress)
    data = _verify_here(d, None)
    verdict = data["checkpoints"][-1]
    assert (verdict["verdict"], verdict["reason"]) == (INCONSISTENT, "POSITION_REGRESSION"), \
        verdict
    assert data["resume_from"] == data["checkpoints"][-2]["id"]
    res = _here(["run", str(d / "spec.toml"), "--quiet"], None)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert_same_output(d, expected)


@pytest.mark.parametrize("parent", ["itself", "a newer id", "zero", "text", "true"])
def test_a_parent_that_cannot_be_an_older_checkpoint_is_malformed(
    tmp_path: Path, crashed: Path, expected: Path, parent: str
) -> None:
    """A checkpoint continues from an older one: a re-sealed manifest naming itself, a
    newer id, no valid id or a non-integer as parent would make itself (or nothing) the
    yardstick of its own coherence, so a position it moved back (re-reading events the
    state already holds) went unnoticed and the checkpoint was ATOMIC."""
    d = _copy(crashed, tmp_path / "job")
    newest = sorted((d / "ckpt").glob("cp-*"))[-1]
    cid = int(newest.name.removeprefix("cp-"))
    named = {"itself": cid, "a newer id": cid + 5, "zero": 0, "text": str(cid - 1),
             "true": True}[parent]

    def regress(doc: dict) -> None:
        doc["parent"] = named
        doc["positions"][0]["next_offset"] = 1
        doc["positions"][0]["resume"]["offset"] = 0
    _reseal(newest / "MANIFEST.json", regress)
    data = _verify_here(d, None)
    verdict = data["checkpoints"][-1]
    assert (verdict["verdict"], verdict["reason"]) == (INCONSISTENT, "MANIFEST_MALFORMED"), \
        verdict
    assert "parent" in verdict["message"], verdict
    assert data["resume_from"] == data["checkpoints"][-2]["id"]
    res = _here(["run", str(d / "spec.toml"), "--quiet"], None)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert_same_output(d, expected)
