"""``sealstream checkpoints list/verify/inspect`` on an agent store, and
``sealstream agents repair``.

An *agent store* is a database holding the agent layer's ``agent_rows`` table
(:mod:`sealstream.agents`): ``sqlite:///FILE``, a plain SQLite file path, or a
``postgresql://`` URL without stream checkpoints, or ``s3://bucket/prefix`` whose
``LEASE`` is an agent store's (:mod:`sealstream.agents._s3store`). Inspection
(``list/verify/inspect``, the console) reads S3 without the writer's lease and writes
nothing; ``agents repair`` takes the lease like a saver. Keys come from
``SEALSTREAM_CHECKPOINT_KEY`` / ``SEALSTREAM_ENCRYPTION_KEY`` as everywhere else.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import click

from sealstream.errors import SealstreamError, SpecError


def _sqlite_file(location: str) -> Path | None:
    if location.startswith("sqlite:///"):
        return Path(location[len("sqlite:///"):])
    if "://" not in location and Path(location).is_file():
        return Path(location)
    return None


def _tables(location: str) -> set[str]:
    db = _sqlite_file(location)
    if db is not None:
        if not db.is_file():
            return set()
        try:
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            try:
                rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                return {str(r[0]) for r in rows}
            finally:
                conn.close()
        except sqlite3.Error:
            return set()
    if location.startswith(("postgresql://", "postgres://")):
        try:
            import psycopg

            with psycopg.connect(location, connect_timeout=10) as pg:
                found = pg.execute("SELECT tablename FROM pg_tables WHERE schemaname = "
                                   "current_schema()").fetchall()
                return {str(r[0]) for r in found}
        except Exception:  # not reachable: let the stream commands report it
            return set()
    return set()


def _shown(location: str) -> str:
    from sealstream.checkpoint.stores import redact

    return redact(location) if "://" in location else location


def _is_s3(location: str) -> bool:
    return location.lower().startswith("s3://")


def is_agent_store(location: str) -> bool:
    """Whether ``location`` holds agent checkpoints and no stream checkpoints (S3: one
    GET of its ``LEASE``, nothing written)."""
    if _is_s3(location):
        from sealstream.agents._s3store import is_agent_prefix

        return is_agent_prefix(location)
    tables = _tables(location)
    return "agent_rows" in tables and "sealstream_checkpoints" not in tables


def _must_be_readable(location: str) -> None:
    """Raise the one line saying why ``location`` cannot be read (a missing file, a
    server that does not answer): ``is_agent_store`` answers False for those so that
    the stream commands report them, but ``agents repair`` has no such fallback."""
    from sealstream.errors import CheckpointError

    if _is_s3(location):
        from sealstream._objects import ObjectStoreError, open_objects
        from sealstream.agents._s3store import LEASE

        try:
            open_objects(location).get(LEASE)
        except ObjectStoreError as exc:
            raise CheckpointError(f"cannot read {_shown(location)}: {exc}") from None
    elif location.startswith(("postgresql://", "postgres://")):
        import psycopg

        try:
            psycopg.connect(location, connect_timeout=10).close()
        except psycopg.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(f"cannot connect to {_shown(location)}: {first}") from None
    else:
        path = Path(location[len("sqlite:///"):] if location.startswith("sqlite:///")
                    else location)
        if not path.exists():
            raise SpecError(f"{_shown(location)}: no such file")


def _open(location: str, *, write: bool = False) -> Any:
    """The agent store at ``location``; on S3 read-only (no lease) unless ``write``."""
    from sealstream.agents import AgentCheckpointStore

    if _is_s3(location) and not write:
        from sealstream.agents._s3store import S3RowReader

        return AgentCheckpointStore(S3RowReader(location))
    db = _sqlite_file(location)
    return AgentCheckpointStore(db if db is not None else location)


def _histories(store: Any) -> list[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    with store.rows.transaction() as tx:
        for space in ("cp", "meta", "fx", "ap"):
            out |= {(k[1], k[2]) for k in tx.keys(space, None)}
    return sorted(out)


def report(location: str) -> dict[str, Any]:
    """Per execution and namespace: checkpoint verdicts (newest first), the head,
    pending approvals, open ledger intents, checkpoints moved aside."""
    from sealstream.agents import EffectLedger

    store = _open(location)
    try:
        executions = []
        for ex, ns in _histories(store):
            verdicts = store.history(ex, ns)
            with store.rows.transaction() as tx:
                head, problem = store.head(tx, ex, ns)
            ledger = EffectLedger(store, ex, ns)
            entry: dict[str, Any] = {
                "execution": ex, "namespace": ns, "head": head,
                "head_problem": None if problem is None else problem.to_json(),
                "checkpoints": [v.to_json() for v in verdicts],
                "moved_aside": store.quarantined(ex, ns)}
            try:
                entry["pending_approvals"] = [
                    {"id": a.approval_id, "payload": dict(a.payload)}
                    for a in ledger.pending_approvals()]
                entry["open_intents"] = [e.to_json() for e in ledger.effects() if not e.done]
                entry["ledger_problems"] = []
            except SealstreamError as err:
                entry["pending_approvals"], entry["open_intents"] = [], []
                entry["ledger_problems"] = [str(err)]
            executions.append(entry)
        return {"store": store.rows.location, "kind": "agents", "executions": executions}
    finally:
        store.close()


def ok(data: dict[str, Any]) -> bool:
    return all(all(c["verdict"] == "ATOMIC_CHECKPOINT" for c in e["checkpoints"])
               and not e["ledger_problems"] for e in data["executions"])


def render(data: dict[str, Any], command: str, checkpoint_id: str | None = None) -> None:
    click.echo(f"agent store {data['store']}: {len(data['executions'])} execution(s)")
    for e in data["executions"]:
        ns = f" [{e['namespace']}]" if e["namespace"] else ""
        click.echo(f"- {e['execution']}{ns}: {len(e['checkpoints'])} checkpoint(s), "
                   f"head {e['head'] or '-'}, {len(e['pending_approvals'])} pending "
                   f"approval(s), {len(e['open_intents'])} open intent(s)")
        for c in e["checkpoints"]:
            if command == "list" and c["verdict"] == "ATOMIC_CHECKPOINT":
                click.echo(f"    {c['id']}")
            elif checkpoint_id is None or c["id"] == checkpoint_id:
                click.echo(f"    {c['id']}  {c['verdict']} ({c['reason']})"
                           + ("" if c["verdict"] == "ATOMIC_CHECKPOINT"
                              else f": {c['message']}"))
        for a in e["pending_approvals"]:
            click.echo(f"    approval pending: {a['id']} {json.dumps(a['payload'])}")
        for i in e["open_intents"]:
            click.echo(f"    open intent: {i['key']} ({i['tool']}, step {i['step']})")
        for m in e["moved_aside"]:
            click.echo(f"    moved aside: {m}")
        for p in e["ledger_problems"]:
            click.echo(f"    ledger: {p}")


def run(location: str, command: str, as_json: bool, checkpoint_id: str | None = None) -> int:
    """``checkpoints list/verify/inspect`` on an agent store; the exit code."""
    data = report(location)
    if checkpoint_id is not None:
        data["executions"] = [e for e in data["executions"]
                              if any(c["id"] == checkpoint_id for c in e["checkpoints"])]
        if not data["executions"]:
            raise SpecError(f"no checkpoint {checkpoint_id!r} in {data['store']}")
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        render(data, command, checkpoint_id)
    return 1 if command == "verify" and not ok(data) else 0


@click.group("agents")
def agents() -> None:
    """Agent checkpoint stores (LangGraph threads, agent executions)."""


@agents.command("repair")
@click.argument("store", type=str)
@click.option("--execution", default=None, help="Only this execution (thread) id.")
@click.option("--dry-run", is_flag=True, help="Only say what would be done.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def repair_cmd(store: str, execution: str | None, dry_run: bool, as_json: bool) -> None:
    """Move damaged checkpoints in STORE aside as evidence (never deleted) and
    re-establish a verified head in every history that needs it.

    STORE is sqlite:///FILE, a SQLite file path, postgresql://HOST/DB or
    s3://BUCKET/PREFIX (the writer's lease is taken: refused while a saver holds it)."""
    if not is_agent_store(store):
        _must_be_readable(store)
        what = "no agent LEASE" if _is_s3(store) else "no agent_rows table"
        raise SpecError(f"{_shown(store)}: not an agent store ({what})")
    opened = _open(store, write=True)
    try:
        done = opened.repair(execution, dry_run=dry_run)
    finally:
        opened.close()
    if as_json:
        click.echo(json.dumps({"repaired": done, "dry_run": dry_run}, indent=2))
        return
    if not done:
        click.echo("nothing to repair: every history has a verified head")
    for e in done:
        verb = "would move" if dry_run else "moved"
        click.echo(f"{e['execution']}{' [' + e['namespace'] + ']' if e['namespace'] else ''}: "
                   f"{verb} aside {e['moved_aside'] or 'nothing'}; gone {e['gone'] or '-'}; "
                   f"head {e['head_before'] or '-'}"
                   + ("" if dry_run else f" -> {e.get('head_after') or '-'}"))
