"""Read-only views of checkpoints: what ``sealstream checkpoints inspect|diff|export|prune``
compute. Nothing here writes to the checkpoint directory.

Every function takes a :class:`~sealstream.checkpoint.stores.CheckpointStore`
and reads through it. Verdicts come from the guard (:func:`guard.judge`) with the
parent manifest read from the store, exactly like ``checkpoints verify``.

Bytes are parsed only after they were checked against the SHA-256 the manifest
records for them (the guard's rule): an inspection of a corrupt checkpoint
reports what the manifest says and which files do not match, but never decodes
a file whose hash differs. Decoding parses JSON and Arrow only.

* :func:`inspect_checkpoint` — one checkpoint, as much as can be read, plus its verdict;
  never raises on a partial or corrupt checkpoint.
* :func:`diff_checkpoints` — what advanced from checkpoint A to B (raises
  :class:`~sealstream.errors.CheckpointError` when a state file cannot be verified).
* :func:`open_windows_table` — the open window state with each aggregate's current
  partial value, as the result rows would show it if the windows fired now.
* :func:`plan_prune` — which checkpoints a ``prune --keep N`` keeps, deletes and moves
  aside (applied by ``sealstream.cli._prune``).
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import polars as pl

from sealstream.checkpoint import guard
from sealstream.checkpoint.manifest import (
    ALG_HMAC,
    ALG_PLAIN,
    MANIFEST_NAME,
    checkpoint_key,
    load_json,
    signature_ok,
)
from sealstream.checkpoint.stores import (
    PREFIX,
    CheckpointStore,
    LocalCheckpointStore,
    checkpoint_dirname,
)
from sealstream.errors import CheckpointError, SpecError
from sealstream.pipeline import Aggregate, parse_aggregate
from sealstream.pipeline.model import field_kinds
from sealstream.sources._base import KEY, KEY_IS_INT, FieldPlan
from sealstream.state import incremental
from sealstream.state.codec import decode_table, sha256_hex
from sealstream.watermark import NEG_INF, POS_INF, json_ms
from sealstream.windows.aggregates import WEND, WSTART, Accumulators

__all__ = [
    "PrunePlan",
    "diff_checkpoints",
    "inspect_checkpoint",
    "judge_checkpoint",
    "open_windows_table",
    "plan_prune",
    "resolve_id",
    "typed_for_parquet",
    "typed_json",
    "wm_json",
    "wm_iso",
]

WINDOW_ID = [KEY, KEY_IS_INT, WSTART, WEND]


# --------------------------------------------------------------------------- small helpers
def wm_json(value: Any) -> Any:
    """A watermark or time as JSON: an integer, "-inf"/"+inf" for the sentinels, or None."""
    return json_ms(_int(value))


def wm_iso(value: Any) -> str | None:
    """A millisecond time as ISO 8601 UTC (``2023-11-14T22:13:20.000Z``), "-inf"/"+inf"."""
    v = _int(value)
    if v is None:
        return None
    if v <= NEG_INF:
        return "-inf"
    if v >= POS_INF:
        return "+inf"
    try:
        t = _dt.datetime.fromtimestamp(v / 1000, tz=_dt.UTC)
    except (OverflowError, ValueError, OSError):
        return None
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return int(value)
    except (OverflowError, ValueError):
        return None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _delta(a: Any, b: Any) -> int | None:
    """``b - a`` for two finite integers, else None."""
    ia, ib = _int(a), _int(b)
    if ia is None or ib is None:
        return None
    if ia <= NEG_INF or ib <= NEG_INF or ia >= POS_INF or ib >= POS_INF:
        return None
    return ib - ia


def _safe_rel(rel: str) -> bool:
    p = PurePosixPath(rel)
    return bool(rel) and not p.is_absolute() and ".." not in p.parts


def resolve_id(store: CheckpointStore, ident: str | None) -> int:
    """The checkpoint id named by ``ident`` (``7`` or ``cp-000000000007``), or the newest
    when None. Raises SpecError (exit 2) when there is no such checkpoint."""
    ids = store.ids()
    if ident is None:
        if not ids:
            raise SpecError(f"no checkpoints in {store.location}")
        return ids[-1]
    text = ident.strip()
    if text.startswith(PREFIX):
        text = text[len(PREFIX):]
    cid = int(text) if text.isdigit() else None
    if cid is None or cid not in ids:
        present = ", ".join(str(i) for i in ids) if ids else "none"
        raise SpecError(
            f"checkpoint {ident!r} not found in {store.location} (checkpoints present: {present})"
        )
    return cid


def judge_checkpoint(
    store: CheckpointStore, cid: int, key: bytes | None
) -> guard.Verdict:
    """The guard's verdict on ``cid``, with its parent's manifest as the yardstick."""
    doc = store.read_manifest(cid)
    parent = None
    if doc is not None and isinstance(doc.get("parent"), int):
        parent = store.read_manifest(int(doc["parent"]))
    return guard.judge(store.evidence(cid, key), parent, guard.Policy(key=key))


def _signer(doc: Mapping[str, Any] | None, key: bytes | None) -> dict[str, Any]:
    sig = _dict(doc.get("signature")) if doc is not None else {}
    alg = sig.get("alg")
    if alg == ALG_HMAC:
        text = "hmac-sha256 (keyed)"
    elif alg == ALG_PLAIN:
        text = "sha256 (unkeyed: detects corruption, not tampering)"
    elif alg is None:
        text = "none"
    else:
        text = f"unknown ({alg})"
    return {
        "alg": alg if isinstance(alg, str) else None,
        "keyed": alg == ALG_HMAC,
        "description": text,
        "key_set": key is not None,
    }


# --------------------------------------------------------------------------- reading files
@dataclass
class _Loaded:
    """What could be read of one checkpoint, verified against its manifest."""

    cid: int
    doc: dict[str, Any] | None
    manifest_error: str | None = None
    state: pl.DataFrame | None = None
    state_error: str | None = None
    state_bytes: int | None = None
    receipts: dict[str, Any] | None = None
    receipts_error: str | None = None
    files: list[dict[str, Any]] = field(default_factory=list)


def _read_verified(
    store: CheckpointStore, entry: Any
) -> tuple[bytes | None, str | None, dict[str, Any]]:
    """Read a manifest file entry; bytes only when size and SHA-256 match."""
    e = _dict(entry)
    rel = e.get("path")
    fact: dict[str, Any] = {
        "path": rel,
        "recorded_bytes": _int(e.get("bytes")),
        "bytes": None,
        "sha256_ok": None,
    }
    if not isinstance(rel, str) or not _safe_rel(rel):
        return None, f"file entry has no usable path ({rel!r})", fact
    try:
        data = store.read(rel)
    except FileNotFoundError:
        return None, f"{rel} is missing", fact
    except OSError as exc:
        return None, f"{rel} cannot be read ({exc.strerror or exc})", fact
    except CheckpointError as exc:  # not a regular file (a FIFO, a symlink), undecryptable
        return None, f"{rel} cannot be read ({exc})", fact
    fact["bytes"] = len(data)
    ok = sha256_hex(data) == e.get("sha256") and len(data) == _int(e.get("bytes"))
    fact["sha256_ok"] = ok
    if not ok:
        if len(data) < (_int(e.get("bytes")) or 0):
            return None, f"{rel} is truncated ({len(data)} of {e.get('bytes')} bytes)", fact
        return None, f"{rel} does not match its SHA-256 in the manifest", fact
    return data, None, fact


def _load(store: CheckpointStore, cid: int) -> _Loaded:
    d = store.path_of(cid) if isinstance(store, LocalCheckpointStore) else None
    doc: dict[str, Any] | None = None
    error: str | None = None
    try:
        raw = store.read_manifest_bytes(cid)
    except FileNotFoundError:
        error = "no manifest (its writer stopped before publishing it)"
    except OSError as exc:
        error = f"manifest cannot be read ({exc.strerror or exc})"
    except CheckpointError as exc:
        error = f"manifest cannot be decrypted: {exc}"
    else:
        try:
            parsed = load_json(raw, "manifest")
        except (json.JSONDecodeError, UnicodeDecodeError):
            error = "manifest is truncated or not JSON"
        except ValueError as exc:  # over the size or nesting bound
            error = str(exc)
        else:
            if isinstance(parsed, dict):
                doc = parsed
            else:
                error = "manifest is not a JSON object"
    out = _Loaded(cid, doc, error)
    recorded: set[str] = set()
    files = _dict(doc.get("files")) if doc is not None else {}
    datas: dict[str, bytes | None] = {}
    for role, entry in sorted(files.items()):
        data, problem, fact = _read_verified(store, entry)
        datas[role] = data
        fact["role"] = role
        out.files.append(fact)
        if isinstance(fact["path"], str):
            recorded.add(fact["path"])
        if role == "state":
            out.state_bytes = fact["bytes"]
            if data is None:
                out.state_error = problem
            else:
                try:
                    frame, _meta = decode_table(data)
                    missing = [c for c in WINDOW_ID if c not in frame.columns]
                    if missing:
                        raise ValueError(f"state lacks columns {missing}")
                    out.state = frame
                except ValueError as exc:
                    out.state_error = f"state cannot be decoded ({exc})"
        elif role == "receipts":
            if data is None:
                out.receipts_error = problem
            else:
                try:
                    rec = load_json(data, "receipts")
                    out.receipts = rec if isinstance(rec, dict) else None
                    if out.receipts is None:
                        out.receipts_error = "receipts are not a JSON object"
                except (ValueError, UnicodeDecodeError):
                    out.receipts_error = "receipts are not JSON"
    if doc is not None and "state" not in files:
        out.state_error = "the manifest names no state file"
    parts = incremental.part_roles(files)
    if parts and out.state is not None:  # a distributed run's state: one part per worker
        try:
            broken = [r for r in parts if datas.get(r) is None]
            if broken:
                raise ValueError(f"its {', '.join(broken)} file cannot be used")
            out.state = incremental.concat_parts(
                out.state, [decode_table(datas[r] or b"")[0] for r in parts])
            out.state_bytes = (out.state_bytes or 0) + sum(len(datas[r] or b"") for r in parts)
        except ValueError as exc:
            out.state = None
            out.state_error = f"state cannot be rebuilt from its parts ({exc})"
    base, deltas = incremental.chain_roles(files)
    if base is not None and out.state is not None:  # a delta: materialise the chain
        try:
            chain = [datas.get(r) for r in (base, *deltas)]
            broken = [r for r, d in zip((base, *deltas), chain, strict=True) if d is None]
            if broken:
                raise ValueError(f"its {', '.join(broken)} file cannot be used")
            state, _ = decode_table(chain[0] or b"")
            for blob in chain[1:]:
                state = incremental.apply_delta(state, decode_table(blob or b"")[0])
            out.state = incremental.apply_delta(state, out.state)
        except ValueError as exc:
            out.state = None
            out.state_error = f"state cannot be rebuilt from its base and deltas ({exc})"
    # files on disk that the manifest does not name (or every file, without a manifest)
    if not isinstance(store, LocalCheckpointStore):
        for rel in store.files_of(cid):
            name = rel.rsplit("/", 1)[-1]
            if rel in recorded or name == MANIFEST_NAME:
                continue
            blob = store._raw(rel)
            nbytes = None if blob is None else len(blob)
            out.files.append({"role": "unrecorded", "path": rel, "recorded_bytes": None,
                              "bytes": nbytes, "sha256_ok": None})
            if doc is None and name == "state.arrow":
                out.state_bytes = nbytes
    elif d is not None and d.is_dir():
        try:
            entries = sorted(d.iterdir())
        except OSError:
            entries = []
        for f in entries:
            rel = f"{d.name}/{f.name}"
            if rel in recorded or f.name == MANIFEST_NAME or not f.is_file():
                continue
            try:
                size: int | None = f.stat().st_size
            except OSError:
                size = None
            role = "staging" if f.name.startswith(".") else "unrecorded"
            out.files.append({"role": role, "path": rel, "recorded_bytes": None,
                              "bytes": size, "sha256_ok": None})
            if doc is None and f.name == "state.arrow":
                out.state_bytes = size
    if doc is None and out.state_error is None:
        out.state_error = "not read: no usable manifest to verify it against"
    return out


# --------------------------------------------------------------------------- inspect
def _partitions(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    positions = _list(doc.get("positions"))
    wm = _dict(doc.get("watermark"))
    pwm, max_time, exhausted = (_list(wm.get(k)) for k in ("partition_ms", "max_time",
                                                            "exhausted"))
    names = [p.get("partition") for p in positions if isinstance(p, dict)]
    if not names:
        names = _list(_dict(_dict(doc.get("definition")).get("source")).get("partitions"))
    n = max(len(names), len(pwm))
    # a broker's partitions (Kafka, NATS) have positions, not bytes read: left out (None)
    files = _dict(_dict(doc.get("definition")).get("source")).get("kind") not in ("kafka",
                                                                                  "nats")
    out = []
    for i in range(n):
        pos = _dict(positions[i]) if i < len(positions) else {}
        resume = _dict(pos.get("resume"))
        w = pwm[i] if i < len(pwm) else None
        out.append({
            "partition": names[i] if i < len(names) else None,
            "next_offset": _int(pos.get("next_offset")),
            "byte_offset": _int(resume.get("byte_offset")) if files else None,
            "watermark_ms": wm_json(w),
            "watermark_iso": wm_iso(w),
            "max_time_ms": _int(max_time[i]) if i < len(max_time) else None,
            "exhausted": exhausted[i] if i < len(exhausted) else None,
        })
    return out


#: how long `checkpoints inspect` waits for a broker's end offsets
LAG_TIMEOUT_S = 2.0


def with_broker_lag(doc: Mapping[str, Any], parts: list[dict[str, Any]]
                    ) -> list[dict[str, Any]]:
    """Each partition's ``lag`` (records between its saved position and the broker's
    end offset now) for a checkpoint of a Kafka source whose broker answers within
    :data:`LAG_TIMEOUT_S`; None otherwise (and for other sources)."""
    for p in parts:
        p["lag"] = None
    source = _dict(doc.get("source"))
    if source.get("kind") != "kafka" or not parts:
        return parts
    try:
        from confluent_kafka import Consumer, KafkaException, TopicPartition
    except ImportError:
        return parts
    consumer = None
    try:
        consumer = Consumer({"bootstrap.servers": str(source.get("bootstrap")),
                             "group.id": "sealstream-inspect", "enable.auto.commit": False,
                             "isolation.level": "read_committed", "log_level": 0,
                             "socket.timeout.ms": int(LAG_TIMEOUT_S * 1000)})
        for p in parts:
            name, offset = p.get("partition"), p.get("next_offset")
            if not isinstance(name, str) or "/" not in name or offset is None:
                continue
            topic, _, num = name.rpartition("/")
            if not num.isdigit():
                continue
            _low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, int(num)), timeout=LAG_TIMEOUT_S)
            p["lag"] = max(0, int(high) - int(offset))
    except (KafkaException, ValueError, TypeError, RuntimeError):
        pass  # unreachable: no lag shown
    finally:
        if consumer is not None:
            consumer.close()
    return parts


def _windows(loaded: _Loaded) -> dict[str, Any]:
    doc = loaded.doc or {}
    window = _dict(_dict(doc.get("definition")).get("window"))
    recorded = _int(_dict(doc.get("state")).get("open_windows"))
    out: dict[str, Any] = {
        "kind": window.get("kind"),
        "window": window or None,
        "open": recorded,
        "open_recorded": recorded,
        "keys": None,
        "oldest_start_ms": None,
        "oldest_start_iso": None,
        "newest_end_ms": None,
        "newest_end_iso": None,
        "read": loaded.state is not None,
    }
    st = loaded.state
    if st is not None:
        out["open"] = st.height
        if st.height:
            oldest = st.get_column(WSTART).min()
            newest = st.get_column(WEND).max()
            out.update(
                keys=st.select(pl.struct(KEY, KEY_IS_INT).n_unique()).item(),
                oldest_start_ms=wm_json(oldest), oldest_start_iso=wm_iso(oldest),
                newest_end_ms=wm_json(newest), newest_end_iso=wm_iso(newest),
            )
        else:
            out["keys"] = 0
    return out


def _receipts(loaded: _Loaded) -> dict[str, Any]:
    doc = loaded.doc or {}
    total = _dict(doc.get("receipts"))
    out: dict[str, Any] = {
        "totals": {k: _int(total.get(k)) for k in ("results", "late", "errors")},
        "last_epoch": None,
        "digest": total.get("digest"),
    }
    if total.get("last_epoch") is not None:
        out["totals"]["last_epoch"] = _int(total.get("last_epoch"))
    epochs = _list((loaded.receipts or {}).get("epochs"))
    if epochs and isinstance(epochs[-1], dict):
        last = epochs[-1]
        entry: dict[str, Any] = {"epoch": _int(last.get("epoch"))}
        for role in ("results", "late", "errors"):
            entry[role] = _int(_dict(last.get(role)).get("count"))
        mwe = _dict(last.get("results")).get("max_window_end")
        if mwe is not None:
            entry["max_window_end_ms"] = wm_json(mwe)
        out["last_epoch"] = entry
    if loaded.receipts_error:
        out["error"] = loaded.receipts_error
    return out


def inspect_checkpoint(
    store: CheckpointStore, cid: int, *, key: bytes | None = None,
    now_ms: int | None = None, use_env_key: bool = True,
) -> dict[str, Any]:
    """Everything that can be read about checkpoint ``cid``, with the guard's verdict.

    ``key`` defaults to ``SEALSTREAM_CHECKPOINT_KEY`` when ``use_env_key``. Never raises
    for a partial or corrupt checkpoint: what cannot be read is None and explained in
    ``problems``.
    """
    if key is None and use_env_key:
        key = checkpoint_key()
    if now_ms is None:
        now_ms = int(_dt.datetime.now(tz=_dt.UTC).timestamp() * 1000)
    verdict = judge_checkpoint(store, cid, key)
    loaded = _load(store, cid)
    doc = loaded.doc or {}
    wm = _dict(doc.get("watermark"))
    definition = _dict(doc.get("definition"))
    created = _int(doc.get("created_ms"))
    problems = [p for p in (loaded.manifest_error, loaded.state_error, loaded.receipts_error)
                if p]
    if loaded.doc is not None:
        ok, code = signature_ok(loaded.doc, key)
        if not ok:
            problems.insert(0, f"signature: {code}")
    g = wm.get("global_ms")
    return {
        "directory": store.location,
        "id": cid,
        "path": checkpoint_dirname(cid),
        "complete": loaded.doc is not None,
        "verdict": verdict.verdict,
        "reason": verdict.reason,
        "message": verdict.message,
        "format": _int(doc.get("format")),
        "state_format": _int(definition.get("format")),
        "pipeline": doc.get("pipeline"),
        "fingerprint": doc.get("fingerprint"),
        "parent": doc.get("parent"),
        "epoch": _int(doc.get("epoch")),
        "created_ms": created,
        "created_iso": wm_iso(created),
        "age_ms": None if created is None else now_ms - created,
        "signer": _signer(loaded.doc, key),
        "watermark": {
            "global_ms": wm_json(g),
            "global_iso": wm_iso(g),
            "max_delay_ms": _int(wm.get("max_delay_ms")),
            "lateness_ms": _int(doc.get("lateness_ms")),
        },
        "partitions": with_broker_lag(doc, _partitions(doc)),
        "windows": _windows(loaded),
        "state": {
            "bytes": loaded.state_bytes,
            "recorded_bytes": _int(_dict(_dict(doc.get("files")).get("state")).get("bytes")),
            "sha256": _dict(doc.get("state")).get("sha256"),
            "read": loaded.state is not None,
            "error": loaded.state_error,
        },
        "receipts": _receipts(loaded),
        "counters": _dict(doc.get("counters")) or None,
        "aggregates": _dict(definition.get("aggregates")) or None,
        "outputs": _outputs(doc),
        "files": loaded.files,
        "problems": problems,
        "distributed": _distributed(doc, loaded),
    }


def _distributed(doc: Mapping[str, Any], loaded: _Loaded) -> dict[str, Any] | None:
    """A distributed run's checkpoint: its worker count, key routing, and each worker's
    part of the state (rows as recorded; the file, its size and whether it verified)."""
    dist = _dict(doc.get("distributed"))
    if not dist:
        return None
    facts = {f.get("role"): f for f in loaded.files}
    parts = []
    for entry in _list(dist.get("parts")):
        e = _dict(entry)
        worker = _int(e.get("worker"))
        fact = _dict(facts.get(f"{incremental.PART_ROLE}{worker}"))
        parts.append({"worker": worker, "state_rows": _int(e.get("state_rows")),
                      "path": fact.get("path"), "bytes": fact.get("bytes"),
                      "sha256_ok": fact.get("sha256_ok")})
    return {"workers": _int(dist.get("workers")), "routing": _dict(dist.get("routing")),
            "parts": parts}


def _outputs(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per output: the epoch the checkpoint prepared, its commit tokens, and for a
    Kafka output the topic with each partition's end offset when the checkpoint was
    taken (every earlier epoch is committed below it; this epoch's transaction, once
    committed, lies above it)."""
    from sealstream.sinks.kafka import parse_location

    out = []
    for role, entry in sorted(_dict(doc.get("sinks")).items()):
        e = _dict(entry)
        row: dict[str, Any] = {"output": str(role), "epoch": _int(e.get("epoch")),
                               "tokens": [str(t) for t in _list(e.get("tokens"))],
                               "kafka": None, "path": None}
        kafka = parse_location(e.get("path"))
        if kafka is not None:
            row["kafka"] = {"topic": kafka[0],
                            "committed_offsets": {str(p): o for p, o in
                                                  sorted(kafka[1].items())}}
        elif isinstance(e.get("path"), str):
            row["path"] = e["path"]
        out.append(row)
    return out


# --------------------------------------------------------------------------- diff
def _verified(store: CheckpointStore, cid: int, key: bytes | None) -> _Loaded:
    loaded = _load(store, cid)
    if loaded.doc is None:
        raise CheckpointError(f"cannot diff: checkpoint {cid}: {loaded.manifest_error}")
    ok, code = signature_ok(loaded.doc, key)
    if not ok:
        raise CheckpointError(
            f"cannot diff: checkpoint {cid}'s manifest does not verify ({code}); "
            "its state cannot be trusted (is SEALSTREAM_CHECKPOINT_KEY right?)"
        )
    if loaded.state is None:
        raise CheckpointError(f"cannot diff: checkpoint {cid}: {loaded.state_error}")
    return loaded


def _ids(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.select(WINDOW_ID).unique()


def _partition_deltas(da: Mapping[str, Any], db: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per partition (matched by name): offsets and watermarks of A and B, and deltas."""
    rows_a, rows_b = _partitions(da), _partitions(db)
    raw_a = _list(_dict(da.get("watermark")).get("partition_ms"))
    raw_b = _list(_dict(db.get("watermark")).get("partition_ms"))
    index_a = {r["partition"]: i for i, r in enumerate(rows_a)}
    index_b = {r["partition"]: i for i, r in enumerate(rows_b)}
    out = []
    for name in list(index_a) + [n for n in index_b if n not in index_a]:
        i, j = index_a.get(name), index_b.get(name)
        x = rows_a[i] if i is not None else {}
        y = rows_b[j] if j is not None else {}
        wa = raw_a[i] if i is not None and i < len(raw_a) else None
        wb = raw_b[j] if j is not None and j < len(raw_b) else None
        out.append({
            "partition": name,
            "next_offset": [x.get("next_offset"), y.get("next_offset")],
            "delta": _delta(x.get("next_offset"), y.get("next_offset")),
            "watermark_ms": [x.get("watermark_ms"), y.get("watermark_ms")],
            "watermark_delta_ms": _delta(wa, wb),
        })
    return out


def diff_checkpoints(
    store: CheckpointStore, a: int, b: int, *, key: bytes | None = None,
    use_env_key: bool = True,
) -> dict[str, Any]:
    """What advanced from checkpoint ``a`` to ``b``.

    Windows are compared by identity ``(key, window_start, window_end)``: open in A and
    not in B = closed (fired, or dropped), open in B and not in A = opened. A session
    in B that grew from (covers) sessions of A is counted as ``extended``, not as a
    close plus an open. Emitted outputs come from the receipts' totals.
    Raises CheckpointError when either manifest or state file cannot be verified.
    """
    if key is None and use_env_key:
        key = checkpoint_key()
    la, lb = _verified(store, a, key), _verified(store, b, key)
    va, vb = judge_checkpoint(store, a, key), judge_checkpoint(store, b, key)
    da, db = la.doc or {}, lb.doc or {}
    assert la.state is not None and lb.state is not None
    ia, ib = _ids(la.state), _ids(lb.state)
    only_a = ia.join(ib, on=WINDOW_ID, how="anti")
    only_b = ib.join(ia, on=WINDOW_ID, how="anti")
    both = ia.join(ib, on=WINDOW_ID, how="semi").height
    pairs = only_a.join(only_b, on=[KEY, KEY_IS_INT], how="inner", suffix="_b").filter(
        (pl.col(f"{WSTART}_b") <= pl.col(WSTART)) & (pl.col(f"{WEND}_b") >= pl.col(WEND))
    )
    absorbed = pairs.select(WINDOW_ID).unique().height
    extended = pairs.select(KEY, KEY_IS_INT, f"{WSTART}_b", f"{WEND}_b").unique().height

    parts = _partition_deltas(da, db)
    ga = _dict(da.get("watermark")).get("global_ms")
    gb = _dict(db.get("watermark")).get("global_ms")
    ra, rb = _dict(da.get("receipts")), _dict(db.get("receipts"))
    ca, cb = _dict(da.get("counters")), _dict(db.get("counters"))
    counters = {
        k: {"a": _int(ca.get(k)), "b": _int(cb.get(k)), "delta": _delta(ca.get(k), cb.get(k))}
        for k in sorted(set(ca) | set(cb))
    }
    return {
        "directory": store.location,
        "a": {"id": a, "verdict": va.verdict, "reason": va.reason, "epoch": _int(da.get("epoch")),
              "created_ms": _int(da.get("created_ms"))},
        "b": {"id": b, "verdict": vb.verdict, "reason": vb.reason, "epoch": _int(db.get("epoch")),
              "created_ms": _int(db.get("created_ms"))},
        "same_pipeline": da.get("fingerprint") == db.get("fingerprint"),
        "watermark": {
            "global_ms": [wm_json(ga), wm_json(gb)],
            "global_iso": [wm_iso(ga), wm_iso(gb)],
            "delta_ms": _delta(ga, gb),
        },
        "partitions": parts,
        "windows": {
            "open": [la.state.height, lb.state.height],
            "opened": only_b.height - extended,
            "closed": only_a.height - absorbed,
            "extended": extended,
            "still_open": both,
        },
        "emitted": {role: _delta(ra.get(role), rb.get(role))
                    for role in ("results", "late", "errors")},
        "state_bytes": {"a": la.state_bytes, "b": lb.state_bytes,
                        "delta": _delta(la.state_bytes, lb.state_bytes)},
        "counters": counters,
    }


# --------------------------------------------------------------------------- export
def _spec_order(aggs_def: Mapping[str, Any], order: Any) -> list[str]:
    """The aggregates' names in the spec's order, as the manifest's ``aggregate_order``
    records it; in name order for a checkpoint without it (or with one that does not
    name exactly the definition's aggregates)."""
    if (isinstance(order, list) and all(isinstance(n, str) for n in order)
            and len(order) == len(aggs_def) and set(order) == set(aggs_def)):
        return list(order)
    return sorted(aggs_def)


def _accumulators(definition: Mapping[str, Any], order: Any = None) -> Accumulators:
    aggs_def = _dict(definition.get("aggregates"))
    source = _dict(definition.get("source"))
    key = source.get("key")
    named = isinstance(key, list) and bool(key) and all(isinstance(k, str) for k in key)
    if not aggs_def or not (isinstance(key, str) or named) or not isinstance(
        source.get("time"), str
    ):
        raise CheckpointError("the manifest's pipeline definition lacks aggregates or source")
    try:
        aggs: list[Aggregate] = [parse_aggregate(n, aggs_def[n])
                                 for n in _spec_order(aggs_def, order)]
    except SpecError as exc:
        raise CheckpointError(f"the manifest's aggregates cannot be read: {exc}") from None
    plan = FieldPlan(key=",".join(key) if isinstance(key, list) else str(key),
                     time=source["time"],
                     fields=field_kinds(aggs), decimals=_decimals(definition))
    return Accumulators(tuple(aggs), plan, named_key=named)


def _decimals(definition: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """The decimal fields of a manifest's definition (``types``: field -> [P, S])."""
    out: dict[str, tuple[int, int]] = {}
    for f, ps in _dict(definition.get("types")).items():
        if not (isinstance(ps, list) and len(ps) == 2
                and all(type(x) is int and 0 <= x <= 38 for x in ps)):
            raise CheckpointError(f"the manifest's type of field {f!r} cannot be read")
        out[str(f)] = (ps[0], ps[1])
    return out


def open_windows_table(
    store: CheckpointStore, cid: int, *, force: bool = False, key: bytes | None = None,
    use_env_key: bool = True,
) -> tuple[pl.DataFrame, guard.Verdict]:
    """The open windows of ``cid`` with each aggregate's current partial value.

    Columns as :meth:`Accumulators.finalize` gives them: ``key``, ``__kint``,
    ``window_start``, ``window_end``, one column per aggregate in the spec's order
    (the manifest's ``aggregate_order``; name order for checkpoints without it) and
    ``__json`` (the row as a result line, with per-row types). First/last of a field
    that met non-numbers are JSON text in their column (see :func:`typed_for_parquet`).
    Refuses (CheckpointError) unless the checkpoint is ``ATOMIC_CHECKPOINT`` or
    ``force``; even forced, the state must match its recorded SHA-256.
    """
    if key is None and use_env_key:
        key = checkpoint_key()
    verdict = judge_checkpoint(store, cid, key)
    if not verdict.ok and not force:
        raise CheckpointError(
            f"checkpoint {cid} is {verdict.verdict} ({verdict.reason}): {verdict.message}; "
            "only an ATOMIC_CHECKPOINT is exported (use --force to export it anyway)"
        )
    loaded = _load(store, cid)
    if loaded.doc is None:
        raise CheckpointError(f"checkpoint {cid}: {loaded.manifest_error}")
    if loaded.state is None:
        raise CheckpointError(f"checkpoint {cid}: {loaded.state_error}")
    acc = _accumulators(_dict(loaded.doc.get("definition")), loaded.doc.get("aggregate_order"))
    expected = {KEY: pl.String(), KEY_IS_INT: pl.Boolean(), WSTART: pl.Int64(),
                WEND: pl.Int64(), **acc.schema()}
    problem = f"checkpoint {cid}: state columns {list(loaded.state.schema)} do not match " \
        f"the manifest's aggregates (expected {list(expected)})"
    if list(loaded.state.schema) != list(expected):
        raise CheckpointError(problem)
    try:  # as the window operator restores it (exact decimals back to Int128 sums)
        state = loaded.state.cast(expected)  # type: ignore[arg-type]
    except pl.exceptions.PolarsError:
        raise CheckpointError(problem) from None
    try:
        return acc.finalize(state), verdict
    except pl.exceptions.PolarsError as exc:
        raise CheckpointError(
            f"checkpoint {cid}: open windows cannot be evaluated ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:200]})"
        ) from None


def typed_for_parquet(table: pl.DataFrame) -> pl.DataFrame:
    """The open windows as typed columns: drop ``__json``/``__kint``; ``key`` is Int64
    when every key is an integer; every aggregate column of JSON text (first/last of a
    field that met non-numbers) becomes typed by :func:`typed_json`."""
    kint = table.get_column(KEY_IS_INT).fill_null(False)
    out = table.drop("__json", KEY_IS_INT)
    out = out.with_columns(
        typed_json(out.get_column(c)) for c, dtype in out.schema.items()
        if dtype == pl.String and c not in ("key", WSTART, WEND)
    )
    if table.height and bool(kint.all()):
        try:
            return out.with_columns(pl.col("key").cast(pl.Int64, strict=True))
        except pl.exceptions.PolarsError:
            return out
    return out


def typed_json(column: pl.Series) -> pl.Series:
    """A column of JSON texts (one value per row, or null) as one typed column.

    Every value a string: String (the strings themselves, without JSON quotes); every
    value an integer: Int64 (Float64 when one is beyond 64 bits); every value a number:
    Float64; every value a boolean: Boolean. **choice:** a column that mixes these
    kinds (or holds objects or arrays) is String: strings as themselves, anything else
    as its JSON text (``1``, ``2.5``, ``true``, ``{"a":1}``), so ``1`` and ``"1"`` look
    the same there; the JSON Lines export keeps each value's own type. Null (and the
    text ``null``) stays null. Columnar: no Python loop over the rows.
    """
    name = column.name
    s = pl.select(pl.when(column == "null").then(None).otherwise(column).alias(name)
                  ).to_series()

    def every(mask: pl.Series) -> bool:
        return bool(mask.fill_null(True).all())

    quoted = s.str.starts_with('"')
    if not s.len() or s.null_count() == s.len():
        return s
    if every(quoted):
        return s.str.json_decode(pl.String).alias(name)
    if every(s.str.contains(r"^-?[0-9]+$")):
        try:
            return s.cast(pl.Int64, strict=True)
        except pl.exceptions.PolarsError:
            return s.cast(pl.Float64)
    if every(s.str.contains(r"^-?[0-9]")):
        return s.cast(pl.Float64)
    if every(s.is_in(["true", "false"])):
        return (s == "true").alias(name)
    strings = quoted.fill_null(False)
    if not strings.any():
        return s
    decoded = s.filter(strings).str.json_decode(pl.String)
    return s.scatter(strings.arg_true(), decoded)


# --------------------------------------------------------------------------- prune
@dataclass
class PrunePlan:
    """What ``prune --keep N`` does; ids newest first."""

    keep: list[int] = field(default_factory=list)
    delete: list[int] = field(default_factory=list)
    move: list[tuple[int, str, str]] = field(default_factory=list)  # (id, verdict, reason)
    untouched: list[tuple[int, str]] = field(default_factory=list)  # (id, why)
    newest_atomic: int | None = None
    seen: list[int] = field(default_factory=list)


def plan_prune(
    store: CheckpointStore, keep: int, *, job_running: bool, key: bytes | None = None,
    use_env_key: bool = True,
) -> PrunePlan:
    """Keep the ``keep`` newest ATOMIC checkpoints; delete older ATOMIC ones; move the
    non-ATOMIC ones older than the newest ATOMIC one aside (and, when no job runs,
    the newer ones too, as recovery would). Nothing is planned when no checkpoint is
    ATOMIC. While a job runs, nothing at or above the newest ATOMIC one is touched, nor
    a PARTIAL one (files missing: the job's retention may be deleting it this instant),
    nor the oldest one (the one the job's retention removes next), so that prune and the
    job's retention rarely reach for the same checkpoint at the same instant.
    Checkpoints holding a file that a kept (or untouched) checkpoint references are
    not removed."""
    if keep < 1:
        raise SpecError(f"--keep: must be >= 1, got {keep}")
    if key is None and use_env_key:
        key = checkpoint_key()
    ids = sorted(store.ids(), reverse=True)
    plan = PrunePlan(seen=ids)
    verdicts = {cid: judge_checkpoint(store, cid, key) for cid in ids}
    atomic = [cid for cid in ids if verdicts[cid].ok]
    if not atomic:
        plan.untouched = [(cid, "no checkpoint is ATOMIC_CHECKPOINT") for cid in ids]
        return plan
    newest = atomic[0]
    plan.newest_atomic = newest
    plan.keep = atomic[:keep]
    candidates: list[int] = []
    oldest = ids[-1]
    for cid in ids:
        if cid in plan.keep:
            continue
        if cid > newest and job_running:
            plan.untouched.append((cid, "newer than the newest ATOMIC checkpoint while a job "
                                        "runs (it may be being written)"))
            continue
        if cid == oldest and job_running:
            # what the job's retention removes next: leave it to the job rather than race it
            plan.untouched.append((cid, "the oldest checkpoint while a job runs (the job's own "
                                        "retention removes it next)"))
            continue
        candidates.append(cid)
    protected: dict[str, int] = {}
    for cid in plan.keep + [c for c, _ in plan.untouched]:
        for rel in store.files_of(cid):
            protected.setdefault(rel, cid)
    for cid in candidates:
        prefix = f"{checkpoint_dirname(cid)}/"
        holder = next((owner for rel, owner in protected.items() if rel.startswith(prefix)),
                      None)
        if holder is not None:
            plan.untouched.append((cid, f"holds files that checkpoint {holder} references"))
            continue
        v = verdicts[cid]
        if v.ok:
            plan.delete.append(cid)
        elif job_running and v.verdict == guard.PARTIAL:
            # files missing: possibly the running job's retention deleting it right now
            plan.untouched.append((cid, f"{v.verdict} ({v.reason}) while a job runs: it may "
                                        "be being removed by the job's own retention"))
        else:
            plan.move.append((cid, v.verdict, v.reason))
    return plan
