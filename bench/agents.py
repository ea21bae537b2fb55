"""Agent checkpoint savers side by side: SealstreamSaver vs LangGraph's SqliteSaver
(SQLite) and PostgresSaver (PostgreSQL), in one run.

    python -m bench.agents [--checkpoints N] [--pg URL] [--skip-pg]

At N checkpoints of 10 KB in one thread: put, put_writes, get_tuple (latest and by
id), list (all, and limit 10); 16 concurrent ``ainvoke`` runs x 20 steps on the
async savers; the head read at 100 / 1,000 / 3,000 checkpoints (both backends); on
SQLite, the statements of a save replayed without Python (the database's share of
the time, against SqliteSaver's whole save). PostgreSQL comes
from ``--pg``, else ``SEALSTREAM_TEST_PG``, else ``scripts/pg-test-server``.
Prints a markdown table and writes it to ``bench/results/agents.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PAYLOAD = "x" * 10_000


def _ms(fn: Callable[[], Any], repeat: int = 20) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def _fill(saver: Any, thread: str, n: int, start: int = 0,
          parent: str | None = None) -> tuple[list[float], list[float], str | None, str]:
    from langgraph.checkpoint.base import empty_checkpoint

    puts, writes, first = [], [], ""
    for i in range(start, n):
        cp = empty_checkpoint()
        cp["channel_values"] = {"payload": PAYLOAD, "step": i}
        cp["channel_versions"] = {"payload": i + 1, "step": i + 1}
        cfg: dict[str, Any] = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        if parent:
            cfg["configurable"]["checkpoint_id"] = parent
        t0 = time.perf_counter()
        stored = saver.put(cfg, cp, {"source": "loop", "step": i}, {"payload": i + 1,
                                                                    "step": i + 1})
        puts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        saver.put_writes(stored, [("payload", "w" * 100)], f"task-{i}")
        writes.append(time.perf_counter() - t0)
        parent = stored["configurable"]["checkpoint_id"]
        first = first or str(parent)
    return puts, writes, parent, first


def _ops(saver: Any, n: int) -> dict[str, float]:
    return _ops_pair(saver, None, n)[0]


def _ops_pair(ours: Any, theirs: Any | None, n: int
              ) -> tuple[dict[str, float], dict[str, float]]:
    """The operations on both savers *interleaved* (one put here, one there; one read
    here, one there): on a loaded machine both see the same load, so their ratio
    means something even when absolute times wander."""
    savers = [s for s in (ours, theirs) if s is not None]
    thread = "bench-" + uuid.uuid4().hex[:6]
    puts: list[list[float]] = [[] for _ in savers]
    writes: list[list[float]] = [[] for _ in savers]
    parents: list[str | None] = [None for _ in savers]
    firsts: list[str] = ["" for _ in savers]
    for i in range(n):
        for k, saver in enumerate(savers):
            p, w, parents[k], first = _fill(saver, thread, i + 1, i, parents[k])
            puts[k] += p
            writes[k] += w
            firsts[k] = firsts[k] or first
    latest = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    out: list[dict[str, float]] = [{"put": statistics.median(puts[k]) * 1000,
                                    "put_writes": statistics.median(writes[k]) * 1000}
                                   for k in range(len(savers))]
    reads: list[tuple[str, int, Callable[[Any, str], Any]]] = [
        ("get_tuple latest", 20, lambda s, f: s.get_tuple(latest)),
        ("get_tuple by id", 20, lambda s, f: s.get_tuple(
            {"configurable": {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": f}})),
        ("list all", 3, lambda s, f: list(s.list(latest))),
        ("list limit 10", 20, lambda s, f: list(s.list(latest, limit=10))),
    ]
    for name, repeat, op in reads:
        times: list[list[float]] = [[] for _ in savers]
        for _ in range(repeat):
            for k, saver in enumerate(savers):
                t0 = time.perf_counter()
                op(saver, firsts[k])
                times[k].append(time.perf_counter() - t0)
        for k in range(len(savers)):
            out[k][name] = statistics.median(times[k]) * 1000
    return out[0], (out[1] if theirs is not None else {})


def _heads(saver: Any) -> dict[str, float]:
    thread = "head-" + uuid.uuid4().hex[:6]
    out, done, parent = {}, 0, None
    latest = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    for size in (100, 1000, 3000):
        _, _, parent, _ = _fill(saver, thread, size, done, parent)
        done = size
        out[f"head read @{size}"] = _ms(lambda: saver.get_tuple(latest))  # noqa: B023
    return out


class _S(TypedDict, total=False):
    n: int
    log: Annotated[list[int], operator.add]


async def _concurrent(saver: Any, runs: int = 16, steps: int = 20) -> float:
    from langgraph.graph import END, START, StateGraph

    async def step(state: _S) -> _S:
        return {"n": state["n"] + 1, "log": [state["n"]]}

    g = StateGraph(_S)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: "step" if s["n"] < steps else END)
    graph = g.compile(checkpointer=saver)
    t0 = time.perf_counter()
    await asyncio.gather(*(graph.ainvoke({"n": 0, "log": []},
                                         {"configurable": {"thread_id": f"c{i}"},
                                          "recursion_limit": 100}) for i in range(runs)))
    return (time.perf_counter() - t0) * 1000


def _sqlite(n: int, work: Path) -> dict[str, dict[str, float]]:
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from sealstream.agents.langgraph import SealstreamSaver

    out: dict[str, dict[str, float]] = {"SealstreamSaver (SQLite)": {}, "SqliteSaver": {}}
    ours = SealstreamSaver(work / "ours.db", key=b"bench", encryption_key=None)
    conn = sqlite3.connect(work / "theirs.db", check_same_thread=False)
    theirs = SqliteSaver(conn)
    a, b = _ops_pair(ours, theirs, n)
    out["SealstreamSaver (SQLite)"] |= a | _heads(ours)
    out["SqliteSaver"] |= b | _heads(theirs)
    out["SealstreamSaver (SQLite)"]["16 ainvoke x 20"] = asyncio.run(_concurrent(ours))
    ours.close()
    conn.close()

    async def their_async() -> float:
        async with AsyncSqliteSaver.from_conn_string(str(work / "theirs-a.db")) as saver:
            return await _concurrent(saver)

    out["SqliteSaver"]["16 ainvoke x 20"] = asyncio.run(their_async())
    return out


def _statements_alone(n: int, work: Path) -> str:
    """How much of a SQLite save is the database's work: the statements our saver
    sent for ``n`` put + put_writes (recorded with their parameters), replayed on a
    fresh file with the same settings and no Python logic, interleaved with
    SqliteSaver's put and put_writes. The difference to the saver's own time is
    the Python of sealing and checking."""
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    from sealstream.agents.langgraph import SealstreamSaver
    from sealstream.agents.store import _SQLITE_SCHEMA

    ours = SealstreamSaver(work / "record.db", key=b"bench", encryption_key=None)
    _, _, parent, _ = _fill(ours, "t", 50)
    real = ours.store.rows._db()
    log: list[tuple[bool, str, Any]] = []

    class Recorder:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def execute(self, sql: str, args: Any = ()) -> Any:
            log.append((False, sql, args))
            return real.execute(sql, args)

        def executemany(self, sql: str, args: Any) -> Any:
            args = list(args)
            log.append((True, sql, args))
            return real.executemany(sql, args)

    ours.store.rows._conn = Recorder()  # type: ignore[assignment]
    _fill(ours, "t", 50 + n, 50, parent)
    ours.close()
    saves: list[list[tuple[bool, str, Any]]] = [[]]
    for entry in log:
        saves[-1].append(entry)
        if entry[1] == "COMMIT":
            saves.append([])
    if len(saves) != 2 * n + 1 or saves[-1]:
        raise RuntimeError(f"expected {2 * n} saves ending in COMMIT, recorded {len(saves) - 1}")
    replay = sqlite3.connect(work / "replay.db", isolation_level=None)
    replay.execute("PRAGMA journal_mode=WAL")
    replay.execute("PRAGMA synchronous=FULL")
    replay.executescript(_SQLITE_SCHEMA)
    conn = sqlite3.connect(work / "theirs-alone.db", check_same_thread=False)
    theirs = SqliteSaver(conn)
    alone: tuple[list[float], list[float]] = ([], [])
    their: tuple[list[float], list[float]] = ([], [])
    parent = None
    for i in range(n):
        for k in (0, 1):
            t0 = time.perf_counter()
            for many, sql, args in saves[2 * i + k]:
                (replay.executemany if many else replay.execute)(sql, args)
            alone[k].append(time.perf_counter() - t0)
        p, w, parent, _ = _fill(theirs, "t", i + 1, i, parent)
        their[0].extend(p)
        their[1].extend(w)
    replay.close()
    conn.close()
    ratio = [statistics.median(alone[k]) / statistics.median(their[k]) for k in (0, 1)]
    return (f"\nSealstreamSaver (SQLite)'s statements alone (replayed, no Python) / "
            f"SqliteSaver: put {ratio[0]:.2f}x, put_writes {ratio[1]:.2f}x\n")


def _postgres(n: int, url: str) -> dict[str, dict[str, float]]:
    import psycopg

    made: list[str] = []

    def fresh() -> str:
        name = "bench_agents_" + uuid.uuid4().hex[:8]
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        made.append(name)
        return url.rsplit("/", 1)[0] + "/" + name

    try:
        return _postgres_run(n, fresh)
    finally:  # the bench leaves no database behind
        with psycopg.connect(url, autocommit=True) as conn:
            for name in made:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _postgres_run(n: int, fresh: Callable[[], str]) -> dict[str, dict[str, float]]:
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    from sealstream.agents.langgraph import SealstreamSaver

    out: dict[str, dict[str, float]] = {"SealstreamSaver (PostgreSQL)": {},
                                        "PostgresSaver": {}}
    ours = SealstreamSaver(fresh(), key=b"bench", encryption_key=None)
    theirs_url = fresh()
    with PostgresSaver.from_conn_string(theirs_url) as theirs:
        theirs.setup()
        a, b = _ops_pair(ours, theirs, n)
    out["SealstreamSaver (PostgreSQL)"] |= a | _heads(ours)
    with PostgresSaver.from_conn_string(theirs_url) as theirs:
        out["PostgresSaver"] |= b | _heads(theirs)
    out["SealstreamSaver (PostgreSQL)"]["16 ainvoke x 20"] = asyncio.run(_concurrent(ours))
    ours.close()

    async def their_async() -> float:
        async with AsyncPostgresSaver.from_conn_string(theirs_url) as saver:
            return await _concurrent(saver)

    out["PostgresSaver"]["16 ainvoke x 20"] = asyncio.run(their_async())
    return out


def _pg_url(given: str | None) -> str | None:
    if given or os.environ.get("SEALSTREAM_TEST_PG"):
        return given or os.environ["SEALSTREAM_TEST_PG"]
    try:
        return subprocess.run([str(ROOT / "scripts" / "pg-test-server")], check=True,
                              capture_output=True, text=True, timeout=120).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _table(results: dict[str, dict[str, float]]) -> str:
    rows = sorted({k for r in results.values() for k in r}, key=list(
        next(iter(results.values()))).index if results else None)
    head = "| ms (median) | " + " | ".join(results) + " |"
    lines = [head, "|---" * (len(results) + 1) + "|"]
    for row in rows:
        lines.append(f"| {row} | " + " | ".join(
            f"{r[row]:.2f}" if row in r else "-" for r in results.values()) + " |")
    return "\n".join(lines)


def _ratios(results: dict[str, dict[str, float]]) -> str:
    lines = []
    for ours, theirs in (("SealstreamSaver (SQLite)", "SqliteSaver"),
                         ("SealstreamSaver (PostgreSQL)", "PostgresSaver")):
        if ours in results and theirs in results:
            a, b = results[ours], results[theirs]
            lines.append(f"{ours} / {theirs}: " + ", ".join(
                f"{k} {a[k] / b[k]:.2f}x" for k in a if k in b and b[k] > 0))
    return ("\n" + "\n\n".join(lines) + "\n") if lines else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--checkpoints", type=int, default=1000)
    ap.add_argument("--pg", default=None)
    ap.add_argument("--skip-pg", action="store_true")
    args = ap.parse_args()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results |= _sqlite(args.checkpoints, Path(tmp))
    with tempfile.TemporaryDirectory() as tmp:
        alone = _statements_alone(min(args.checkpoints, 600), Path(tmp))
    url = None if args.skip_pg else _pg_url(args.pg)
    if url:
        results |= _postgres(args.checkpoints, url)
    text = (f"Agent savers, {args.checkpoints} checkpoints of 10 KB in one thread "
            "(medians, ms; list all: median of 3; each saver's operations interleaved "
            "with its LangGraph counterpart's)\n\n" + _table(results) + "\n"
            + _ratios(results) + alone)
    if not url:
        text += "\nPostgreSQL: skipped (no server).\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "agents.md").write_text(text)


if __name__ == "__main__":
    main()
