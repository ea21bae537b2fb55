"""What the console's pages show, computed from the stores (read-only).

Every function reads through :mod:`sealstream.inspect`, the guard and the stores, and
returns plain dicts for the templates. A store that cannot be read, or a checkpoint
that is damaged, is described in the result (``error``, the guard's verdict and
reason), never raised to the web layer.

**Choice:** the store records no checkpoint write duration, so the history's
"interval" column and the duration chart show the time since the parent checkpoint
(what a Flink user reads as the checkpoint cadence); a running job's last write
duration comes from its metrics endpoint (``--job``).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from typing import Any

from sealstream.checkpoint import guard, signing
from sealstream.checkpoint.manifest import checkpoint_key, signature_ok
from sealstream.checkpoint.stores import CheckpointStore, LocalCheckpointStore
from sealstream.console._stores import READ_ERRORS, Aside, Pipeline
from sealstream.inspect import diff_checkpoints, inspect_checkpoint, judge_checkpoint, wm_iso
from sealstream.watermark import NEG_INF, POS_INF

#: rows per history page
PAGE_SIZE = 50
#: the newest checkpoints the charts draw
CHART_POINTS = 500
VERDICTS = (guard.ATOMIC, guard.PARTIAL, guard.INCONSISTENT)

#: verdicts of directory checkpoints, keyed by the (name, size, mtime, inode) of every
#: file of the checkpoint: a file changed behind the console's back is judged again
_VERDICTS: dict[tuple[Any, ...], guard.Verdict] = {}


def _d(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _i(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def _finite(v: Any) -> int | None:
    n = _i(v)
    return None if n is None or n <= NEG_INF or n >= POS_INF else n


def signer_text(doc: Mapping[str, Any] | None) -> str:
    sig = _d(doc.get("signature") if doc else None)
    alg = sig.get("alg")
    if alg == "ed25519":
        kid = sig.get("key_id")
        return f"ed25519 (key {kid})" if isinstance(kid, str) else "ed25519"
    if alg == "hmac-sha256":
        return "hmac-sha256 (keyed)"
    if alg == "sha256":
        return "sha256 (unkeyed)"
    return "none" if alg is None else f"unknown ({alg})"


def _fingerprint(store: CheckpointStore, cid: int) -> tuple[Any, ...] | None:
    """What a directory checkpoint's files are now (None: not a directory store)."""
    if not isinstance(store, LocalCheckpointStore):
        return None
    try:
        with os.scandir(store.path_of(cid)) as entries:
            files = sorted((e.name, *((st := e.stat(follow_symlinks=False)).st_size,
                                      st.st_mtime_ns, st.st_ino, st.st_mode))
                           for e in entries)
    except OSError:
        return None
    return (store.location, cid, tuple(files))


def verdict_of(store: CheckpointStore, cid: int, key: bytes | None) -> guard.Verdict:
    """The guard's verdict, as ``checkpoints inspect`` gives it. In a directory store it
    is kept while none of the checkpoint's files changed (size, time, inode); the parent
    it is judged against is immutable once published."""
    tag = _fingerprint(store, cid)
    if tag is None:
        return judge_checkpoint(store, cid, key)
    # the keys in the tag, hashed: a verdict read with other keys is another verdict
    trusted = ",".join(sorted(signing.trusted_keys())).encode()  # public keys count too
    keys = hashlib.sha256((key or b"") + b"|" + (store.encryption_key or b"") + b"|"
                          + trusted).hexdigest()
    tag = (*tag, keys)
    cached = _VERDICTS.get(tag)
    if cached is None:
        cached = judge_checkpoint(store, cid, key)
        if len(_VERDICTS) > 100_000:
            _VERDICTS.clear()
        _VERDICTS[tag] = cached
    return cached


def _size(doc: Mapping[str, Any]) -> int | None:
    sizes = [_i(_d(e).get("bytes")) for e in _d(doc.get("files")).values()]
    known = [s for s in sizes if s is not None]
    return sum(known) if known else None


class _Manifests(dict[int, "dict[str, Any] | None"]):
    """Manifests read on first use (a history page reads its rows' and their parents')."""

    def __init__(self, store: CheckpointStore, ids: list[int]) -> None:
        super().__init__()
        self.store = store
        self.ids = set(ids)

    def __missing__(self, cid: int) -> dict[str, Any] | None:
        doc = self.store.read_manifest(cid)
        self[cid] = doc
        return doc


def _row(store: CheckpointStore, cid: int, doc: dict[str, Any] | None,
         verdict: guard.Verdict | None, docs: _Manifests,
         aside: Aside | None = None, index: int | None = None) -> dict[str, Any]:
    d = doc or {}
    created = _i(d.get("created_ms"))
    parent = _i(d.get("parent"))
    pdoc = docs[parent] if parent is not None and parent in docs.ids else None
    pcreated = _i(pdoc.get("created_ms")) if pdoc else None
    wm = _d(d.get("watermark")).get("global_ms")
    return {
        "id": cid,
        "parent": parent,
        "verdict": verdict.verdict if verdict else None,
        "reason": verdict.reason if verdict else None,
        "message": verdict.message if verdict else None,
        "created_ms": created,
        "created_iso": wm_iso(created),
        "interval_ms": None if created is None or pcreated is None else created - pcreated,
        "bytes": _size(d),
        "incremental": bool(_d(d.get("state")).get("incremental")),
        "events": _i(_d(d.get("counters")).get("events")),
        "watermark_iso": wm_iso(wm),
        "signer": signer_text(doc) if doc is not None else "-",
        "aside": None if aside is None else {"reason": aside.reason, "moved_at": aside.moved_at,
                                             "index": index},
    }


def history(pipeline: Pipeline, verdict: str | None = None, page: int = 1) -> dict[str, Any]:
    """One page of the checkpoint history (newest first), the moved-aside ones included."""
    key = checkpoint_key()
    store = pipeline.open()
    try:
        ids = store.ids()
        docs = _Manifests(store, ids)
        entries: list[tuple[int, Aside | None, int | None]] = [(c, None, None) for c in ids]
        asides = pipeline.asides()
        entries += [(a.id, a, n) for n, a in enumerate(asides)]
        entries.sort(key=lambda e: (e[0], e[1] is None), reverse=True)

        def judged(e: tuple[int, Aside | None, int | None]) -> tuple[guard.Verdict, Any]:
            cid, aside, _ = e
            if aside is None:
                v = verdict_of(store, cid, key)
                return v, None
            view = pipeline.open_aside(aside)
            try:
                return verdict_of(view, cid, key), view.read_manifest(cid)
            finally:
                view.close()

        kept: list[tuple[tuple[int, Aside | None, int | None], guard.Verdict | None, Any]]
        if verdict in VERDICTS:
            kept = []
            for e in entries:
                jv, jdoc = judged(e)
                if jv.verdict == verdict:
                    kept.append((e, jv, jdoc))
        else:
            kept = [(e, None, None) for e in entries]
        pages = max(1, -(-len(kept) // PAGE_SIZE))
        page = min(max(1, page), pages)
        rows = []
        for e, known, doc in kept[(page - 1) * PAGE_SIZE: page * PAGE_SIZE]:
            v = known
            if v is None:
                v, doc = judged(e)
            if e[1] is None:
                doc = docs[e[0]]
            rows.append(_row(store, e[0], doc, v, docs, e[1], e[2]))
        return {"rows": rows, "page": page, "pages": pages, "total": len(kept),
                "verdict": verdict if verdict in VERDICTS else None,
                "location": store.location}
    finally:
        store.close()


def overview(pipeline: Pipeline) -> dict[str, Any]:
    """The pipelines page's row: newest verdict, watermark, lag, last checkpoint age."""
    out: dict[str, Any] = {"name": pipeline.name, "source": pipeline.source.index,
                           "index": pipeline.index, "error": None, "count": 0}
    try:
        store = pipeline.open()
        try:
            ids = store.ids()
            out["count"] = len(ids)
            out["aside"] = len(pipeline.asides())
            if not ids:
                return out
            data = inspect_checkpoint(store, ids[-1], key=checkpoint_key())
        finally:
            store.close()
    except READ_ERRORS as exc:
        out["error"] = str(exc) or type(exc).__name__
        return out
    lags = [p.get("lag") for p in data["partitions"] if isinstance(p.get("lag"), int)]
    out.update(newest=data["id"], verdict=data["verdict"], reason=data["reason"],
               watermark_iso=data["watermark"]["global_iso"], age_ms=data["age_ms"],
               lag=sum(lags) if lags else None)
    return out


def series(pipeline: Pipeline) -> dict[str, Any]:
    """The charts' data over the newest :data:`CHART_POINTS` checkpoints (x: id)."""
    store = pipeline.open()
    try:
        ids = store.ids()[-CHART_POINTS:]
        docs = [(cid, store.read_manifest(cid)) for cid in ids]
    finally:
        store.close()
    out: dict[str, Any] = {"ids": [], "created_ms": [], "global_wm": [], "bytes": [],
                           "interval_ms": [], "results": [], "partitions": {}}
    prev: dict[str, Any] | None = None
    for cid, doc in docs:
        if doc is None:
            continue
        out["ids"].append(cid)
        out["created_ms"].append(_i(doc.get("created_ms")))
        wm = _d(doc.get("watermark"))
        out["global_wm"].append(_finite(wm.get("global_ms")))
        out["bytes"].append(_size(doc))
        pc = _i(prev.get("created_ms")) if prev else None
        c = _i(doc.get("created_ms"))
        out["interval_ms"].append(None if pc is None or c is None else c - pc)
        roots = _d(_d(doc.get("receipt_roots")).get("results"))
        results = _i(roots.get("count"))
        if results is None:
            now_r = _i(_d(doc.get("receipts")).get("results"))
            before = _i(_d(prev.get("receipts")).get("results")) if prev else 0
            results = None if now_r is None or before is None else now_r - before
        out["results"].append(results)
        pwm: list[Any] = wm["partition_ms"] if isinstance(wm.get("partition_ms"), list) else []
        positions: list[Any] = (doc["positions"] if isinstance(doc.get("positions"), list)
                                else [])
        for n, pos in enumerate(positions):
            p = _d(pos)
            name = str(p.get("partition", n))
            entry = out["partitions"].setdefault(name, {"x": [], "wm": [], "position": [],
                                                        "lag": []})
            entry["x"].append(cid)
            entry["wm"].append(_finite(pwm[n]) if n < len(pwm) else None)
            entry["position"].append(_i(p.get("next_offset")))
            entry["lag"].append(_i(p.get("lag")))  # recorded by no writer yet
        prev = doc
    return out


def _components(data: Mapping[str, Any], doc: dict[str, Any] | None,
                key: bytes | None) -> list[dict[str, Any]]:
    """The guard's report component by component: manifest, signature, each file."""
    comps: list[dict[str, Any]] = []
    man_problem = next((p for p in data["problems"] if "manifest" in p), None)
    comps.append({"component": "manifest", "ok": doc is not None,
                  "detail": "published, readable JSON" if doc is not None else
                  (man_problem or "missing or unreadable")})
    if doc is not None:
        sig_ok, code = signature_ok(doc, key)
        comps.append({"component": "signature", "ok": sig_ok,
                      "detail": f"{signer_text(doc)}: {'verifies' if sig_ok else code}"})
    for f in data["files"]:
        ok: bool | None = f["sha256_ok"]
        if f["role"] in ("unrecorded", "staging"):
            detail, ok = "not named by the manifest", None
        elif ok:
            detail = "size and SHA-256 match the manifest"
        elif f["bytes"] is None:
            detail = "missing or unreadable"
        elif (f["recorded_bytes"] or 0) > f["bytes"]:
            detail = f"truncated ({f['bytes']} of {f['recorded_bytes']} bytes)"
        else:
            detail = "does not match its SHA-256 in the manifest"
        comps.append({"component": f"{f['role']}: {f['path']}", "ok": ok, "detail": detail})
    return comps


def _plans(store: CheckpointStore, key: bytes | None) -> list[dict[str, Any]]:
    """The step plans kept in the store, each judged against the one before it."""
    from sealstream.checkpoint.plans import judge_plan

    out: list[dict[str, Any]] = []
    prev: str | None = None
    for step in store.plan_steps():
        data = store.read_plan(step)
        if prev is None:  # the first record kept: chained from what it names
            import json

            try:
                prev = str(json.loads(data or b"{}").get("prev", ""))
            except (ValueError, AttributeError):
                prev = ""
        v = judge_plan(data, step, prev, key)
        plan = v.plan
        out.append({"step": step, "ok": v.ok, "reason": v.reason,
                    "ranges": {} if plan is None else {k: list(r) for k, r in
                                                       sorted(plan.ranges.items())},
                    "end": None if plan is None else plan.end})
        prev = plan.digest() if plan is not None else ""
    return out


def detail(pipeline: Pipeline, cid: int, aside_index: int | None = None) -> dict[str, Any]:
    """Checkpoint ``cid`` (or moved-aside entry ``aside_index``) as ``checkpoints inspect``
    reads it, plus the guard's components, receipts and the store's step plans."""
    key = checkpoint_key()
    aside = None
    if aside_index is not None:
        asides = pipeline.asides()
        if not 0 <= aside_index < len(asides) or asides[aside_index].id != cid:
            raise LookupError(f"no checkpoint {cid} moved aside as entry {aside_index}")
        aside = asides[aside_index]
        store = pipeline.open_aside(aside)
    else:
        store = pipeline.open()
    try:
        if aside is None and cid not in store.ids():
            raise LookupError(f"no checkpoint {cid} in {store.location}")
        data = inspect_checkpoint(store, cid, key=key, now_ms=int(time.time() * 1000))
        doc = store.read_manifest(cid)
        data["components"] = _components(data, doc, key)
        data["receipt_roots"] = _d(doc.get("receipt_roots")) if doc else {}
        data["aside"] = None if aside is None else {"reason": aside.reason,
                                                     "moved_at": aside.moved_at}
        try:
            data["plans"] = _plans(store, key) if aside is None else []
            data["plans_error"] = None
        except READ_ERRORS as exc:
            data["plans"], data["plans_error"] = [], str(exc)
        return data
    finally:
        store.close()


def diff(pipeline: Pipeline, a: int, b: int) -> dict[str, Any]:
    """``checkpoints diff`` A -> B, or ``{"error": ...}`` when a state cannot be verified."""
    store = pipeline.open()
    try:
        ids = store.ids()
        for cid in (a, b):
            if cid not in ids:
                return {"error": f"no checkpoint {cid} in {store.location}"}
        try:
            return diff_checkpoints(store, a, b, key=checkpoint_key())
        except READ_ERRORS as exc:
            return {"error": str(exc)}
    finally:
        store.close()


def window(pipeline: Pipeline, key: str, start_ms: int, end_ms: int,
           cid: int | None) -> dict[str, Any]:
    """``checkpoints window``: the window's state, its emission receipt and the verdict."""
    from sealstream.cli._guard import window_report

    store = pipeline.open()
    try:
        if cid is not None and cid not in store.ids():
            return {"error": f"no checkpoint {cid} in {store.location}"}
        try:
            return window_report(store, key=key, start_ms=start_ms, end_ms=end_ms,
                                 checkpoint_id=cid, require_receipts=False, max_age_s=None)
        except READ_ERRORS as exc:
            return {"error": str(exc)}
    finally:
        store.close()
