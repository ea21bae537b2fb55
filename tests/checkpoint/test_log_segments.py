"""The emission log's leaves in shared, content-addressed segments (issue 31): a log of
any length (here more than the 75,000 epochs the 8 MiB receipts bound used to hold),
each checkpoint writing only what is new, pruning keeping every segment a retained
checkpoint names and every proof, on every store; checkpoints written before
segments (leaves inline) still load, verify and resume."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
if str(SCENARIOS) not in sys.path:
    sys.path.insert(0, str(SCENARIOS))

from _story import committed, in_process, make_input, run, write_spec  # noqa: E402

from sealstream.checkpoint import emission_log, log_segments, signing  # noqa: E402
from sealstream.checkpoint import manifest as mf  # noqa: E402
from sealstream.checkpoint.stores import LocalCheckpointStore  # noqa: E402

K_ENV = log_segments.LEAVES_ENV


def _leaf(i: int) -> list[Any]:
    return [i, 1 + i % 7, hashlib.sha256(str(i).encode()).hexdigest()]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 70), st.integers(0, 70), st.sampled_from([1, 2, 4, 8]))
def test_segments_and_tail_are_the_log(n: int, more: int, k: int) -> None:
    os.environ[K_ENV] = str(k)
    try:
        stored: dict[str, bytes] = {}
        entries = [_leaf(i) for i in range(n)]
        names, new, tail = log_segments.split(entries, [])
        stored.update((log_segments.segment_name(s), d) for s, d in new)
        assert len(tail) < k and len(new) == n // k
        grown = entries + [_leaf(n + i) for i in range(more)]
        names2, new2, tail2 = log_segments.split(grown, names)
        # only what is new is written; the earlier segments are named again
        assert names2[:len(names)] == names and len(new2) == len(names2) - len(names)
        stored.update((log_segments.segment_name(s), d) for s, d in new2)
        receipts = {log_segments.SEGMENTS_KEY: [s for s, _ in names2], "log": tail2}
        log, parts = log_segments.resolve(receipts, stored.get)
        assert log == grown and parts == names2
        assert emission_log.head(log) == emission_log.head(grown)
    finally:
        os.environ.pop(K_ENV)


def test_a_missing_or_altered_segment_is_named() -> None:
    data = log_segments.encode([_leaf(1), _leaf(2)])
    sha = hashlib.sha256(data).hexdigest()
    receipts = {log_segments.SEGMENTS_KEY: [sha], "log": []}
    with pytest.raises(log_segments.SegmentError) as err:
        log_segments.resolve(receipts, lambda name: None)
    assert err.value.code == log_segments.MISSING
    with pytest.raises(log_segments.SegmentError) as err:
        log_segments.resolve(receipts, lambda name: data.replace(b"1", b"3", 1))
    assert err.value.code == log_segments.MISMATCH


# --------------------------------------------------------------------------- stories
def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``sealstream ARGS`` in this process: inspection commands need no process of
    their own (a subprocess costs a Python start and the Polars/Arrow imports)."""
    return in_process(*args, env=dict(env))


def _hmac() -> dict[str, str]:
    return {mf.KEY_ENV: "segments-test-key"}


def test_a_log_of_more_than_75000_epochs(tmp_path: Path) -> None:
    """A real signed chain, then a checkpoint whose log holds 80,000 more epochs (built
    directly, as the writer cuts it): it verifies, extends its parent, proves a real
    result through the long log, and its receipts.json stays small."""
    signing.generate(tmp_path / "keys")
    private = tmp_path / "keys" / signing.PRIVATE_NAME
    public = tmp_path / "keys" / signing.PUBLIC_NAME
    job = tmp_path / "job"
    spec = write_spec(job, make_input(job, events=200), keep=20)
    assert run(spec, env={signing.SIGNING_KEY_FILE_ENV: str(private)}).returncode == 0
    store = LocalCheckpointStore(job / "ckpt")
    last = store.ids()[-1]
    doc = json.loads(store.read(f"cp-{last:012d}/MANIFEST.json"))
    receipts = json.loads(store.read(doc["files"]["receipts"]["path"]))
    log, parts = store.read_log(receipts)
    top = int(doc["epoch"])
    log = log + [_leaf(top + 1 + i) for i in range(80_000)]
    names, new, tail = log_segments.split(log, parts)
    for sha, data in new:
        store.write_shared(log_segments.segment_name(sha), data)
    cid, epoch = last + 1, top + 80_001
    empty = hashlib.sha256(b"").hexdigest()
    rec = {"epoch": epoch, **{r: {"count": 0, "digest": empty, "tokens": []}
                              for r in ("results", "late", "errors")}}
    rec["results"]["root"] = empty
    body_receipts = {"summary": receipts["summary"], "epochs": [rec],
                     log_segments.SEGMENTS_KEY: [s for s, _ in names], "log": tail}
    rdata = json.dumps(body_receipts, sort_keys=True, indent=1).encode()
    state = store.read(doc["files"]["state"]["path"])
    d = f"cp-{cid:012d}"
    body = {k: v for k, v in doc.items() if k != "signature"}
    body.update(id=cid, parent=last, epoch=epoch, receipt_roots={
        "epoch": epoch, "results": {"count": 0, "root": empty}})
    body[emission_log.LOG_FIELD] = emission_log.head(log)
    body["files"] = {
        "state": {"path": f"{d}/state.arrow", "sha256": hashlib.sha256(state).hexdigest(),
                  "bytes": len(state)},
        "receipts": {"path": f"{d}/receipts.json", "sha256": hashlib.sha256(rdata)
                     .hexdigest(), "bytes": len(rdata)}}
    os.environ[signing.SIGNING_KEY_FILE_ENV] = str(private)
    try:
        sealed = mf.seal(body, None)
    finally:
        os.environ.pop(signing.SIGNING_KEY_FILE_ENV)
    store.write_checkpoint(cid, {"state.arrow": state, "receipts.json": rdata}, sealed)
    assert len(rdata) < 200_000  # not 80,000 leaves: 78 segment names and a short tail
    auditor = {signing.VERIFY_KEYS_ENV: str(public), signing.SIGNING_KEY_FILE_ENV: ""}
    res = _cli("checkpoints", "verify", str(job / "ckpt"), "--json", env=auditor)
    assert res.returncode == 0, res.stdout + res.stderr
    verdicts = {c["id"]: c["verdict"] for c in json.loads(res.stdout)["checkpoints"]}
    assert verdicts[cid] == "ATOMIC_CHECKPOINT"
    res = _cli("receipts", "consistency", str(job / "ckpt"), str(last), str(cid), env=auditor)
    assert res.returncode == 0 and res.stdout.startswith("OK"), res.stdout + res.stderr
    r = committed(job, "out")[-1]
    res = _cli("checkpoints", "window", str(job / "ckpt"), "--key", str(r["key"]), "--start",
               str(r["window_start"]), "--end", str(r["window_end"]), "--json", env=auditor)
    assert res.returncode == 0, res.stdout + res.stderr
    proof = json.loads(res.stdout)["checkpoint"]["output_emission_receipt"]
    assert proof["checkpoint"] == cid and proof["log_size"] == len(log) > 80_000
    (tmp_path / "w.json").write_text(res.stdout)
    res = _cli("receipts", "verify", str(tmp_path / "w.json"), "--checkpoints",
               str(job / "ckpt"), env=auditor)
    assert res.stdout.splitlines()[-1] == "1 proof checked, 0 failed", res.stdout
    # a segment deleted: every checkpoint naming it is partial and says which
    victim = job / "ckpt" / log_segments.segment_name(names[-1][0])
    victim.unlink()
    res = _cli("checkpoints", "verify", str(job / "ckpt"), "--json", env=auditor)
    c = {c["id"]: c for c in json.loads(res.stdout)["checkpoints"]}[cid]
    assert (res.returncode, c["verdict"], c["reason"]) == (
        1, "PARTIAL_CHECKPOINT_REJECT", log_segments.MISSING), c


def _store_spec(kind: str, d: Path, request: pytest.FixtureRequest
                ) -> tuple[Path, str, dict[str, str]]:
    spec = write_spec(d, make_input(d, events=900), keep=2, every_events=90)
    if kind == "directory":
        return spec, str(d / "ckpt"), {}
    env: dict[str, str] = {}
    if kind == "sqlite":
        url = f"sqlite:///{d / 'ckpt.db'}"
    elif kind == "postgresql":
        url = str(request.getfixturevalue("pg_url"))
    else:
        server = request.getfixturevalue("s3_server")
        url, env = f"s3://{server.bucket}/seg-{uuid.uuid4().hex[:12]}", dict(server.env())
    spec.write_text(spec.read_text().replace('path = "ckpt"', f"url = {json.dumps(url)}"))
    return spec, url, env


@pytest.mark.parametrize("kind", ["directory", "sqlite", "postgresql", "s3"])
def test_pruning_keeps_the_segments_and_every_proof(kind: str, tmp_path: Path,
                                                   request: pytest.FixtureRequest) -> None:
    job = tmp_path / "job"
    spec, url, env = _store_spec(kind, job, request)
    env = {**env, **_hmac(), K_ENV: "2"}
    res = run(spec, env=env)
    assert res.returncode == 0, res.stderr
    res = _cli("checkpoints", "list", url, "--json", env=env)
    cps = json.loads(res.stdout)["checkpoints"]
    assert len(cps) == 2  # keep = 2: every older checkpoint was pruned
    segs = [f for f in cps[-1]["files"] if f.startswith(f"{log_segments.SEGMENTS_DIR}/")]
    assert len(segs) >= 4, cps[-1]["files"]  # > 8 result-bearing epochs, 2 leaves each
    # the pruned checkpoints' segments are named by the retained ones, and still there
    assert set(segs) <= set(cps[0]["files"]) | set(segs)
    res = _cli("checkpoints", "verify", url, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    out = tmp_path / "all.jsonl"
    res = _cli("receipts", "export", url, "--epochs", "1..999", "--spec", str(spec), "--to",
               str(out), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    proven = {json.loads(line)["id"] for line in out.read_text().splitlines()}
    assert len(proven) == len(committed(job, "out"))
    res = _cli("receipts", "verify", str(out), "--checkpoints", url, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines()[-1] == f"{len(proven)} proofs checked, 0 failed"
    # the open windows of the newest checkpoint export through the same verified read
    res = _cli("checkpoints", "export", url, "--to", str(tmp_path / "open.jsonl"), env=env)
    assert res.returncode == 0, res.stdout + res.stderr


def test_checkpoints_with_inline_leaves_load_verify_and_resume(tmp_path: Path) -> None:
    """Checkpoints written before segments (the whole log inline in receipts.json, no
    segment names): they verify, a run resumes from them and moves the log into
    segments, and every result is proven."""
    job = tmp_path / "job"
    spec = write_spec(job, make_input(job, events=900), keep=20, every_events=90)
    assert run(spec, crash_at="after_retention:8", env=_hmac()).returncode == -9
    for cp in sorted((job / "ckpt").glob("cp-*")):  # as the writer before segments did
        r = json.loads((cp / "receipts.json").read_text())
        assert r.pop(log_segments.SEGMENTS_KEY) == []
        data = json.dumps(r, sort_keys=True, indent=1).encode()
        (cp / "receipts.json").write_bytes(data)
        doc = json.loads((cp / "MANIFEST.json").read_text())
        doc.pop("signature")
        doc["files"]["receipts"].update(sha256=hashlib.sha256(data).hexdigest(),
                                        bytes=len(data))
        (cp / "MANIFEST.json").write_bytes(mf.seal(doc, _hmac()[mf.KEY_ENV].encode()))
    assert not (job / "ckpt" / log_segments.SEGMENTS_DIR).exists()
    res = _cli("checkpoints", "verify", str(job / "ckpt"), env=_hmac())
    assert res.returncode == 0, res.stdout + res.stderr
    saved = tmp_path / "old.json"
    shutil.copyfile(sorted((job / "ckpt").glob("cp-*"))[-1] / "MANIFEST.json", saved)
    res = run(spec, env={**_hmac(), K_ENV: "4"})
    assert res.returncode == 0, res.stderr
    assert list((job / "ckpt" / log_segments.SEGMENTS_DIR).glob("seg-*.json"))
    res = _cli("checkpoints", "verify", str(job / "ckpt"), env=_hmac())
    assert res.returncode == 0, res.stdout + res.stderr
    newest = sorted((job / "ckpt").glob("cp-*"))[-1].name[3:]
    res = _cli("receipts", "consistency", str(job / "ckpt"), str(saved), str(int(newest)),
               env=_hmac())
    assert res.returncode == 0, res.stdout + res.stderr
    out = tmp_path / "all.jsonl"
    res = _cli("receipts", "export", str(job / "ckpt"), "--epochs", "1..999", "--spec",
               str(spec), "--to", str(out), env=_hmac())
    assert res.returncode == 0, res.stdout + res.stderr
    res = _cli("receipts", "verify", str(out), "--checkpoints", str(job / "ckpt"), env=_hmac())
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines()[-1] == f"{len(committed(job, 'out'))} proofs checked, 0 failed"
