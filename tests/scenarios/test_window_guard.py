"""Stories of the window-level guard (sealstream.guard): the specification's own decision
flow on real checkpoints, inclusion proofs for every emitted result, the guard agreeing
with `checkpoints verify` on every damaged checkpoint, and resuming from a checkpoint
whose only damage is a rebuildable component."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from _story import (
    assert_same_output,
    committed,
    in_process,
    make_input,
    run,
    uninterrupted,
    write_spec,
)
from test_corruption import EXPECT, _damage

from sealstream.checkpoint import receipts as trees
from sealstream.checkpoint.stores import LocalCheckpointStore
from sealstream.cli._guard import export_proofs
from sealstream.cli._report import verify_checkpoints
from sealstream.guard import (
    CheckpointVerdict,
    ResumePolicy,
    WindowCheckpoint,
    WindowCheckpointGuard,
    sign_window,
    window_checkpoint,
)

expected = uninterrupted(keep=20)
NO_KEY: bytes | None = None


def policy(*, require: bool = True, max_age: float = 3600.0) -> ResumePolicy:
    return ResumePolicy(require_output_emission_receipt=require,
                        max_checkpoint_age_sec=max_age, current_epoch=time.time())


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A job SIGKILLed after its 5th checkpoint was committed."""
    d = tmp_path_factory.mktemp("crashed")
    spec = write_spec(d, make_input(d), keep=20)
    assert run(spec, crash_at="after_retention:5").returncode == -9
    return d


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``sealstream ARGS`` in this process: an inspection command needs no process of
    its own (a subprocess costs a Python start and the Polars/Arrow imports)."""
    return in_process(*args)


def _ids(d: Path) -> list[int]:
    return LocalCheckpointStore(d / "ckpt").ids()


def _an_emitted_and_an_open(d: Path) -> tuple[dict, dict]:
    store = LocalCheckpointStore(d / "ckpt")
    newest = store.ids()[-1]
    emitted = committed(d, "out")[0]
    from sealstream.inspect import open_windows_table

    table, _ = open_windows_table(store, newest, force=False)
    row = json.loads(table["__json"][0])
    return emitted, row


# --------------------------------------------------------------------------- the spec's flow
def test_the_specifications_decision_flow(tmp_path: Path, crashed: Path) -> None:
    """Rules 1-4 of the specification's decision boundary, on hand-built and real windows."""
    key = b"k-guard"
    base = WindowCheckpoint("u1|false|0|60000", 60_000.0, "ab" * 32, '{"receipt": 1}', "",
                            time.time() - 10)
    signed = WindowCheckpoint(**{**base.__dict__, "atomicity_signature": ""})
    signed = WindowCheckpoint(**{**signed.__dict__,
                                 "atomicity_signature": sign_window(signed, key)})
    g = WindowCheckpointGuard.evaluate_checkpoint
    # rule 2: everything present -> proceed; the digest covers the receipt
    m = g(signed, policy(), key=key)
    assert m.verdict is CheckpointVerdict.ATOMIC_CHECKPOINT
    assert m.directive.startswith("PROCEED: resume window u1|false|0|60000 at watermark 60000")
    assert m.resume_watermark == 60_000.0
    other = WindowCheckpoint(**{**signed.__dict__, "output_emission_receipt": '{"r": 2}'})
    other = WindowCheckpoint(**{**other.__dict__, "atomicity_signature": sign_window(other, key)})
    assert g(other, policy(), key=key).manifest_digest != m.manifest_digest
    # rule 2: no signature, or no receipt while required -> partial, fall back
    m = g(base, policy(), key=key)
    assert (m.verdict, m.reason) == (CheckpointVerdict.PARTIAL_CHECKPOINT_REJECT,
                                     "NO_SIGNATURE")
    assert m.directive.startswith("FALL BACK:") and m.resume_watermark is None
    no_receipt = WindowCheckpoint(**{**signed.__dict__, "output_emission_receipt": None})
    assert g(no_receipt, policy(), key=key).reason == "NO_RECEIPT"
    # rule 3: a signature that does not prove the fields -> inconsistent, reject
    moved = WindowCheckpoint(**{**signed.__dict__, "watermark_epoch": 30_000.0})
    m = g(moved, policy(), key=key)
    assert (m.verdict, m.reason) == (CheckpointVerdict.INCONSISTENT_STATE, "SIGNATURE_MISMATCH")
    assert m.directive.startswith("REJECT:")
    assert g(signed, policy(), key=b"another").reason == "SIGNATURE_MISMATCH"
    # freshness: refused
    m = g(signed, policy(max_age=5), key=key)
    assert (m.verdict, m.reason) == (CheckpointVerdict.INCONSISTENT_STATE, "STALE")

    # the same flow on a real checkpoint
    d = _copy(crashed, tmp_path / "job")
    emitted, open_row = _an_emitted_and_an_open(d)
    cp = window_checkpoint(d / "ckpt", key=str(emitted["key"]),
                           start_ms=emitted["window_start"], end_ms=emitted["window_end"])
    assert cp.status == "emitted" and cp.output_emission_receipt is not None
    m = g(cp, policy(), key=NO_KEY)
    assert m.verdict is CheckpointVerdict.ATOMIC_CHECKPOINT, m
    assert m.directive.startswith(f"PROCEED: resume window {cp.window_id} at watermark ")
    op = window_checkpoint(d / "ckpt", key=str(open_row["key"]),
                           start_ms=open_row["window_start"], end_ms=open_row["window_end"])
    assert op.status == "open" and op.output_emission_receipt is None
    assert g(op, policy(require=False), key=NO_KEY).verdict is CheckpointVerdict.ATOMIC_CHECKPOINT
    assert g(op, policy(require=True), key=NO_KEY).reason == "NO_RECEIPT"
    # incoherent watermark / state hash / epoch against the verified checkpoint
    for change, reason in (({"watermark_epoch": op.watermark_epoch - 1}, "WATERMARK_INCOHERENT"),
                           ({"aggregation_state_hash": "00" * 32}, "STATE_HASH_MISMATCH"),
                           ({"checkpoint_epoch": op.checkpoint_epoch - 1}, "EPOCH_INCOHERENT"),
                           ({"atomicity_signature": "sha256:" + "0" * 64},
                            "SIGNATURE_MISMATCH")):
        bad = WindowCheckpoint(**{**op.__dict__, **change})
        m = g(bad, policy(require=False), key=NO_KEY)
        assert (m.verdict, m.reason) == (CheckpointVerdict.INCONSISTENT_STATE, reason), m
    # a receipt claimed for the open window
    lie = WindowCheckpoint(**{**op.__dict__, "output_emission_receipt": cp.output_emission_receipt})
    assert g(lie, policy(), key=NO_KEY).verdict is CheckpointVerdict.INCONSISTENT_STATE
    # a key where the checkpoints are unsigned: the store's key decides
    assert g(cp, policy(), key=b"k").verdict is CheckpointVerdict.INCONSISTENT_STATE
    # the CLI prints the same
    res = _cli("checkpoints", "window", str(d / "ckpt"), "--key", str(emitted["key"]),
               "--start", str(emitted["window_start"]), "--end", str(emitted["window_end"]),
               "--require-receipts", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["manifest"]["verdict"] == "ATOMIC_CHECKPOINT"
    assert data["checkpoint"]["status"] == "emitted"


# --------------------------------------------------------------------------- proofs
def test_every_emitted_result_has_a_proof_and_forgeries_fail(tmp_path: Path,
                                                             crashed: Path) -> None:
    d = _copy(crashed, tmp_path / "job")
    assert run(d / "spec.toml").returncode == 0
    store = LocalCheckpointStore(d / "ckpt")
    proven: set[str] = set()
    files = []
    for cid in store.ids():
        out = tmp_path / f"proofs-{cid}.jsonl"
        if cid == store.ids()[-1]:  # the command line once, the function for the others
            res = _cli("checkpoints", "export", str(d / "ckpt"), str(cid), "--receipts",
                       "--to", str(out))
            assert res.returncode == 0, res.stderr
        else:
            export_proofs(store, cid, out, replace=False, key=None)
        files.append(out)
        for line in out.read_text().splitlines():
            proof = json.loads(line)
            doc = store.read_manifest(cid)
            assert trees.verify_proof(proof, doc, None).ok
            proven.add(proof["id"])
    # every result the run committed has a proof (the story keeps every checkpoint)
    for r in committed(d, "out"):
        kint = "true" if isinstance(r["key"], int) else "false"
        assert f"{r['key']}|{kint}|{r['window_start']}|{r['window_end']}" in proven, r
    epochs = {store.read_manifest(c)["receipt_roots"]["epoch"] for c in store.ids()}
    assert proven and len(proven) == sum(
        store.read_manifest(c)["receipt_roots"]["results"]["count"] for c in store.ids())
    res = _cli("receipts", "verify", str(files[-1]), "--checkpoints", str(d / "ckpt"))
    assert res.returncode == 0, res.stdout + res.stderr
    proof = json.loads(files[-1].read_text().splitlines()[0])
    cid = proof["checkpoint"]
    doc = store.read_manifest(cid)
    # not emitted
    fake = {**proof, "id": "nobody|false|0|1"}
    assert trees.verify_proof(fake, doc, None).reason == "PROOF_MISMATCH"
    # one hash flipped
    raw = bytearray(trees._unb64(proof["path"])[0], "ascii")
    raw[0] = ord("0") if raw[0] != ord("0") else ord("1")
    flipped = {**proof, "path": trees._b64([raw.decode(), *trees._unb64(proof["path"])[1:]])}
    assert trees.verify_proof(flipped, doc, None).reason == "PROOF_MISMATCH"
    # another checkpoint's manifest
    other = store.read_manifest(store.ids()[0])
    assert store.ids()[0] != cid and min(epochs) >= 1
    assert trees.verify_proof(proof, other, None).reason == "OTHER_CHECKPOINT"
    # a tampered manifest, or the wrong key
    assert not trees.verify_proof(proof, {**doc, "epoch": 99}, None).ok
    assert trees.verify_proof(proof, doc, b"k").reason == "UNSIGNED_WITH_KEY"
    # an older checkpoint without signed roots still loads, and says why it proves nothing
    legacy = {k: v for k, v in doc.items() if k != "receipt_roots"}
    from sealstream.checkpoint.manifest import seal

    legacy = json.loads(seal({k: v for k, v in legacy.items() if k != "signature"}, None))
    assert trees.verify_proof(proof, legacy, None).reason == "NO_RECEIPT_ROOTS"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(flipped))
    res = _cli("receipts", "verify", str(bad), "--checkpoints", str(d / "ckpt"))
    assert res.returncode == 1 and "PROOF_MISMATCH" in res.stdout


def test_a_proof_of_a_million_results_is_at_most_1_kb() -> None:
    n = 1_000_000
    ids = trees.levels.__globals__["pl"].Series(
        [f"user{i % 5000}|false|{(i // 5000) * 60000}|{(i // 5000 + 1) * 60000}"
         for i in range(n)]).sort()
    tree = [s.to_list() for s in trees.levels(ids)]
    worst = max(len(trees.proof_bytes(trees.make_proof(
        "a-pipeline-name", 123456, 98765, ids[i], i, n, trees.path(tree, i))))
        for i in (0, n // 2, n - 1))
    assert worst <= 1024, worst


# --------------------------------------------------------------------------- agreement
@pytest.mark.parametrize("how,name", sorted(EXPECT))
def test_the_window_guard_agrees_with_verify_on_every_damage(
    tmp_path: Path, crashed: Path, how: str, name: str
) -> None:
    d = _copy(crashed, tmp_path / "job")
    emitted, open_row = _an_emitted_and_an_open(d)
    newest = sorted((d / "ckpt").glob("cp-*"))[-1]
    before = {w: window_checkpoint(d / "ckpt", key=str(r["key"]), start_ms=r["window_start"],
                                   end_ms=r["window_end"]) for w, r in (("e", emitted),
                                                                          ("o", open_row))}
    _damage(newest / name, how)
    store = LocalCheckpointStore(d / "ckpt")
    verdict = {c["id"]: c for c in verify_checkpoints(store, None)["checkpoints"]}
    cid = int(newest.name[3:])
    for cp in before.values():
        m = WindowCheckpointGuard.evaluate_checkpoint(cp, policy(require=False), key=NO_KEY)
        assert m.verdict.value == verdict[cid]["verdict"] == EXPECT[(how, name)], (m, verdict)
        assert m.reason == verdict[cid]["reason"]
        assert m.fallback_id == cid - 1 and f"checkpoint {cid - 1}" in m.directive


# --------------------------------------------------------------------------- rebuildable
def test_damaged_receipt_ids_resume_from_the_newest_checkpoint(
    tmp_path: Path, crashed: Path, expected: Path
) -> None:
    d = _copy(crashed, tmp_path / "job")
    newest = sorted((d / "ckpt").glob("cp-*"))[-1]
    cid = int(newest.name[3:])
    (newest / "receipt-ids.arrow").unlink()
    data = verify_checkpoints(LocalCheckpointStore(d / "ckpt"), None)
    entry = data["checkpoints"][-1]
    assert (entry["verdict"], entry["reason"], entry["rebuild"]) == (
        "PARTIAL_CHECKPOINT_REJECT", "REBUILDABLE_COMPONENT", ["receipt_ids"])
    assert data["resume_from"] == cid
    summary = tmp_path / "summary.json"
    res = run(d / "spec.toml", "--summary-json", str(summary))
    assert res.returncode == 0, res.stderr
    assert json.loads(summary.read_text())["resumed_from"] == cid
    assert_same_output(d, expected)


@pytest.mark.parametrize("how", ["delete", "flip"])
def test_damaged_suppression_set_is_rebuilt_from_the_sinks(
    tmp_path: Path, crashed: Path, expected: Path, how: str
) -> None:
    """Fall back two checkpoints (their output stays committed), crash right after the
    first checkpoint that carries the outputs still to suppress, damage that file: the run
    resumes from that checkpoint, rebuilds the set by reading the sinks back, and the
    output is exactly the uninterrupted run's."""
    d = _copy(crashed, tmp_path / "job")
    for cp in sorted((d / "ckpt").glob("cp-*"))[-2:]:
        shutil.rmtree(cp)
    assert run(d / "spec.toml", crash_at="after_retention:1").returncode == -9
    newest = sorted((d / "ckpt").glob("cp-*"))[-1]
    assert (newest / "suppress.arrow").exists(), "the story no longer carries a suppression set"
    _damage(newest / "suppress.arrow", how)
    cid = int(newest.name[3:])
    data = verify_checkpoints(LocalCheckpointStore(d / "ckpt"), None)
    entry = next(c for c in data["checkpoints"] if c["id"] == cid)
    assert (entry["reason"], entry["rebuild"]) == ("REBUILDABLE_COMPONENT", ["suppress"])
    assert data["resume_from"] == cid
    summary = tmp_path / "summary.json"
    res = run(d / "spec.toml", "--summary-json", str(summary))
    assert res.returncode == 0, res.stderr
    assert json.loads(summary.read_text())["resumed_from"] == cid
    assert_same_output(d, expected)


# --------------------------------------------------------------------------- require_receipts
def _reseal(manifest: Path, change: Any) -> None:
    from sealstream.checkpoint.manifest import seal

    doc = json.loads(manifest.read_text())
    doc.pop("signature")
    change(doc)
    manifest.write_bytes(seal(doc, None))


def test_require_receipts_refuses_a_checkpoint_without_signed_roots(
    tmp_path: Path, crashed: Path, expected: Path
) -> None:
    """A checkpoint written before Merkle receipts (no receipt_roots) still loads; with
    require_receipts (spec, or --require-receipts on run/replay/verify) it is PARTIAL
    NO_RECEIPT_ROOTS and recovery falls back to one that signs its root. A signed root
    that does not match the receipts is INCONSISTENT."""
    d = _copy(crashed, tmp_path / "job")
    cps = sorted((d / "ckpt").glob("cp-*"))
    _reseal(cps[-1] / "MANIFEST.json", lambda doc: doc.pop("receipt_roots"))
    store = LocalCheckpointStore(d / "ckpt")
    assert verify_checkpoints(store, None)["checkpoints"][-1]["verdict"] == "ATOMIC_CHECKPOINT"
    entry = verify_checkpoints(store, None, None, True)["checkpoints"][-1]
    assert (entry["verdict"], entry["reason"]) == ("PARTIAL_CHECKPOINT_REJECT",
                                                   "NO_RECEIPT_ROOTS")
    res = _cli("checkpoints", "verify", str(d / "ckpt"), "--require-receipts", "--json")
    assert res.returncode == 1 and json.loads(res.stdout)["resume_from"] == int(
        cps[-2].name[3:])
    # the spec's setting
    spec = d / "spec.toml"
    spec.write_text(spec.read_text().replace("[checkpoint]\n",
                                             "[checkpoint]\nrequire_receipts = true\n"))
    summary = tmp_path / "summary.json"
    res = run(spec, "--summary-json", str(summary))
    assert res.returncode == 0, res.stderr
    got = json.loads(summary.read_text())
    assert got["resumed_from"] == int(cps[-2].name[3:])
    assert [r["reason"] for r in got["rejected"]] == ["NO_RECEIPT_ROOTS"]
    assert_same_output(d, expected)
    # a root that does not match the epoch's receipts, signed all the same
    newest = sorted((d / "ckpt").glob("cp-*"))[-1]

    def forge(doc: dict[str, Any]) -> None:
        doc["receipt_roots"]["results"]["root"] = "0" * 64

    _reseal(newest / "MANIFEST.json", forge)
    entry = verify_checkpoints(store, None)["checkpoints"][-1]
    assert (entry["verdict"], entry["reason"]) == ("INCONSISTENT_STATE", "RECEIPTS_MISMATCH")
