"""What ``sealstream checkpoints inspect|diff|export|prune`` print (and export writes).

The computations live in :mod:`sealstream.inspect` (read-only) and
:mod:`sealstream.cli._prune`; this module renders their JSON-ready dicts as rich
tables and writes export files.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sealstream.checkpoint import guard
from sealstream.checkpoint.stores import LocalCheckpointStore
from sealstream.errors import SinkError, SpecError
from sealstream.inspect import open_windows_table, typed_for_parquet, wm_iso
from sealstream.sinks._files import fsync_dir, fsync_file, os_reason

_COLOURS = {guard.ATOMIC: "green", guard.PARTIAL: "yellow", guard.INCONSISTENT: "red"}


def _verdict(verdict: str, reason: str) -> str:
    return f"[{_COLOURS.get(verdict, 'white')}]{verdict}[/] ({reason})"


def _s(value: Any) -> str:
    return "-" if value is None else str(value)


def _age(ms: Any) -> str:
    if not isinstance(ms, int):
        return "-"
    sign, ms = ("-", -ms) if ms < 0 else ("", ms)
    s = ms // 1000
    d, s = divmod(s, 86_400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{sign}{d}d {h}h {m}m"
    if h:
        return f"{sign}{h}h {m}m {s}s"
    if m:
        return f"{sign}{m}m {s}s"
    return f"{sign}{ms / 1000:.1f}s"


def _wm_text(ms: Any, iso: Any) -> str:
    if ms is None:
        return "-"
    if isinstance(ms, str):
        return ms
    return f"{ms} ({iso})" if iso else str(ms)


# --------------------------------------------------------------------------- inspect
def add_kafka_lag(data: dict[str, Any], spec: Path) -> None:
    """With a Kafka source in ``spec``: each partition's ``end_offset`` (the broker's,
    now) and ``lag`` (end - next offset), None when the broker does not answer."""
    from sealstream.pipeline import KafkaSourceSpec, load_spec

    source = load_spec(spec).source
    if not isinstance(source, KafkaSourceSpec):
        return
    from sealstream.sources.kafka import end_offsets

    names = [str(p["partition"]) for p in data["partitions"]]
    ends = end_offsets(source.settings(), names)
    data["source_reachable"] = ends is not None
    for p in data["partitions"]:
        end = None if ends is None else ends.get(str(p["partition"]))
        nxt = p.get("next_offset")
        p["end_offset"] = end
        p["lag"] = max(0, end - nxt) if end is not None and isinstance(nxt, int) else None


def render_inspect(data: dict[str, Any]) -> None:
    console = Console(highlight=False)
    t = Table(title=f"checkpoint {data['id']} in {data['directory']}", show_header=False)
    t.add_column("field", style="bold")
    t.add_column("value", overflow="fold")
    t.add_row("verdict", _verdict(data["verdict"], data["reason"]))
    t.add_row("detail", data["message"])
    t.add_row("pipeline", f"{_s(data['pipeline'])}  fingerprint {_s(data['fingerprint'])}")
    t.add_row("format", f"manifest {_s(data['format'])}, state {_s(data['state_format'])}")
    t.add_row("parent / epoch", f"{_s(data['parent'])} / {_s(data['epoch'])}")
    age = data["age_ms"]
    if isinstance(age, int) and age < 0:  # the clock went back since it was written
        t.add_row("created", f"{_s(data['created_iso'])} ([yellow]written {_age(-age)} in the "
                  "future (clock went back?)[/])")
    else:
        t.add_row("created", f"{_s(data['created_iso'])} (age {_age(age)})")
    sig = data["signer"]
    key = "set" if sig["key_set"] else "not set"
    t.add_row("signer", f"{sig['description']}; SEALSTREAM_CHECKPOINT_KEY {key}")
    wm = data["watermark"]
    t.add_row("watermark", f"{_wm_text(wm['global_ms'], wm['global_iso'])}; max delay "
              f"{_s(wm['max_delay_ms'])} ms, lateness {_s(wm['lateness_ms'])} ms")
    w = data["windows"]
    open_txt = _s(w["open"])
    if not w["read"] and w["open"] is not None:
        open_txt += " (from the manifest; state not read)"
    t.add_row("open windows", f"{open_txt} ({_s(w['kind'])}); keys {_s(w['keys'])}")
    t.add_row("oldest window", _wm_text(w["oldest_start_ms"], w["oldest_start_iso"]))
    st = data["state"]
    state_txt = f"{_s(st['bytes'])} bytes"
    if st["error"]:
        state_txt += f" [yellow]({st['error']})[/]"
    t.add_row("state", state_txt)
    dist = data.get("distributed")
    if dist:
        parts = "; ".join(
            f"{_s(p['worker'])}: {_s(p['state_rows'])} rows, {_s(p['bytes'])} bytes"
            + ("" if p["sha256_ok"] else " [yellow](does not verify)[/]")
            for p in dist["parts"])
        t.add_row("workers", f"{_s(dist['workers'])} (parts: {parts})")
    r = data["receipts"]
    tot = r["totals"]
    t.add_row("receipts (total)", f"results {_s(tot.get('results'))}, late "
              f"{_s(tot.get('late'))}, errors {_s(tot.get('errors'))}")
    last = r["last_epoch"]
    if last is not None:
        t.add_row("receipts (last epoch)", f"epoch {_s(last['epoch'])}: results "
                  f"{_s(last['results'])}, late {_s(last['late'])}, errors {_s(last['errors'])}")
    if data["counters"]:
        t.add_row("counters", ", ".join(f"{k} {v}" for k, v in sorted(data["counters"].items())))
    for p in data["problems"]:
        t.add_row("[yellow]problem[/]", p)
    console.print(t)
    if data["partitions"]:
        pt = Table(title="partitions (times in UTC)")
        pt.add_column("partition", no_wrap=True)
        lag = any(p.get("lag") is not None for p in data["partitions"])
        # bytes read: file partitions only (a broker's partition has offsets, not bytes)
        nbytes = any(p.get("byte_offset") is not None for p in data["partitions"])
        for col in ("next offset", *(("bytes read",) if nbytes else ()), "watermark",
                    "max event time", "ended", *(("lag (broker now)",) if lag else ())):
            # a time is two lines, date then time of day (at 80 columns the ISO text
            # folded over three); the rest folds
            pt.add_column(col, no_wrap=col in ("watermark", "max event time"),
                          overflow="fold")
        for p in data["partitions"]:
            pt.add_row(_s(p["partition"]), _s(p["next_offset"]),
                       *((_s(p["byte_offset"]),) if nbytes else ()),
                       _day_time(p["watermark_iso"]), _day_time(wm_iso(p["max_time_ms"])),
                       _s(p["exhausted"]), *((_s(p.get("lag")),) if lag else ()))
        console.print(pt)
    kafka = [o for o in data.get("outputs", []) if o["kafka"] is not None]
    if kafka:
        kt = Table(title="Kafka outputs (epochs before this one are committed below these "
                         "offsets)")
        for col in ("output", "topic", "epoch", "committed offsets", "tokens"):
            kt.add_column(col, overflow="fold")
        for o in kafka:
            offs = ", ".join(f"p{p}={v}" for p, v in o["kafka"]["committed_offsets"].items())
            kt.add_row(o["output"], o["kafka"]["topic"], _s(o["epoch"]), offs or "-",
                       ", ".join(o["tokens"]) or "-")
        console.print(kt)
    if data["files"]:
        ft = Table(title="files")
        for col in ("role", "path", "bytes", "recorded", "sha256"):
            ft.add_column(col)
        for f in data["files"]:
            ok = f["sha256_ok"]
            mark = "-" if ok is None else ("[green]ok[/]" if ok else "[red]mismatch[/]")
            ft.add_row(_s(f["role"]), _s(f["path"]), _s(f["bytes"]), _s(f["recorded_bytes"]),
                       mark)
        console.print(ft)


def _day_time(iso: str | None) -> str:
    """An ISO time in a table cell: the date over the time of day (two short lines)."""
    return _s(iso).replace("T", "\n", 1)


# --------------------------------------------------------------------------- diff
def render_diff(data: dict[str, Any]) -> None:
    console = Console(highlight=False)
    a, b = data["a"], data["b"]
    t = Table(title=f"checkpoint {a['id']} -> {b['id']} in {data['directory']}")
    for col in ("", f"A = {a['id']}", f"B = {b['id']}", "delta"):
        t.add_column(col, overflow="fold")
    t.add_row("verdict", _verdict(a["verdict"], a["reason"]), _verdict(b["verdict"], b["reason"]),
              "")
    t.add_row("epoch", _s(a["epoch"]), _s(b["epoch"]), "")
    wm = data["watermark"]
    t.add_row("watermark", _wm_text(wm["global_ms"][0], wm["global_iso"][0]),
              _wm_text(wm["global_ms"][1], wm["global_iso"][1]), _s(wm["delta_ms"]))
    w = data["windows"]
    t.add_row("open windows", _s(w["open"][0]), _s(w["open"][1]),
              f"opened {w['opened']}, closed {w['closed']}, extended {w['extended']}, "
              f"still open {w['still_open']}")
    sb = data["state_bytes"]
    t.add_row("state bytes", _s(sb["a"]), _s(sb["b"]), _s(sb["delta"]))
    em = data["emitted"]
    t.add_row("emitted", "", "", f"results {_s(em['results'])}, late {_s(em['late'])}, "
              f"errors {_s(em['errors'])}")
    for name, c in data["counters"].items():
        t.add_row(name, _s(c["a"]), _s(c["b"]), _s(c["delta"]))
    console.print(t)
    if not data["same_pipeline"]:
        console.print("[yellow]the two checkpoints have different pipeline fingerprints[/]")
    pt = Table(title="partitions (times in UTC)")
    pt.add_column("partition", no_wrap=True)
    for col in ("offset A", "offset B", "delta", "watermark A", "watermark B", "wm delta ms"):
        pt.add_column(col, no_wrap=col.startswith("watermark"), overflow="fold")
    for p in data["partitions"]:
        pt.add_row(_s(p["partition"]), _s(p["next_offset"][0]), _s(p["next_offset"][1]),
                   _s(p["delta"]), _day_time(wm_iso(p["watermark_ms"][0])),
                   _day_time(wm_iso(p["watermark_ms"][1])), _s(p["watermark_delta_ms"]))
    console.print(pt)


# --------------------------------------------------------------------------- export
PLAINTEXT_NOTE = ("the export is plaintext although the checkpoints are encrypted at rest "
                  "(written with mode 0600): keep it as safe as the key")

def export(store: LocalCheckpointStore, cid: int, to: Path, *, force: bool,
           replace: bool = False) -> dict[str, Any]:
    """Write the open windows of ``cid`` to ``to`` (.parquet or .jsonl), atomically.
    An existing ``to`` is replaced only with ``replace``; never inside the store.

    The file is always created with mode 0600 (it holds the job's keys and values);
    the result's ``note`` says so when the store is encrypted at rest, since the export
    itself is plaintext. Columns follow the spec's aggregate order; Parquet values are
    typed (see :func:`sealstream.inspect.typed_json`)."""
    suffix = to.suffix.lower()
    if suffix not in (".parquet", ".jsonl"):
        raise SpecError(f"--to: {str(to)!r} must end with .parquet or .jsonl")
    target = to.resolve()
    root = store.root.resolve()
    if target == root or root in target.parents:
        raise SpecError(f"--to: {str(to)!r} is inside the checkpoint directory {store.root}")
    if to.exists() and not replace:
        raise SpecError(f"--to: {str(to)!r} exists; pass --replace to replace it")
    table, verdict = open_windows_table(store, cid, force=force)
    parent = to.parent if str(to.parent) else Path(".")
    if not parent.is_dir():
        raise SinkError(f"cannot write {to}: directory {parent} does not exist")
    tmp = parent / f".{to.name}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                     0o600)
        with os.fdopen(fd, "wb") as f:
            if suffix == ".jsonl":
                lines = table.get_column("__json").to_list()
                f.write("".join(f"{line}\n" for line in lines).encode())
            else:
                typed_for_parquet(table).write_parquet(f)
            fsync_file(f)
        os.replace(tmp, to)
        fsync_dir(parent)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise SinkError(f"cannot write {to}: {os_reason(exc)}") from None
    return {
        "id": cid,
        "verdict": verdict.verdict,
        "reason": verdict.reason,
        "forced": not verdict.ok,
        "rows": table.height,
        "to": str(to),
        "format": suffix[1:],
        "columns": [c for c in table.columns if c not in ("__json", "__kint")],
        "mode": "0600",
        "note": (PLAINTEXT_NOTE if getattr(store, "encrypted", False) else None),
    }


def render_export(data: dict[str, Any]) -> None:
    console = Console(highlight=False)
    note = "" if not data["forced"] else (
        f" [yellow](forced: checkpoint is {data['verdict']}, {data['reason']})[/]")
    console.print(f"exported {data['rows']} open windows of checkpoint {data['id']} to "
                  f"{data['to']} ({data['format']}){note}", soft_wrap=True)
    if data.get("note"):
        Console(stderr=True, highlight=False).print(f"note: {data['note']}", soft_wrap=True)


# --------------------------------------------------------------------------- prune
def render_prune(data: dict[str, Any]) -> None:
    console = Console(highlight=False)
    would = "would " if data["dry_run"] else ""
    if data["job_running"]:
        console.print(f"a job holds the directory ({data['job_running']}): the newest ATOMIC "
                      "checkpoint and newer ones are left alone")
    if data["newest_atomic"] is None:
        console.print("no checkpoint is ATOMIC_CHECKPOINT: nothing pruned")
        return
    for cid in data["deleted"]:
        console.print(f"{would}delete checkpoint {cid} (ATOMIC_CHECKPOINT, superseded)")
    for m in data["moved"]:
        where = f" to {m['to']}" if m["to"] else " to rejected/"
        console.print(f"{would}move checkpoint {m['id']} ({m['verdict']}: {m['reason']}){where}")
    for cid in data["vanished"]:
        console.print(f"checkpoint {cid} disappeared meanwhile (removed by the running job)")
    for u in data["untouched"]:
        console.print(f"left checkpoint {u['id']} alone: {u['why']}")
    kept = ", ".join(str(c) for c in data["kept"])
    console.print(f"{'would keep' if data['dry_run'] else 'kept'} {len(data['kept'])} ATOMIC "
                  f"checkpoint(s): {kept} (newest {data['newest_atomic']})")
