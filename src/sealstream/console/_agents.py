"""An agent store's threads for the console: what ``checkpoints verify`` reports on it
(every checkpoint's verdict, the head, pending approvals, checkpoints moved aside by
repairs) plus the whole effect ledger, reconciled entries included, and each
checkpoint's parent, time and node: a checkpoint whose parent is not the checkpoint
before it in the thread is a *fork* (a LangGraph ``copy_thread`` or an update from an
older checkpoint) and is marked so."""

from __future__ import annotations

from typing import Any

from sealstream.console._stores import READ_ERRORS


def threads(location: str) -> dict[str, Any]:
    """``{"executions": [...], "error": None}``, or the reason the store cannot be read."""
    from sealstream.agents import AgentCheckpointStore, EffectLedger
    from sealstream.cli._agents import _open, report

    try:
        data = report(location)
    except READ_ERRORS as exc:
        return {"executions": [], "error": str(exc) or type(exc).__name__}
    store: AgentCheckpointStore = _open(location)
    try:
        for e in data["executions"]:
            _lineage(store, e)
            try:
                ledger = EffectLedger(store, e["execution"], e["namespace"])
                e["ledger"] = [x.to_json() for x in ledger.effects()]
            except READ_ERRORS as exc:
                e["ledger"] = []
                e["ledger_problems"] = [*e.get("ledger_problems", []), str(exc)]
    finally:
        store.close()
    data["error"] = None
    return data


def _lineage(store: Any, e: dict[str, Any]) -> None:
    """Add ``parent``, ``created_ms``, ``node`` and ``fork`` to each checkpoint of ``e``."""
    try:
        verdicts = store.history(e["execution"], e["namespace"])
    except READ_ERRORS:
        return
    docs = {v.checkpoint_id: v.manifest for v in verdicts}
    order = [c["id"] for c in e["checkpoints"]]  # newest first
    for n, c in enumerate(e["checkpoints"]):
        m = docs.get(c["id"]) or {}
        body: dict[str, Any] = m["body"] if isinstance(m.get("body"), dict) else {}
        parent = m.get("parent") if isinstance(m.get("parent"), str) else None
        older = order[n + 1] if n + 1 < len(order) else None
        c["parent"] = parent
        c["created_ms"] = m.get("created_ms") if isinstance(m.get("created_ms"), int) else None
        c["node"] = body.get("node") if isinstance(body.get("node"), str) else None
        c["fork"] = parent is not None and older is not None and parent != older
