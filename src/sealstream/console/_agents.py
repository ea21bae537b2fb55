"""An agent store's threads for the console: what ``checkpoints verify`` reports on it
(every checkpoint's verdict, the head, pending approvals, checkpoints moved aside by
repairs) plus the whole effect ledger, reconciled entries included."""

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
