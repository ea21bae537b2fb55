"""One contract for every row store (SQLite, PostgreSQL) and for the agent
checkpoint store on top: create-if-absent, atomic transactions, ordered scans,
save -> latest round trip, history, retention, encryption that covers metadata."""

from __future__ import annotations

import subprocess
import sys

import pytest

import sealstream.agents as agents
from sealstream.agents import (
    AgentCheckpoint,
    AgentCheckpointStore,
    Artifact,
    NoValidAgentCheckpointError,
    open_row_store,
)
from sealstream.errors import CheckpointError

KEY = b"contract-signing-key"
ENC = bytes(range(32))


def test_public_surface_is_sorted_and_importable_without_langgraph() -> None:
    assert agents.__all__ == sorted(agents.__all__)
    for name in agents.__all__:
        assert hasattr(agents, name)
    code = ("import sys, sealstream.agents; "
            "print(any(m.startswith('langgraph') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


def test_row_store_contract(backend_url: str) -> None:
    rows = open_row_store(backend_url)
    with rows.transaction() as tx:
        assert tx.insert("s", "e", "", "b", b"1")
        assert not tx.insert("s", "e", "", "b", b"2")  # create-if-absent
        assert tx.insert("s", "e", "", "a", b"0")
        assert tx.insert("s", "e", "child:1", "a", b"c")
        assert tx.insert("s", "f", "", "a", b"f")
    assert rows.get("s", "e", "", "b") == b"1"
    assert [r.name for r in rows.scan("s", "e", "")] == ["a", "b"]
    assert [(r.ns, r.name) for r in rows.scan("s", "e")] == [("", "a"), ("", "b"),
                                                              ("child:1", "a")]
    assert rows.executions("s") == ["e", "f"]
    with rows.transaction() as tx:
        for name in ("c1|t|1", "c1|t|2", "c10|t|1", "c1}", "c2|t|1"):
            tx.insert("p", "e", "", name, b"x")
    assert [r.name for r in rows.scan("p", "e", "", prefix="c1|")] == ["c1|t|1", "c1|t|2"]
    with pytest.raises(RuntimeError), rows.transaction() as tx:  # all or nothing
        tx.upsert("s", "e", "", "b", b"changed")
        tx.insert("s", "e", "", "z", b"new")
        raise RuntimeError("crash inside the transaction")
    assert rows.get("s", "e", "", "b") == b"1" and rows.get("s", "e", "", "z") is None
    with rows.transaction() as tx:
        tx.upsert("s", "e", "", "b", b"3")
        assert tx.get("s", "e", "", "b", lock=True) == b"3"
        assert tx.delete("s", "e", "", ["a", "missing"]) == 1
        assert tx.delete("s", "e", "", []) == 0
        assert tx.delete("s", "f") == 1
    assert [r.data for r in rows.scan("s", "e", "")] == [b"3"]
    rows.close()
    rows.close()  # idempotent; the next use reopens
    assert rows.get("s", "e", "", "b") == b"3"
    rows.close()


def test_unsupported_url_is_refused() -> None:
    with pytest.raises(CheckpointError, match="unsupported"):
        open_row_store("mysql://u:secret@host/db")


@pytest.mark.parametrize("encrypted", [False, True], ids=["signed", "encrypted"])
def test_agent_checkpoint_round_trip_history_retention(backend_url: str,
                                                       encrypted: bool) -> None:
    store = AgentCheckpointStore(backend_url, key=KEY,
                                 encryption_key=ENC if encrypted else None)
    assert store.latest("order-1") is None
    art = Artifact.of("s3://bucket/invoice.pdf", b"%PDF-1.7")
    saved = [store.save(AgentCheckpoint(
        "order-1", node=f"n{i}", conversation=[{"role": "user", "text": f"hi {i}"}],
        state={"i": i}, completed_actions=[{"tool": "pay", "result": {"ok": True}}] if i else [],
        pending_approvals=[{"id": "a1"}], artifacts=[art])) for i in range(4)]
    assert [s.checkpoint_id for s in saved] == [f"{i:012d}" for i in range(1, 5)]
    assert saved[2].parent_id == saved[1].checkpoint_id and saved[0].parent_id is None
    latest = store.latest("order-1")
    assert latest is not None and latest.node == "n3" and latest.state == {"i": 3}
    assert latest.artifacts == (art,) and latest.artifacts[0].verify(b"%PDF-1.7")
    assert latest.conversation[0]["text"] == "hi 3"
    assert store.load("order-1", saved[1].checkpoint_id).node == "n1"
    assert [v.checkpoint_id for v in store.history("order-1")] == [
        s.checkpoint_id for s in reversed(saved)]
    assert store.prune("order-1", keep_last=2) == [saved[0].checkpoint_id,
                                                    saved[1].checkpoint_id]
    history = store.history("order-1")
    assert [v.checkpoint_id for v in history] == [saved[3].checkpoint_id,
                                                   saved[2].checkpoint_id]
    assert all(v.ok for v in history)
    assert store.save(AgentCheckpoint("order-1", node="n4")).checkpoint_id == f"{5:012d}"
    raw = store.rows.get("cp", "order-1", "", saved[3].checkpoint_id)
    assert raw is not None and (b"invoice.pdf" in raw) is not encrypted
    store.delete_execution("order-1")
    assert store.latest("order-1") is None
    store.close()


def test_none_verifies_is_an_explicit_error(backend_url: str) -> None:
    store = AgentCheckpointStore(backend_url, key=KEY, encryption_key=None)
    store.save(AgentCheckpoint("e", node="x"))
    other = AgentCheckpointStore(backend_url, key=b"another-key", encryption_key=None)
    with pytest.raises(NoValidAgentCheckpointError):
        other.latest("e")
    other.close()
    store.close()


def test_state_must_be_json(tmp_path: object) -> None:
    store = AgentCheckpointStore(f"sqlite:///{tmp_path}/a.db", key=KEY, encryption_key=None)
    with pytest.raises(CheckpointError, match="JSON"):
        store.save(AgentCheckpoint("e", state={"f": object()}))
    with pytest.raises(CheckpointError, match="JSON"):
        store.save(AgentCheckpoint("e", state={"nan": float("nan")}))
    store.close()


@pytest.mark.parametrize("module", ["store", "checkpoint", "ledger", "judge"])
def test_docstring_examples_run(module: str) -> None:
    import doctest
    import importlib

    mod = importlib.import_module(f"sealstream.agents.{module}")
    result = doctest.testmod(mod)
    assert result.failed == 0


def test_postgres_names_are_bytewise_in_new_and_earlier_tables(pg_url: str) -> None:
    """A new table keys names in the "C" collation (its primary key serves every
    lookup, range and order); a table made by an earlier version, names in the
    database's collation, gets the "C" index and reads the same."""
    import psycopg

    from sealstream.agents.store import PostgresRowStore

    def collation_and_indexes(url: str) -> tuple[str, list[str]]:
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT c.collname FROM pg_attribute a JOIN pg_collation c "
                "ON c.oid = a.attcollation WHERE a.attrelid = 'agent_rows'::regclass "
                "AND a.attname = 'name'").fetchone()
            names = [r[0] for r in conn.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'agent_rows' "
                "ORDER BY indexname")]
        assert row is not None
        return str(row[0]), names

    names = ["a|1", "B|1", "a}", "_x", "a|2", "A|1"]

    def exercise(rows: PostgresRowStore) -> None:
        with rows.transaction() as tx:
            for name in names:
                tx.insert("w", "e", "", name, name.encode())
            assert tx.get_many("w", "e", "", ["a|1", "A|1", "nope"]) == {
                "a|1": b"a|1", "A|1": b"A|1"}
        assert [r.name for r in rows.scan("w", "e", "", prefix="a|")] == ["a|1", "a|2"]
        with rows.transaction() as tx:
            assert [k[0] for k in tx.keys("w", "e", "")] == sorted(
                names, key=str.encode, reverse=True)
            assert [k[0] for k in tx.keys("w", "e", "", before="a|2", limit=2)] == [
                "a|1", "_x"]
        rows.close()

    exercise(PostgresRowStore(pg_url))
    assert collation_and_indexes(pg_url) == ("C", ["agent_rows_pkey"])

    with psycopg.connect(pg_url, autocommit=True) as conn:  # an earlier version's table
        conn.execute("DROP TABLE agent_rows")
        conn.execute("CREATE TABLE agent_rows (space TEXT NOT NULL, execution TEXT NOT "
                     "NULL, ns TEXT NOT NULL, name TEXT NOT NULL, data BYTEA NOT NULL, "
                     "PRIMARY KEY (space, execution, ns, name))")
    exercise(PostgresRowStore(pg_url))
    collation, indexes = collation_and_indexes(pg_url)
    assert collation != "C" and indexes == ["agent_rows_c_names", "agent_rows_pkey"]


@pytest.mark.parametrize("count", [1, 5, 17, 40, 250])
def test_fetch_returns_exactly_what_was_asked(backend_url: str, count: int) -> None:
    """One fetch of several checkpoints (PostgreSQL reads a page of many as key ranges
    spanning them; SQLite in statements of 200): only the rows asked for come back,
    each write with its own checkpoint, whatever lies between them."""
    rows = open_row_store(backend_url)
    ids = [f"c{i:04d}" for i in range(2 * count + 3)]
    with rows.transaction() as tx:
        for cid in ids:
            tx.insert("cp", "e", "", cid, b"cp-" + cid.encode())
            tx.insert("wi", "e", "", cid, b"wi-" + cid.encode())
            tx.insert("w", "e", "", f"{cid}|t|+000000", b"w-" + cid.encode())
            tx.insert("blob", "e", "", f"b-{cid}", b"blob-" + cid.encode())
            tx.insert("cp", "other", "", cid, b"other")
        tx.insert("meta", "e", "", "history", b"marker")
    wanted = ids[1::2][:count]  # every other one: the ones between are not asked for
    with rows.transaction() as tx:
        got, blobs, marker = tx.fetch("e", "", wanted, [c + "|" for c in wanted],
                                      [f"b-{c}" for c in wanted] + ["b-none"], True)
    assert marker == b"marker"
    assert sorted(got) == wanted
    for cid in wanted:
        cp, wi, writes = got[cid]
        assert (cp, wi) == (b"cp-" + cid.encode(), b"wi-" + cid.encode())
        assert [(w.name, w.data) for w in writes] == [(f"{cid}|t|+000000",
                                                      b"w-" + cid.encode())]
    assert blobs == {f"b-{c}": b"blob-" + c.encode() for c in wanted}
    rows.close()


def test_a_statement_failing_late_rolls_back_everything(backend_url: str) -> None:
    """A statement whose failure is only seen at COMMIT (PostgreSQL sends writes in a
    pipeline, with the COMMIT) fails the whole transaction with a clear error, keeps
    none of it, and leaves the store usable."""
    rows = open_row_store(backend_url)
    with rows.transaction() as tx:
        tx.insert("s", "e", "", "kept", b"1")
    with pytest.raises(CheckpointError, match="agent store"), rows.transaction() as tx:
        tx.upsert("s", "e", "", "kept", b"changed")
        tx.add("s", "e", "", "new", b"2")
        tx.upsert("s", "e", "", "bad", None)  # type: ignore[arg-type]  # NOT NULL
    assert rows.get("s", "e", "", "kept") == b"1"
    assert rows.get("s", "e", "", "new") is None and rows.get("s", "e", "", "bad") is None
    with rows.transaction() as tx:  # the connection (or the pool's) still works
        assert tx.insert("s", "e", "", "after", b"3")
    assert [r.name for r in rows.scan("s", "e", "")] == ["after", "kept"]
    rows.close()
