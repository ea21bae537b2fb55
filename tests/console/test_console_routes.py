"""Every route of `sealstream console` on real stores (a directory, SQLite, PostgreSQL)
written by real runs: the pages show what `checkpoints list|verify|inspect|diff|window`
say, nothing is written to a store, and a store that cannot be read is a page that
says so, never a server error."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from _consolekit import emitted_window, story, tree

from scenarios._story import in_process, run
from sealstream.checkpoint.stores import LocalCheckpointStore
from sealstream.inspect import judge_checkpoint


def _rows(html: str) -> list[dict[str, str]]:
    """The history table's rows: id, verdict, reason, and whether moved aside."""
    out = []
    for m in re.finditer(r'<tr class="row( aside)?" data-id="(\d+)" data-verdict="([^"]*)">'
                         r'(.*?)</tr>', html, re.S):
        reason = re.search(r'<span class="reason">([^<]*)</span>', m.group(4))
        out.append({"id": m.group(2), "verdict": m.group(3), "aside": bool(m.group(1)),
                    "reason": reason.group(1) if reason else ""})
    return out


def _ok(resp: Any) -> str:
    assert resp.status_code == 200, resp.text[:2000]
    assert "Traceback" not in resp.text
    return str(resp.text)


# --------------------------------------------------------------------------- every route
def _walk(c: Any, d: Path | None, n: int) -> None:
    """Every page of pipeline 0 of store 0, checked against the store's own content."""
    index = _ok(c.get("/"))
    assert "story" in index and "ATOMIC_CHECKPOINT" in index
    assert 'href="/s/0/0/history"' in index

    hist = _ok(c.get("/s/0/0/history"))
    rows = _rows(hist)
    assert [r["id"] for r in rows] == [str(i) for i in range(n, 0, -1)]
    assert all(r["verdict"] == "ATOMIC_CHECKPOINT" and r["reason"] == "OK" for r in rows)
    assert "sha256 (unkeyed)" in hist and "full" in hist

    charts = _ok(c.get("/s/0/0/charts"))
    for chart in ("chart-watermark", "chart-partition-watermarks", "chart-positions",
                  "chart-size", "chart-interval", "chart-results"):
        svg = re.search(rf'<svg class="chart" id="{chart}".*?</svg>', charts, re.S)
        assert svg is not None, chart
        points = svg.group(0).count('<circle class="pt"')
        assert points >= n - 1, (chart, points)  # the interval has none for the first
    assert "nothing recorded" in re.search(r'id="chart-lag".*?</svg>', charts, re.S
                                           ).group(0)  # type: ignore[union-attr]

    detail = _ok(c.get(f"/s/0/0/cp/{n}"))
    assert 'data-verdict="ATOMIC_CHECKPOINT"' in detail
    assert "size and SHA-256 match the manifest" in detail
    assert f"cp-{n:012d}/state.arrow" in detail and "receipts.json" in detail
    assert "signed Merkle root" in detail and "part-" in detail  # receipts, sink tokens
    assert 'id="diff"' in detail and f"A = {n - 1}" in detail  # against its parent
    other = _ok(c.get(f"/s/0/0/cp/{n}?against=1"))
    assert "A = 1" in other and "opened" in other

    w = emitted_window(d) if d is not None else None
    if w is not None:
        q = f"key={w['key']}&start={w['window_start']}&end={w['window_end']}"
        page = _ok(c.get(f"/s/0/0/window?{q}"))
        assert 'id="window-status">emitted<' in page and "proof-download" in page
        proof = c.get(f"/s/0/0/window/proof?{q}")
        assert proof.status_code == 200
        assert "attachment" in proof.headers["content-disposition"]
        assert json.loads(proof.content)["receipt_proof"] == 2  # through the emission log


def test_every_route_on_a_directory_store_reads_and_never_writes(
        job_copy: Path, make_client: Any, tmp_path: Path) -> None:
    ckpt = job_copy / "ckpt"
    n = len(LocalCheckpointStore(ckpt).ids())
    before = tree(ckpt)
    c = make_client(ckpt)
    _walk(c, job_copy, n)
    assert tree(ckpt) == before  # read-only: not a byte, not a name changed
    # the proof it hands out verifies offline against the store's signed manifest
    w = emitted_window(job_copy)
    q = f"key={w['key']}&start={w['window_start']}&end={w['window_end']}"
    proof = tmp_path / "proof.json"
    proof.write_bytes(c.get(f"/s/0/0/window/proof?{q}").content)
    res = in_process("receipts", "verify", str(proof), "--checkpoints", str(ckpt))
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_route_on_a_sqlite_store_reads_and_never_writes(
        sqlite_job_copy: Path, make_client: Any) -> None:
    job = sqlite_job_copy
    db = job / "ckpt.db"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    n = conn.execute("SELECT COUNT(*) FROM sealstream_checkpoints").fetchone()[0]
    conn.close()
    names = sorted(p.name for p in job.iterdir())
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    _walk(make_client(f"sqlite:///{db}"), job, n)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in job.iterdir()) == names  # no -wal, -shm, lock file


def test_every_route_on_a_postgresql_store_with_its_password_redacted(
        tmp_path: Path, pg_url: str, make_client: Any) -> None:
    story(tmp_path, url=pg_url)
    import psycopg

    with psycopg.connect(pg_url) as conn:
        n = conn.execute("SELECT COUNT(*) FROM sealstream_checkpoints").fetchone()[0]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        user = conn.execute("SELECT current_user").fetchone()[0]
    c = make_client(pg_url)
    _walk(c, tmp_path, n)
    m = re.match(r"^[a-z]+://[^:/@]+:([^@/]+)@", pg_url)
    for path in ("/", "/s/0/0/history", "/s/0/0/cp/1", "/s/0/0/charts"):
        page = c.get(path).text
        if m is not None:  # the URL's password: never on a page
            assert f":{m.group(1)}@" not in page
    if m is not None:
        assert ":***@" in c.get("/").text
    # the console's sessions refuse every write (PostgreSQL itself says no)
    from sealstream.console._stores import ReadOnlyPostgresStore

    store = ReadOnlyPostgresStore(pg_url, "story")
    try:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            store._db().execute("CREATE TABLE console_write_probe (i int)")
    finally:
        store.close()
    assert user


# --------------------------------------------------------------------------- stores it cannot read
def test_unreadable_stores_are_pages_that_say_so(tmp_path: Path, make_client: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEALSTREAM_PG_RETRY_S", "1")  # as `sealstream console` sets 3
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    c = make_client(tmp_path / "nowhere", f"sqlite:///{garbage}",
                    "postgresql://nobody:pw@127.0.0.1:1/none?connect_timeout=1")
    page = _ok(c.get("/"))
    assert page.count("cannot read this store") == 3, page
    assert "does not exist" in page and ":pw@" not in page
    for path in ("/s/0/0/history", "/s/9/0/history", "/s/0/0/cp/1", "/agents/0"):
        resp = c.get(path)
        assert resp.status_code == 404 and "not found" in resp.text


def test_a_damaged_checkpoint_detail_and_a_refused_diff_are_pages(
        job_copy: Path, make_client: Any) -> None:
    ckpt = job_copy / "ckpt"
    n = len(LocalCheckpointStore(ckpt).ids())
    state = ckpt / f"cp-{n:012d}" / "state.arrow"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 1
    state.write_bytes(bytes(data))
    c = make_client(ckpt)
    page = _ok(c.get(f"/s/0/0/cp/{n}"))
    assert 'data-verdict="INCONSISTENT_STATE"' in page and "HASH_MISMATCH" in page
    assert "does not match its SHA-256 in the manifest" in page  # the failed component
    assert 'id="diff-error"' in page and "cannot diff" in page  # not a 500
    (ckpt / f"cp-{n:012d}" / "MANIFEST.json").unlink()
    page = _ok(c.get(f"/s/0/0/cp/{n}"))
    assert "NO_MANIFEST" in page
    bad = c.get("/s/0/0/window?key=u1&start=abc&end=1")
    assert bad.status_code == 400 and "not an integer" in bad.text


# --------------------------------------------------------------------------- damage kinds
def _reseal(cp: Path, change: Any) -> None:
    from sealstream.checkpoint import manifest as mf

    m = cp / "MANIFEST.json"
    doc = json.loads(m.read_text())
    doc.pop("signature")
    change(doc)
    m.write_bytes(mf.seal(doc, None))


def _flip(p: Path, at: int | None = None) -> None:
    data = bytearray(p.read_bytes())
    i = len(data) // 2 if at is None else at
    data[i] ^= 1
    p.write_bytes(bytes(data))


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _fifo(cp: Path) -> None:
    (cp / "state.arrow").unlink()
    os.mkfifo(cp / "state.arrow")


def _garbage_state(cp: Path) -> None:
    blob = b"not an arrow file at all"
    (cp / "state.arrow").write_bytes(blob)
    _reseal(cp, lambda d: d["files"]["state"].update(
        bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest()))


def _lower(field: str) -> Any:
    def change(doc: dict[str, Any]) -> None:
        if field == "watermark":
            doc["watermark"]["global_ms"] = 1_600_000_000_000
            doc["watermark"]["partition_ms"] = [1_600_000_000_000] * len(
                doc["watermark"]["partition_ms"])
        else:
            for p in doc["positions"]:
                p["next_offset"] = 1
                p["resume"]["offset"] = 1
                p["resume"]["byte_offset"] = 10
    return change


#: how the newest checkpoint is damaged -> (verdict, reason) the guard gives and the
#: history page must show
DAMAGES: dict[str, tuple[Any, str, str]] = {
    "manifest deleted": (lambda cp: (cp / "MANIFEST.json").unlink(),
                         "PARTIAL_CHECKPOINT_REJECT", "NO_MANIFEST"),
    "manifest truncated": (lambda cp: _truncate(cp / "MANIFEST.json"),
                           "PARTIAL_CHECKPOINT_REJECT", "MANIFEST_UNREADABLE"),
    "manifest byte flipped": (lambda cp: _flip(cp / "MANIFEST.json", (
        cp / "MANIFEST.json").read_bytes().index(b'"fingerprint": "') + 21),
                              "INCONSISTENT_STATE", "SIGNATURE_MISMATCH"),
    "signature removed": (lambda cp: _reseal(cp, lambda d: None) or (
        cp / "MANIFEST.json").write_text(json.dumps(
            {k: v for k, v in json.loads((cp / "MANIFEST.json").read_text()).items()
             if k != "signature"})), "PARTIAL_CHECKPOINT_REJECT", "NO_SIGNATURE"),
    "required field missing": (lambda cp: _reseal(cp, lambda d: d.pop("positions")),
                               "PARTIAL_CHECKPOINT_REJECT", "MANIFEST_INCOMPLETE"),
    "state deleted": (lambda cp: (cp / "state.arrow").unlink(),
                      "PARTIAL_CHECKPOINT_REJECT", "FILE_MISSING"),
    "state truncated": (lambda cp: _truncate(cp / "state.arrow"),
                        "PARTIAL_CHECKPOINT_REJECT", "FILE_TRUNCATED"),
    "state byte flipped": (lambda cp: _flip(cp / "state.arrow"),
                           "INCONSISTENT_STATE", "HASH_MISMATCH"),
    "state not Arrow (resealed)": (_garbage_state, "PARTIAL_CHECKPOINT_REJECT",
                                   "STATE_UNREADABLE"),
    "state is a FIFO": (_fifo, "INCONSISTENT_STATE", "NOT_A_REGULAR_FILE"),
    "state path with ..": (lambda cp: _reseal(cp, lambda d: d["files"]["state"].update(
        path=f"{cp.name}/../{cp.name}/state.arrow")), "INCONSISTENT_STATE",
        "FILE_PATH_INVALID"),
    "receipts deleted": (lambda cp: (cp / "receipts.json").unlink(),
                         "PARTIAL_CHECKPOINT_REJECT", "NO_RECEIPTS"),
    "receipts byte flipped": (lambda cp: _flip(cp / "receipts.json"),
                              "INCONSISTENT_STATE", "HASH_MISMATCH"),
    "watermark lowered (resealed)": (lambda cp: _reseal(cp, _lower("watermark")),
                                     "INCONSISTENT_STATE", "WATERMARK_MISMATCH"),
    "positions lowered (resealed)": (lambda cp: _reseal(cp, _lower("positions")),
                                     "INCONSISTENT_STATE", "POSITION_REGRESSION"),
    "wrong id (resealed)": (lambda cp: _reseal(cp, lambda d: d.update(id=d["id"] + 7)),
                            "INCONSISTENT_STATE", "ID_MISMATCH"),
    "unknown signature algorithm": (lambda cp: (cp / "MANIFEST.json").write_text(
        json.dumps({**json.loads((cp / "MANIFEST.json").read_text()),
                    "signature": {"alg": "rot13", "value": "x"}})),
        "INCONSISTENT_STATE", "UNKNOWN_SIGNATURE_ALG"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_each_damage_kind_shows_on_the_history_page_with_its_verdict_and_reason(
        job_copy: Path, make_client: Any, damage: str) -> None:
    ckpt = job_copy / "ckpt"
    store = LocalCheckpointStore(ckpt)
    n = store.ids()[-1]
    how, verdict, reason = DAMAGES[damage]
    how(ckpt / f"cp-{n:012d}")
    guard = judge_checkpoint(store, n, None)
    assert (guard.verdict, guard.reason) == (verdict, reason), guard
    c = make_client(ckpt)
    rows = _rows(_ok(c.get("/s/0/0/history")))
    assert rows[0] == {"id": str(n), "verdict": verdict, "reason": reason, "aside": False}
    assert all(r["verdict"] == "ATOMIC_CHECKPOINT" for r in rows[1:])
    filtered = _rows(_ok(c.get(f"/s/0/0/history?verdict={verdict}")))
    assert [r["id"] for r in filtered] == [str(n)]
    page = _ok(c.get(f"/s/0/0/cp/{n}"))
    assert f'data-verdict="{verdict}"' in page and reason in page


def test_keyed_checkpoints_read_without_or_with_another_key(
        tmp_path: Path, make_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from sealstream.checkpoint import manifest as mf

    story(tmp_path, env={mf.KEY_ENV: "console-key"})
    c = make_client(tmp_path / "ckpt")
    reasons = {r["reason"] for r in _rows(_ok(c.get("/s/0/0/history")))}
    assert reasons == {"SIGNED_WITHOUT_KEY"}
    monkeypatch.setenv(mf.KEY_ENV, "another-key")
    reasons = {r["reason"] for r in _rows(_ok(c.get("/s/0/0/history")))}
    assert reasons == {"SIGNATURE_MISMATCH"}
    monkeypatch.setenv(mf.KEY_ENV, "console-key")
    rows = _rows(_ok(c.get("/s/0/0/history")))
    assert {r["verdict"] for r in rows} == {"ATOMIC_CHECKPOINT"}
    assert "hmac-sha256 (keyed)" in c.get("/s/0/0/history").text
    assert "console-key" not in c.get("/s/0/0/cp/1").text


def test_ed25519_checkpoints_name_their_signer_and_verify_with_the_public_key(
        tmp_path: Path, make_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from sealstream.checkpoint import signing

    kid = signing.generate(tmp_path / "keys")
    monkeypatch.delenv(signing.SIGNING_KEY_ENV, raising=False)
    monkeypatch.delenv(signing.SIGNING_KEY_FILE_ENV, raising=False)
    monkeypatch.delenv(signing.VERIFY_KEYS_ENV, raising=False)
    story(tmp_path, env={signing.SIGNING_KEY_FILE_ENV:
                         str(tmp_path / "keys" / signing.PRIVATE_NAME)})
    c = make_client(tmp_path / "ckpt")
    assert {r["reason"] for r in _rows(_ok(c.get("/s/0/0/history")))} == {
        signing.NO_PUBLIC_KEY}
    monkeypatch.setenv(signing.VERIFY_KEYS_ENV, str(tmp_path / "keys" / signing.PUBLIC_NAME))
    hist = _ok(c.get("/s/0/0/history"))
    assert {r["verdict"] for r in _rows(hist)} == {"ATOMIC_CHECKPOINT"}
    assert f"ed25519 (key {kid})" in hist and "unknown (" not in hist


# --------------------------------------------------------------------------- moved aside
def test_checkpoints_moved_aside_by_recovery_stay_in_the_history(
        job_copy: Path, make_client: Any) -> None:
    """Recovery moves a damaged checkpoint to rejected/; the console still shows it, with
    the verdict and reason the guard gives it where it now lies, and its detail."""
    ckpt = job_copy / "ckpt"
    n = LocalCheckpointStore(ckpt).ids()[-1]
    _flip(ckpt / f"cp-{n:012d}" / "state.arrow")
    res = run(job_copy / "spec.toml")
    assert res.returncode == 0, res.stderr
    assert list((ckpt / "rejected").iterdir())
    c = make_client(ckpt)
    rows = _rows(_ok(c.get("/s/0/0/history")))
    aside = [r for r in rows if r["aside"]]
    assert aside == [{"id": str(n), "verdict": "INCONSISTENT_STATE", "reason": "HASH_MISMATCH",
                      "aside": True}]
    assert int(rows[0]["id"]) > n and not rows[0]["aside"]  # resumed: a newer one, ATOMIC
    assert rows[0]["verdict"] == "ATOMIC_CHECKPOINT"
    page = _ok(c.get(f"/s/0/0/aside/0/{n}"))
    assert "moved aside" in page and "HASH_MISMATCH" in page
    assert "does not match its SHA-256" in page


def test_checkpoints_moved_aside_in_a_sqlite_store_stay_in_the_history(
        sqlite_job_copy: Path, make_client: Any) -> None:
    spec = sqlite_job_copy / "spec.toml"
    db = sqlite_job_copy / "ckpt.db"
    conn = sqlite3.connect(db)
    (cid,) = conn.execute("SELECT MAX(id) FROM sealstream_checkpoints").fetchone()
    name = f"cp-{cid:012d}/state.arrow"
    (data,) = conn.execute("SELECT data FROM sealstream_checkpoint_files WHERE name = ?",
                           (name,)).fetchone()
    conn.execute("UPDATE sealstream_checkpoint_files SET data = ? WHERE name = ?",
                 (data[:100] + bytes([data[100] ^ 0x40]) + data[101:], name))
    conn.commit()
    conn.close()
    c = make_client(f"sqlite:///{db}")
    assert _rows(_ok(c.get("/s/0/0/history")))[0]["reason"] == "HASH_MISMATCH"
    res = run(spec)
    assert res.returncode == 0, res.stderr
    rows = _rows(_ok(c.get("/s/0/0/history")))
    aside = [r for r in rows if r["aside"]]
    assert aside == [{"id": str(cid), "verdict": "INCONSISTENT_STATE",
                      "reason": "HASH_MISMATCH", "aside": True}]
    page = _ok(c.get(f"/s/0/0/aside/0/{cid}"))
    assert "HASH_MISMATCH" in page and "moved aside" in page
    shutil.rmtree(sqlite_job_copy / "in")


# --------------------------------------------------------------------------- pages and cache
def test_a_long_history_is_paginated_and_a_filter_spans_pages(
        job_copy: Path, make_client: Any) -> None:
    from _consolekit import clone_checkpoints

    ckpt = job_copy / "ckpt"
    clone_checkpoints(ckpt, 120)
    for cid in (7, 77):  # two damaged checkpoints, on different pages
        _flip(ckpt / f"cp-{cid:012d}" / "state.arrow")
    c = make_client(ckpt)
    first = _ok(c.get("/s/0/0/history"))
    assert [r["id"] for r in _rows(first)] == [str(i) for i in range(120, 70, -1)]
    assert "page 1 of 3" in first and 'id="older"' in first
    last = _rows(_ok(c.get("/s/0/0/history?page=3")))
    assert [r["id"] for r in last] == [str(i) for i in range(20, 0, -1)]
    bad = _rows(_ok(c.get("/s/0/0/history?verdict=INCONSISTENT_STATE")))
    assert [(r["id"], r["reason"]) for r in bad] == [("77", "HASH_MISMATCH"),
                                                     ("7", "HASH_MISMATCH")]
    assert len(_rows(_ok(c.get("/s/0/0/history?verdict=ATOMIC_CHECKPOINT&page=3")))) == 18
    assert "page 1 of 1" in _ok(c.get("/s/0/0/history?page=99&verdict=INCONSISTENT_STATE"))


def test_a_checkpoint_damaged_after_it_was_shown_is_judged_again(
        job_copy: Path, make_client: Any) -> None:
    ckpt = job_copy / "ckpt"
    c = make_client(ckpt)
    assert {r["verdict"] for r in _rows(_ok(c.get("/s/0/0/history")))} == {"ATOMIC_CHECKPOINT"}
    n = LocalCheckpointStore(ckpt).ids()[-1]
    _flip(ckpt / f"cp-{n:012d}" / "state.arrow")  # same size, same name
    rows = _rows(_ok(c.get("/s/0/0/history")))
    assert (rows[0]["id"], rows[0]["reason"]) == (str(n), "HASH_MISMATCH")


def test_an_encrypted_store_without_its_key_says_so_and_with_it_reads(
        tmp_path: Path, make_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    key = "ab" * 32
    story(tmp_path, env={"SEALSTREAM_ENCRYPTION_KEY": key})
    c = make_client(tmp_path / "ckpt")
    rows = _rows(_ok(c.get("/s/0/0/history")))
    assert rows and {(r["verdict"], r["reason"]) for r in rows} == {
        ("INCONSISTENT_STATE", "ENCRYPTED_WITHOUT_KEY")}
    assert "ENCRYPTED_WITHOUT_KEY" in _ok(c.get(f"/s/0/0/cp/{rows[0]['id']}"))
    monkeypatch.setenv("SEALSTREAM_ENCRYPTION_KEY", key)
    c = make_client(tmp_path / "ckpt")  # the key is read when a store is opened
    page = _ok(c.get("/s/0/0/history"))
    assert {r["verdict"] for r in _rows(page)} == {"ATOMIC_CHECKPOINT"}
    assert key not in page and key not in _ok(c.get(f"/s/0/0/cp/{rows[0]['id']}"))


def test_step_plans_of_a_live_run_show_on_the_checkpoint_page(
        tmp_path: Path, make_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from sealstream._runtime.engine import Job
    from sealstream.pipeline import load_spec
    from test_live_plans import inputs, spec

    monkeypatch.setenv("SEALSTREAM_KEEP_PLANS", "1")
    inputs(tmp_path)
    Job(load_spec(spec(tmp_path))).run()
    store = LocalCheckpointStore(tmp_path / "ckpt", encryption_key=None)
    steps, newest = store.plan_steps(), store.ids()[-1]
    assert len(steps) >= 3
    c = make_client(tmp_path / "ckpt")
    page = _ok(c.get(f"/s/0/0/cp/{newest}"))
    table = page.split("<h2>Step plans</h2>", 1)[1].split("</table>", 1)[0]
    assert table.count("<td>OK</td>") == len(steps)
    damaged = sorted((tmp_path / "ckpt" / "plans").glob("step-*"))[1]
    _flip(damaged)
    page = _ok(c.get(f"/s/0/0/cp/{newest}"))
    table = page.split("<h2>Step plans</h2>", 1)[1].split("</table>", 1)[0]
    assert table.count("<td>OK</td>") < len(steps)
    assert f"<tr><td>{steps[1]}</td><td>OK</td>" not in table
