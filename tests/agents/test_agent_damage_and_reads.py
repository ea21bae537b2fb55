"""Issue 19, defects 2-5: pruning counts only verified checkpoints and moves damaged
ones aside; one damaged checkpoint never disables a thread (history, forks, copies,
deletes by run, listing every thread); a fall-back past a damaged or missing head is
never silent; reading the head, one id or a page of ``list`` does work independent
of the history's length (measured in SQLite virtual-machine steps, not time)."""

from __future__ import annotations

import json
import operator
import sqlite3
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance.test_utils import (  # noqa: E402
    generate_checkpoint,
    generate_config,
    generate_metadata,
)
from langgraph.graph import START, StateGraph  # noqa: E402
from test_agent_tamper import T, _alter_json, _set, _thread  # noqa: E402

from sealstream.agents import AgentCheckpoint, AgentCheckpointError, AgentCheckpointStore  # noqa: E402
from sealstream.agents.langgraph import SealstreamSaver  # noqa: E402
from sealstream.agents.store import SqliteRowStore  # noqa: E402

KEY = b"tamper-signing-key"


def _damage(saver: SealstreamSaver, cid: str, tid: str = T) -> None:
    data = saver.store.rows.get("cp", tid, "", cid)
    assert data is not None
    _set(saver, "cp", cid, _alter_json(data), tid)


def test_prune_keeps_the_newest_verified_and_moves_damaged_ones_aside(
        backend_url: str) -> None:
    saver = SealstreamSaver(backend_url, key=KEY, encryption_key=None)
    ids = _thread(saver)
    _damage(saver, ids[2])  # the newest is damaged
    saver.prune([T])  # keep_latest
    assert saver.store.quarantined(T) == [ids[2]]  # evidence, byte for byte
    got = saver.get_tuple(generate_config(T))  # a verified head again, no fall-back
    assert got is not None and got.config["configurable"]["checkpoint_id"] == ids[1]
    assert [v.reason for v in saver.store.history(T)] == ["OK"]
    saver.close()

    store = AgentCheckpointStore(backend_url, key=KEY, encryption_key=None)
    saved = [store.save(AgentCheckpoint("e", state={"n": i})) for i in range(4)]
    raw = store.rows.get("cp", "e", "", saved[3].checkpoint_id)
    assert raw is not None
    with store.rows.transaction() as tx:
        tx.upsert("cp", "e", "", saved[3].checkpoint_id, _alter_json(raw))
    assert store.prune("e", keep_last=2) == [saved[0].checkpoint_id, saved[3].checkpoint_id]
    latest = store.latest("e")
    assert latest is not None and latest.state == {"n": 2} and not latest.fell_back_past
    assert [v.ok for v in store.history("e")] == [True, True]
    store.close()


class S(TypedDict, total=False):
    n: int
    log: Annotated[list[int], operator.add]


def _graph(saver: SealstreamSaver) -> Any:
    def a(state: S) -> S:
        return {"n": state["n"] + 1, "log": [state["n"]]}

    def b(state: S) -> S:
        return {"n": state["n"] + 1, "log": [state["n"]]}

    g = StateGraph(S)
    g.add_node("a", a)
    g.add_node("b", b)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    return g.compile(checkpointer=saver)


def test_one_damaged_checkpoint_never_disables_a_thread(backend_url: str) -> None:
    saver = SealstreamSaver(backend_url, key=KEY, encryption_key=None)
    graph = _graph(saver)
    for tid in ("bad", "good"):
        graph.invoke({"n": 0, "log": []}, {"configurable": {"thread_id": tid}})
    history = list(graph.get_state_history({"configurable": {"thread_id": "bad"}}))
    ids = [h.config["configurable"]["checkpoint_id"] for h in history]  # newest first
    _damage(saver, ids[1], "bad")

    after = list(graph.get_state_history({"configurable": {"thread_id": "bad"}}))
    assert [h.config["configurable"]["checkpoint_id"] for h in after] == [ids[0], *ids[2:]]
    assert [v.checkpoint_id for v in saver.problems("bad")] == [ids[1]]
    everything = list(saver.list(None))
    assert len(everything) == 2 * len(ids) - 1
    # forking from an older, verified checkpoint works
    fork = graph.update_state(history[2].config, {"n": 100})
    state = graph.get_state(fork)
    assert state.values["n"] == 100
    saver.copy_thread("bad", "copy")  # the verified ones are copied, never the damaged
    assert len(list(saver.list(generate_config("copy")))) == len(ids) - 1 + 1
    saver.delete_for_runs(["no-such-run"])
    assert len(list(saver.list(generate_config("good")))) == len(ids)
    saver.close()


def test_a_missing_head_is_refused_unless_fallback_is_explicit(backend_url: str) -> None:
    saver = SealstreamSaver(backend_url, key=KEY, encryption_key=None)
    ids = _thread(saver)
    _set(saver, "cp", ids[2], None)  # the newest checkpoint and
    _set(saver, "meta", "history", None)  # its signed head marker: both gone
    with pytest.raises(AgentCheckpointError, match="head marker is missing"):
        saver.get_tuple(generate_config(T))
    saver.close()
    lenient = SealstreamSaver(backend_url, key=KEY, encryption_key=None, fallback="verified")
    got = lenient.get_tuple(generate_config(T))
    assert got is not None and got.config["configurable"]["checkpoint_id"] == ids[1]
    assert [v["reason"] for v in got.metadata["sealstream_fell_back_past"]] == ["NO_MANIFEST"]
    lenient.close()


def _steps(conn: sqlite3.Connection, work: Any) -> int:
    """SQLite virtual-machine steps (in units of 50) that ``work`` makes."""
    count = [0]

    def tick() -> int:
        count[0] += 1
        return 0

    conn.set_progress_handler(tick, 50)
    try:
        work()
    finally:
        conn.set_progress_handler(None, 50)
    return count[0]


def test_head_by_id_and_a_page_of_list_cost_the_same_at_any_history_length(
        tmp_path: Path) -> None:
    rows = SqliteRowStore(tmp_path / "agents.db")
    saver = SealstreamSaver(AgentCheckpointStore(rows, key=KEY, encryption_key=None))
    costs: list[tuple[int, int, int]] = []
    parent = None
    written = 0
    for size in (20, 300):
        while written < size:
            cfg = generate_config("t")
            if parent:
                cfg["configurable"]["checkpoint_id"] = parent
            stored = saver.put(cfg, generate_checkpoint(), generate_metadata(step=written), {})
            parent = stored["configurable"]["checkpoint_id"]
            written += 1
        conn = rows._db()
        first = generate_config("t")
        first["configurable"]["checkpoint_id"] = parent
        costs.append((_steps(conn, lambda: saver.get_tuple(generate_config("t"))),
                      _steps(conn, lambda: saver.get_tuple(first)),  # noqa: B023
                      _steps(conn, lambda: list(saver.list(generate_config("t"), limit=10)))))
    (head1, id1, list1), (head2, id2, list2) = costs
    assert head2 <= head1 + 2 and id2 <= id1 + 2 and list2 <= list1 + 2, costs
    saver.close()


def test_retention_by_age_keeps_the_newest_verified_always(tmp_path: Path) -> None:
    store = AgentCheckpointStore(tmp_path / "a.db", key=KEY, encryption_key=None)
    saved = [store.save(AgentCheckpoint("e", state={"n": i})) for i in range(3)]
    assert store.prune("e", keep_last=10, max_age_s=3600) == []  # all young
    assert store.prune("e", keep_last=10, max_age_s=0) == [
        saved[0].checkpoint_id, saved[1].checkpoint_id]  # all old: the newest stays
    latest = store.latest("e")
    assert latest is not None and latest.state == {"n": 2}
    assert [v.ok for v in store.history("e")] == [True]
    store.close()


def test_key_rotation_keeps_old_checkpoints_verifiable_under_their_key_id(
        tmp_path: Path) -> None:
    from sealstream.agents import KeyRing

    db = tmp_path / "a.db"
    store = AgentCheckpointStore(db, key=b"old-key", encryption_key=None)
    first = store.save(AgentCheckpoint("e", state={"n": 1}))  # before key ids
    store.close()
    ring = KeyRing("k2", {"k1": b"old-key", "k2": b"new-key"}, unnamed="k1")
    store = AgentCheckpointStore(db, key=ring, encryption_key=None)
    second = store.save(AgentCheckpoint("e", state={"n": 2}))
    assert [v.reason for v in store.history("e")] == ["OK", "OK"]
    assert store.load("e", first.checkpoint_id).state == {"n": 1}
    store.close()
    store = AgentCheckpointStore(db, key=KeyRing("k2", {"k2": b"new-key"}),
                                 encryption_key=None)  # the old key retired
    assert store.load("e", second.checkpoint_id).state == {"n": 2}
    with pytest.raises(AgentCheckpointError, match="UNKNOWN_KEY_ID"):
        store.load("e", first.checkpoint_id)
    store.close()


def test_forking_past_a_damaged_newest_checkpoint(backend_url: str) -> None:
    """LangGraph's ``update_state`` asks the saver for the thread's latest checkpoint
    (to know whether the thread moved past the fork's parent). With the newest one
    damaged that read is refused under the default policy, so the fork is refused
    with the verdict; after ``repair`` (damaged one moved aside) or under
    ``fallback="verified"`` (reported) the fork works and names its parent."""
    saver = SealstreamSaver(backend_url, key=KEY, encryption_key=None)
    graph = _graph(saver)
    cfg = {"configurable": {"thread_id": "f"}}
    graph.invoke({"n": 0, "log": []}, cfg)
    history = list(graph.get_state_history(cfg))
    ids = [h.config["configurable"]["checkpoint_id"] for h in history]  # newest first
    _damage(saver, ids[0], "f")
    with pytest.raises(AgentCheckpointError, match="SIGNATURE_MISMATCH.*agents repair"):
        graph.update_state(history[1].config, {"n": 100})
    saver.close()

    lenient = SealstreamSaver(backend_url, key=KEY, encryption_key=None, fallback="verified")
    lgraph = _graph(lenient)
    fork = lgraph.update_state(history[1].config, {"n": 100})
    state = lgraph.get_state(fork)
    assert state.values["n"] == 100
    assert state.parent_config is not None
    assert state.parent_config["configurable"]["checkpoint_id"] == ids[1]  # named parent
    assert [v.checkpoint_id for v in lenient.problems("f")] == [ids[0]]  # still reported
    lenient.close()

    saver = SealstreamSaver(backend_url, key=KEY, encryption_key=None)
    graph = _graph(saver)
    assert [e["moved_aside"] for e in saver.store.repair("f")] == [[ids[0]]]
    fork = graph.update_state(history[2].config, {"n": 200})
    state = graph.get_state(fork)
    assert state.values["n"] == 200
    assert state.parent_config is not None
    assert state.parent_config["configurable"]["checkpoint_id"] == ids[2]
    assert graph.get_state(cfg).values["n"] == 200  # the fork is the thread's head
    assert saver.problems("f") == []
    saver.close()


@pytest.mark.parametrize("space", ["cp", "blob", "w", "wi", "meta"])
def test_a_row_changed_after_a_cached_read_is_judged_again(backend_url: str,
                                                           space: str) -> None:
    """Verified checkpoints are cached by the exact bytes of every row they were
    judged on: a row changed after a read (same saver, same cache) is refused on the
    next read, by id and as the head, and skipped by ``list``."""
    saver = SealstreamSaver(backend_url, key=KEY, encryption_key=None)
    ids = _thread(saver)
    head = generate_config(T)
    by_id = generate_config(T)
    by_id["configurable"]["checkpoint_id"] = ids[2]
    for _ in range(2):  # read twice: the second read is served by the cache
        assert saver.get_tuple(head) is not None and saver.get_tuple(by_id) is not None
    manifest = saver.store.rows.get("cp", T, "", ids[2])
    assert manifest is not None
    name = {"cp": ids[2], "wi": ids[2], "meta": "history",
            "blob": min(json.loads(manifest)["blobs"]),
            "w": next(r.name for r in saver.store.rows.scan("w", T, "")
                      if r.name.startswith(ids[2] + "|"))}[space]
    data = saver.store.rows.get(space, T, "", name)
    assert data is not None
    # a blob is not JSON: flip one bit of it; the others: a field added
    changed = data[:-1] + bytes([data[-1] ^ 1]) if space == "blob" else _alter_json(data)
    _set(saver, space, name, changed)
    if space != "meta":  # the marker only matters to the head read
        with pytest.raises(AgentCheckpointError):
            saver.get_tuple(by_id)
        assert ids[2] not in [t.config["configurable"]["checkpoint_id"]
                              for t in saver.list(head)]
    with pytest.raises(AgentCheckpointError):
        saver.get_tuple(head)
    saver.close()


def test_a_checkpoint_pruned_between_two_statements_of_a_read_is_not_called_damaged(
        backend_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads run statement by statement (no BEGIN/COMMIT): a checkpoint whose manifest
    was read and whose blobs another saver prunes before the next statement is
    reported gone (read again in a transaction), never as damaged."""
    writer = SealstreamSaver(backend_url, key=KEY, encryption_key=None)
    ids = _thread(writer)
    reader = SealstreamSaver(backend_url, key=KEY, encryption_key=None)  # no hints yet:
    with reader.store.rows.reading() as tx:  # the blobs come in a second statement
        tx_type = type(tx)
    real_get_many = tx_type.get_many
    raced: list[str] = []

    def get_many_after_a_prune(self: Any, *args: Any, **kwargs: Any) -> dict[str, bytes]:
        if not raced:
            raced.append(args[0])
            writer.prune([T])  # keeps ids[2]; ids[0] goes with its own blob a@1
        return real_get_many(self, *args, **kwargs)

    monkeypatch.setattr(tx_type, "get_many", get_many_after_a_prune)
    old = generate_config(T)
    old["configurable"]["checkpoint_id"] = ids[0]
    got = reader.get_tuple(old)
    assert raced == ["blob"]
    assert got is None  # gone: the reader saw its manifest, not its blobs
    assert [t.config["configurable"]["checkpoint_id"]
            for t in reader.list(generate_config(T))] == [ids[2]]
    assert reader.problems(T) == []
    writer.close()
    reader.close()
