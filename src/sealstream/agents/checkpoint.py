"""Agent checkpoints: signed, verified, kept as a history per execution.

An agent checkpoint is keyed by a stable **execution id** and a **namespace**
(``""`` for the root workflow). It holds the conversation, the current workflow
node, the completed tool actions with their results, the pending approvals and
references to external artifacts (URI plus SHA-256), all in one signed manifest
row (:mod:`sealstream.agents._seal`). The LangGraph saver stores its checkpoints
in the same rows, with channel values as blob rows the manifest hashes and
pending writes indexed by a signed per-checkpoint writes index.

Commit protocol (one transaction, so a crash leaves all or nothing):

1. channel blobs are inserted create-if-absent; the manifest records each one's
   SHA-256 and size (blobs reused from earlier checkpoints are re-hashed);
2. the manifest row is inserted (create-if-absent; LangGraph may re-put the same
   checkpoint id when a run exits, which replaces it);
3. an empty writes index is created for checkpoints that take pending writes;
4. the history's signed head marker is moved to the newest checkpoint id.

Reading gathers every row into :class:`~sealstream.agents.judge.CheckpointEvidence`
and asks the pure :func:`~sealstream.agents.judge.judge`; only an
``ATOMIC_CHECKPOINT`` is ever returned as state. :meth:`AgentCheckpointStore.latest`
falls back past rejected checkpoints to the newest verified one, like stream
recovery; rejected checkpoints are reported by :meth:`AgentCheckpointStore.history`,
never deleted. Retention (:meth:`AgentCheckpointStore.prune`) deletes the oldest
checkpoints in one transaction and raises the signed retention floor, so a
checkpoint removed any other way is reported as ``NO_MANIFEST``.

>>> import tempfile, pathlib
>>> store = AgentCheckpointStore(pathlib.Path(tempfile.mkdtemp()) / "agents.db", key=b"k",
...                              encryption_key=None)
>>> saved = store.save(AgentCheckpoint("order-17", node="pay", state={"amount": 42}))
>>> store.latest("order-17").state
{'amount': 42}
>>> [v.verdict for v in store.history("order-17")]
['ATOMIC_CHECKPOINT']
>>> store.close()
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sealstream._runtime.crash import CrashPoints
from sealstream.agents import _check
from sealstream.agents import judge as _judge
from sealstream.agents._seal import (
    FROM_ENV,
    Address,
    Keys,
    seal_plain,
    unwrap,
    wrap,
)
from sealstream.agents.judge import AgentVerdict, CheckpointEvidence, RowRead
from sealstream.agents.store import RowStore, RowTx, open_row_store
from sealstream.checkpoint.crypto import EnvelopeError
from sealstream.errors import CheckpointError, NoValidCheckpointError, SpecError

_log = logging.getLogger("sealstream.agents")

FALLBACKS = ("refuse", "verified")
_UNREAD = object()

FORMAT = 1
KIND_AGENT = "agent"
KIND_LANGGRAPH = "langgraph"


class AgentCheckpointError(CheckpointError):
    """An agent checkpoint (or ledger row) is not ``ATOMIC_CHECKPOINT``.

    ``verdict`` says which rule failed. Inspect with
    :meth:`AgentCheckpointStore.history`; nothing was changed or deleted.
    """

    def __init__(self, verdict: AgentVerdict) -> None:
        super().__init__(f"{verdict.verdict} ({verdict.reason}): {verdict.message}")
        self.verdict = verdict


class NoValidAgentCheckpointError(NoValidCheckpointError):
    """Checkpoints of an execution exist but none verifies; nothing was deleted.

    Inspect them with :meth:`AgentCheckpointStore.history`; start the execution
    over under a new execution id, or delete it explicitly.
    """


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, no NaN: the form that is hashed and signed."""
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
        text.encode("utf-8")  # a lone surrogate cannot be stored
    except UnicodeEncodeError as exc:
        raise CheckpointError(f"agent state must be valid Unicode text: {exc.reason} "
                              f"({exc.object[exc.start:exc.end]!r})") from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"agent state must be JSON (no pickle): {exc}") from None
    return text


@dataclass(frozen=True)
class Artifact:
    """A reference to an external artifact: where it is and what it must hash to.

    >>> Artifact.of("s3://bucket/invoice.pdf", b"%PDF").verify(b"%PDF")
    True
    """

    uri: str
    sha256: str
    size: int | None = None

    @classmethod
    def of(cls, uri: str, data: bytes) -> Artifact:
        return cls(uri, hashlib.sha256(data).hexdigest(), len(data))

    def verify(self, data: bytes) -> bool:
        """Whether ``data`` is the referenced content."""
        return hashlib.sha256(data).hexdigest() == self.sha256 and (
            self.size is None or self.size == len(data))

    def to_json(self) -> dict[str, Any]:
        return {"uri": self.uri, "sha256": self.sha256, "size": self.size}


@dataclass(frozen=True)
class AgentCheckpoint:
    """One agent checkpoint. JSON values only (loading one never executes code).

    ``checkpoint_id``, ``parent_id`` and ``created_ms`` are assigned by
    :meth:`AgentCheckpointStore.save`.
    """

    execution_id: str
    node: str = ""
    conversation: Sequence[Mapping[str, Any]] = ()
    state: Mapping[str, Any] = field(default_factory=dict)
    completed_actions: Sequence[Mapping[str, Any]] = ()
    pending_approvals: Sequence[Mapping[str, Any]] = ()
    artifacts: Sequence[Artifact] = ()
    namespace: str = ""
    checkpoint_id: str = ""
    parent_id: str | None = None
    created_ms: int = 0
    #: the verdicts of newer checkpoints this one was chosen over (only ever non-empty
    #: under ``fallback="verified"``; the default policy refuses instead)
    fell_back_past: tuple[AgentVerdict, ...] = ()

    def check(self) -> None:
        """Raise SpecError naming the first field of the wrong type."""
        _check.text("execution_id", self.execution_id)
        _check.text("namespace", self.namespace, empty_ok=True)
        _check.text("node", self.node, empty_ok=True)
        _check.mappings("conversation", self.conversation)
        _check.mapping("state", self.state)
        _check.mappings("completed_actions", self.completed_actions)
        _check.mappings("pending_approvals", self.pending_approvals)
        if isinstance(self.artifacts, str | bytes) or not all(
                isinstance(a, Artifact) for a in self.artifacts):
            raise SpecError("artifacts: expected a list of Artifact (Artifact.of(uri, data))")

    def body(self) -> dict[str, Any]:
        body = {
            "node": self.node,
            "conversation": [dict(m) for m in self.conversation],
            "state": dict(self.state),
            "completed_actions": [dict(a) for a in self.completed_actions],
            "pending_approvals": [dict(a) for a in self.pending_approvals],
            "artifacts": [a.to_json() for a in self.artifacts],
        }
        return dict(json.loads(canonical_json(body)))

    @classmethod
    def from_manifest(cls, doc: Mapping[str, Any]) -> AgentCheckpoint:
        if doc.get("kind") != KIND_AGENT:
            raise AgentCheckpointError(other_kind(doc, KIND_AGENT))
        b = doc["body"]
        return cls(
            execution_id=doc["execution"], node=b["node"],
            conversation=tuple(b["conversation"]), state=b["state"],
            completed_actions=tuple(b["completed_actions"]),
            pending_approvals=tuple(b["pending_approvals"]),
            artifacts=tuple(Artifact(a["uri"], a["sha256"], a["size"]) for a in b["artifacts"]),
            namespace=doc["ns"], checkpoint_id=doc["id"], parent_id=doc["parent"],
            created_ms=int(doc["created_ms"]),
        )


@dataclass(frozen=True)
class Loaded:
    """A verified checkpoint's rows, as the saver needs them."""

    verdict: AgentVerdict
    manifest: Mapping[str, Any]
    blobs: Mapping[str, bytes]
    writes: Sequence[Mapping[str, Any]]
    fell_back_past: tuple[AgentVerdict, ...] = ()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _esc(part: str) -> str:
    """``part`` with ``%`` and ``|`` escaped, so ``|`` separates name parts unambiguously
    (checkpoint "a" must not own the writes of checkpoint "a|b")."""
    return part.replace("%", "%25").replace("|", "%7C")


def writes_prefix(checkpoint_id: str) -> str:
    """What the names of a checkpoint's pending writes start with."""
    return f"{_esc(checkpoint_id)}|"


def write_name(checkpoint_id: str, task_id: str, idx: int) -> str:
    """A pending write's row name; sorts by checkpoint, task, then index."""
    return f"{_esc(checkpoint_id)}|{_esc(task_id)}|{idx:+07d}"


class AgentCheckpointStore:
    """Agent checkpoints in a row store (SQLite path, ``sqlite:///``, ``postgresql://``).

    ``key``: the signing key (default ``SEALSTREAM_CHECKPOINT_KEY``; None signs with
    an unkeyed SHA-256). ``encryption_key``: 32 bytes for AES-256-GCM at rest
    (default ``SEALSTREAM_ENCRYPTION_KEY``); with one, plaintext rows are refused.
    """

    def __init__(self, rows: RowStore | str | Path, *, key: bytes | None | object = FROM_ENV,
                 encryption_key: bytes | None | object = FROM_ENV,
                 crash: Callable[[str], None] | None = None,
                 fallback: str = "refuse") -> None:
        self.rows = rows if isinstance(rows, RowStore) else open_row_store(rows)
        self.keys = Keys.resolve(key, encryption_key)
        #: what a read of the newest checkpoint does when it does not verify:
        #: "refuse" (default: raise with the verdict) or "verified" (newest verified
        #: one, reported in the result and the log)
        self.fallback = _policy(fallback)
        #: crash points for tests (``SEALSTREAM_CRASH_AT``): ``inside_checkpoint_commit``
        #: (manifest and blobs written, transaction not committed), ``inside_writes_commit``
        self.crash = crash if crash is not None else CrashPoints()
        #: verified checkpoints kept, keyed by all their stored bytes (see _load_many)
        self.cache_size = 1024
        self._verified: OrderedDict[tuple[Any, ...], Loaded] = OrderedDict()
        self._names: OrderedDict[tuple[str, str, str, bytes], list[str]] = OrderedDict()
        # guesses of which rows to fetch in one statement (never trusted)
        self._hints: OrderedDict[tuple[str, str, str], list[str]] = OrderedDict()
        self._heads: OrderedDict[tuple[str, str], str] = OrderedDict()
        # signed rows known verified (head markers, writes indexes, manifests), by
        # their address and exact bytes
        self._rows_seen: OrderedDict[tuple[Any, bytes], dict[str, Any]] = OrderedDict()
        self._cache_lock = threading.Lock()

    def close(self) -> None:
        self.rows.close()

    # ------------------------------------------------------------ native API
    def save(self, checkpoint: AgentCheckpoint) -> AgentCheckpoint:
        """Commit ``checkpoint`` as the execution's next one; returns it with its id,
        parent and creation time filled in."""
        if not isinstance(checkpoint, AgentCheckpoint):
            raise SpecError(f"save: expected an AgentCheckpoint, got "
                            f"{type(checkpoint).__name__}")
        checkpoint.check()
        ex, ns = checkpoint.execution_id, checkpoint.namespace
        body = checkpoint.body()
        with self.rows.transaction() as tx:
            tx.lock_history(ex, ns)
            names = [r.name for r in tx.scan("cp", ex, ns)]
            head = self._meta(tx, ex, ns).get("head") or ""
            self.check_kind(tx, ex, ns, head, KIND_AGENT)
            last = max([*names, head]) if names or head else ""
            cid = f"{int(last) + 1 if last.isdigit() else 1:012d}"
            created = now_ms()
            self._commit(tx, ex, ns, cid, kind=KIND_AGENT, parent=last or None, body=body,
                         blobs={}, reuse=(), writes=False, created_ms=created)
        return replace(checkpoint, checkpoint_id=cid, parent_id=last or None, created_ms=created)

    def latest(self, execution_id: str, namespace: str = "", *,
               fallback: str | None = None) -> AgentCheckpoint | None:
        """The execution's newest checkpoint (its signed head), None when it has none.

        When the head does not verify, or is gone, or the head marker itself is gone
        or damaged, ``fallback`` decides (default: the store's ``fallback``):
        ``"refuse"`` raises :class:`AgentCheckpointError` with the verdict;
        ``"verified"`` returns the newest checkpoint that verifies, says so in its
        ``fell_back_past`` and logs a warning. Raises
        :class:`NoValidAgentCheckpointError` when checkpoints exist but none verifies.
        Reading the head is constant-time in the history's length."""
        policy = _policy(self.fallback if fallback is None else fallback)
        with self.rows.transaction() as tx:
            cid, problem = self.head(tx, execution_id, namespace)
            if cid is None and problem is None:
                return None
            if cid is not None:
                verdict = _judge.judge(self._evidence(tx, execution_id, namespace, cid),
                                       self.keys.sign)
                if verdict.ok and verdict.manifest is not None:
                    return AgentCheckpoint.from_manifest(verdict.manifest)
                problem = verdict
            assert problem is not None
            skipped = [problem]
            for name, _, _ in tx.keys("cp", execution_id, namespace):
                if name == cid:
                    continue
                verdict = _judge.judge(self._evidence(tx, execution_id, namespace, name),
                                       self.keys.sign)
                if verdict.ok and verdict.manifest is not None:
                    if policy == "refuse":
                        raise AgentCheckpointError(replace(problem, message=(
                            f"{problem.message}; refusing to fall back silently to "
                            f"checkpoint {name!r} (repair with `sealstream agents repair`, "
                            "or read with fallback='verified')")))
                    _log.warning("execution %r/%r: falling back to checkpoint %r past %s",
                                 execution_id, namespace, name,
                                 "; ".join(f"{v.checkpoint_id}: {v.verdict} ({v.reason})"
                                           for v in skipped))
                    return replace(AgentCheckpoint.from_manifest(verdict.manifest),
                                   fell_back_past=tuple(skipped))
                skipped.append(verdict)
        raise NoValidAgentCheckpointError(
            f"execution {execution_id!r}: checkpoint(s) exist but none verifies; see "
            "AgentCheckpointStore.history()")

    def head(self, tx: RowTx, ex: str, ns: str, *, rows_checked: bool = True,
             stored_meta: bytes | None | object = _UNREAD
             ) -> tuple[str | None, AgentVerdict | None]:
        """The history's head checkpoint id from its signed marker (constant-time),
        and the verdict that makes it unusable: ``(None, None)`` for an empty
        history; ``(id, None)`` for a head whose manifest row exists (it still has
        to verify); ``(None, verdict)`` when the marker is gone or damaged, or names
        a checkpoint whose rows are gone."""
        addr = ("meta", ex, ns, "history")
        row = (self._read(tx, addr) if stored_meta is _UNREAD
               else self._opened(addr, stored_meta if isinstance(stored_meta, bytes) else None))
        if row.data is None and row.problem is None:
            if tx.keys("cp", ex, ns, limit=1):
                return None, AgentVerdict(
                    ex, ns, "(head)", _judge.PARTIAL, "NO_MANIFEST",
                    f"history {ex!r}/{ns!r}: its signed head marker is missing")
            return None, None
        bad, doc = self.judged_row(row)
        if bad is not None or doc is None:
            assert bad is not None
            return None, bad
        head = doc.get("head") or ""
        if not isinstance(head, str) or not head:
            if tx.keys("cp", ex, ns, limit=1):
                return None, AgentVerdict(
                    ex, ns, "(head)", _judge.PARTIAL, "NO_MANIFEST",
                    f"history {ex!r}/{ns!r}: its signed head marker names no checkpoint "
                    "but checkpoints exist")
            return None, None
        if rows_checked and tx.get("cp", ex, ns, head) is None:
            return None, self.head_gone(ex, ns, head)
        self._remember(self._heads, (ex, ns), head)
        return head, None

    @staticmethod
    def head_gone(ex: str, ns: str, head: str) -> AgentVerdict:
        """The verdict for a head checkpoint whose rows are gone."""
        return AgentVerdict(
            ex, ns, head, _judge.PARTIAL, "NO_MANIFEST",
            f"checkpoint {head!r} of {ex!r}/{ns!r} is the signed head of its history "
            "but its rows are gone")

    def load(self, execution_id: str, checkpoint_id: str, namespace: str = ""
             ) -> AgentCheckpoint:
        """That checkpoint; raises :class:`AgentCheckpointError` unless it verifies."""
        verdict = self.verify(execution_id, checkpoint_id, namespace)
        if not verdict.ok or verdict.manifest is None:
            raise AgentCheckpointError(verdict)
        return AgentCheckpoint.from_manifest(verdict.manifest)

    def ids(self, execution_id: str, namespace: str = "") -> list[str]:
        """Checkpoint ids present, oldest first."""
        return [r.name for r in self.rows.scan("cp", execution_id, namespace)]

    def executions(self) -> list[str]:
        return self.rows.executions("cp")

    def namespaces(self, execution_id: str) -> list[str]:
        return sorted({r.ns for r in self.rows.scan("cp", execution_id)})

    def verify(self, execution_id: str, checkpoint_id: str, namespace: str = ""
               ) -> AgentVerdict:
        """The guard's verdict on one checkpoint (never raises on bad rows)."""
        with self.rows.transaction() as tx:
            return _judge.judge(self._evidence(tx, execution_id, namespace, checkpoint_id),
                                self.keys.sign)

    def history(self, execution_id: str, namespace: str = "") -> list[AgentVerdict]:
        """A verdict for every checkpoint present, newest first, followed by one for
        each checkpoint the history shows to be gone (and for a bad head marker)."""
        with self.rows.transaction() as tx:
            ids = [r.name for r in tx.scan("cp", execution_id, namespace)]
            verdicts = [_judge.judge(self._evidence(tx, execution_id, namespace, cid),
                                     self.keys.sign) for cid in reversed(ids)]
            parents = {}
            for cid in ids:
                row = self._read(tx, ("cp", execution_id, namespace, cid))
                doc = _loads(row.data)
                parents[cid] = doc.get("parent") if doc else None
            meta = self._read(tx, ("meta", execution_id, namespace, "history"))
        return verdicts + _judge.judge_history(
            execution_id, namespace, verdicts,
            {k: v if isinstance(v, str) else None for k, v in parents.items()},
            meta, self.keys.sign)

    def prune(self, execution_id: str, namespace: str = "", *, keep_last: int,
              max_age_s: float | None = None) -> list[str]:
        """Keep the newest ``keep_last`` verified checkpoints (0: delete all) and,
        with ``max_age_s``, only those of them created less than ``max_age_s``
        seconds ago (the newest verified one is always kept); delete the others with
        their writes and the blobs nothing kept refers to, move damaged ones aside
        (:meth:`quarantine`), in one transaction; raise the signed retention floor.
        Returns the ids deleted or moved aside."""
        _check.count("keep_last", keep_last)
        if max_age_s is not None and (isinstance(max_age_s, bool) or not isinstance(
                max_age_s, int | float) or max_age_s < 0):
            raise SpecError(f"max_age_s: expected a number of seconds >= 0, got {max_age_s!r}")
        with self.rows.transaction() as tx:
            return self._prune(tx, execution_id, namespace, keep_last, max_age_s)

    def delete_execution(self, execution_id: str) -> None:
        """Delete every checkpoint, blob, write and marker of the execution (all
        namespaces) in one transaction. Effect-ledger rows are kept: they record
        what happened in the world."""
        with self.rows.transaction() as tx:
            # every history of the execution locked first (in one order): a save or
            # a pending write in flight finishes before, or starts after, the delete
            spaces = ("cp", "blob", "w", "wi", "meta")
            for ns in sorted({k[2] for space in spaces
                              for k in tx.keys(space, execution_id)}):
                tx.lock_history(execution_id, ns)
            for space in spaces:
                tx.delete(space, execution_id)

    # ------------------------------------------------------------ core
    def check_kind(self, tx: RowTx, ex: str, ns: str, head: str, kind: str) -> None:
        """Raise AgentCheckpointError (``OTHER_KIND``) when ``head``, the history's
        head checkpoint, is of another kind than ``kind``: an execution id holds agent
        checkpoints or a LangGraph thread's, never both, so its head tells which."""
        doc = _loads(self._read(tx, ("cp", ex, ns, head)).data) if head else None
        if doc is not None and doc.get("kind") != kind:
            raise AgentCheckpointError(other_kind(doc, kind))

    def _read(self, tx: RowTx, addr: Address) -> RowRead:
        return self._opened(addr, tx.get(*addr))

    def _opened(self, addr: Address, stored: bytes | None) -> RowRead:
        if stored is None:
            return RowRead(addr, None)
        try:
            return RowRead(addr, unwrap(self.keys, addr, stored))
        except EnvelopeError as exc:
            return RowRead(addr, None, (exc.reason, str(exc)))

    def _meta(self, tx: RowTx, ex: str, ns: str) -> dict[str, Any]:
        row = self._read(tx, ("meta", ex, ns, "history"))
        if row.data is None and row.problem is None:
            return {}
        bad, doc = self.judged_row(row)
        if bad is not None or doc is None:
            assert bad is not None
            raise AgentCheckpointError(bad)
        return doc

    def judged_row(self, row: RowRead, *, missing: str = "ROW_MISSING"
                   ) -> tuple[AgentVerdict | None, dict[str, Any] | None]:
        """:func:`~sealstream.agents.judge.judge_row` of a signed row (a head marker, a
        writes index, a manifest's signature and address), its verified document
        cached by the row's address and exact bytes: the verdict is a pure function
        of them and the store's keys."""
        if row.data is not None and row.problem is None:
            with self._cache_lock:
                doc = self._rows_seen.get((row.addr, row.data))
            if doc is not None:
                return None, doc
        bad, doc = _judge.judge_row(row, self.keys.sign, missing=missing)
        if bad is None and doc is not None and row.data is not None:
            self._remember(self._rows_seen, (row.addr, row.data), doc)
        return bad, doc

    def seal_row(self, addr: Address, body: dict[str, Any]) -> bytes:
        """The stored bytes of a signed row this store writes (a head marker, a writes
        index, a manifest); its document is known verified when it is read back
        unchanged."""
        plain = seal_plain(self.keys, addr, body)
        self._remember(self._rows_seen, (addr, plain), json.loads(plain))
        return wrap(self.keys, addr, plain)

    def _set_meta(self, tx: RowTx, ex: str, ns: str, *, head: str | None = None,
                  floor: str | None = None, dropped: Sequence[str] = (),
                  reset_head: bool = False) -> None:
        tx.lock_history(ex, ns)
        try:
            meta = self._meta(tx, ex, ns)
        except AgentCheckpointError:
            if not reset_head:
                raise
            # re-establishing a damaged marker (repair): the oldest remaining
            # checkpoint becomes the floor, so nothing older is reported as gone
            oldest = tx.keys("cp", ex, ns, limit=1, newest_first=False)
            meta = {"floor": oldest[0][0] if oldest else ""}
        new: dict[str, Any] = {"head": meta.get("head") or "", "floor": meta.get("floor") or "",
                               "dropped": sorted(set(meta.get("dropped") or []) | set(dropped))}
        if head is not None:
            new["head"] = max(new["head"], head)
        if floor is not None:
            new["floor"] = floor
            new["dropped"] = [d for d in new["dropped"] if d >= floor]
        if (dropped and new["head"] in dropped) or reset_head:
            remaining = tx.keys("cp", ex, ns, limit=1)
            new["head"] = remaining[0][0] if remaining else ""
        addr = ("meta", ex, ns, "history")
        tx.upsert(*addr, self.seal_row(addr, new))

    def _commit(self, tx: RowTx, ex: str, ns: str, cid: str, *, kind: str, parent: str | None,
                body: Mapping[str, Any], blobs: Mapping[str, bytes], reuse: Sequence[str],
                writes: bool, created_ms: int, overwrite: bool = False) -> None:
        entries: dict[str, dict[str, Any]] = {}
        if all(("blob", ex, ns, name) in tx.seen for name in blobs):
            # which exist is known (read in this transaction, under the history's
            # lock): the new ones are written without waiting for an answer
            absent = {name: wrap(self.keys, ("blob", ex, ns, name), data)
                      for name, data in blobs.items()
                      if tx.seen[("blob", ex, ns, name)] is None}
            tx.add_many("blob", ex, ns, absent)
            inserted = set(absent)
        else:
            inserted = tx.insert_many("blob", ex, ns, {
                name: wrap(self.keys, ("blob", ex, ns, name), data)
                for name, data in blobs.items()})
        for name, data in blobs.items():
            addr = ("blob", ex, ns, name)
            if name not in inserted:
                old = self._read(tx, addr)
                if old.data != data:
                    raise CheckpointError(
                        f"channel blob {name!r} of {ex!r}/{ns!r} already exists with other "
                        "content (or cannot be opened); refusing to reference it")
            entries[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        for name in reuse:
            old = self._read(tx, ("blob", ex, ns, name))
            if old.problem is not None:
                raise CheckpointError(f"channel blob {name!r} of {ex!r}/{ns!r}: "
                                      f"{old.problem[1]}")
            if old.data is None:
                raise CheckpointError(f"channel blob {name!r} of {ex!r}/{ns!r}, which this "
                                      "checkpoint reuses from its parent, is missing")
            entries[name] = {"sha256": hashlib.sha256(old.data).hexdigest(),
                             "bytes": len(old.data)}
        doc = {"format": FORMAT, "kind": kind, "execution": ex, "ns": ns, "id": cid,
               "parent": parent, "created_ms": created_ms, "blobs": entries,
               "writes": writes, "body": dict(body)}
        addr = ("cp", ex, ns, cid)
        sealed = self.seal_row(addr, doc)
        if overwrite:
            tx.upsert(*addr, sealed)
        elif not tx.insert(*addr, sealed):
            raise CheckpointError(f"checkpoint {cid!r} of {ex!r}/{ns!r} already exists")
        self.crash("inside_checkpoint_commit")
        if writes:
            waddr = ("wi", ex, ns, cid)
            tx.add(*waddr, self.seal_row(waddr, {"checkpoint": cid, "writes": {}}))
        self._set_meta(tx, ex, ns, head=cid)
        self._remember(self._hints, (ex, ns, cid), sorted(entries))
        self._remember(self._heads, (ex, ns), cid)

    def _evidence(self, tx: RowTx, ex: str, ns: str, cid: str) -> CheckpointEvidence:
        raw_cp, raw_wi, raw_writes = tx.checkpoint_rows(ex, ns, cid, writes_prefix(cid))
        doc = _loads(self._opened(("cp", ex, ns, cid), raw_cp).data)
        found = tx.get_many("blob", ex, ns, _blob_names(doc))
        return self._evidence_of(ex, ns, cid, raw_cp, raw_wi, raw_writes, found)

    def _evidence_of(self, ex: str, ns: str, cid: str, raw_cp: bytes | None,
                     raw_wi: bytes | None, raw_writes: Sequence[Any],
                     found: Mapping[str, bytes]) -> CheckpointEvidence:
        """The evidence of one checkpoint from its stored rows (``found``: blob rows
        by name, a superset of those its manifest lists)."""
        manifest = self._opened(("cp", ex, ns, cid), raw_cp)
        doc = _loads(manifest.data)
        blobs: dict[str, RowRead] = {}
        index = None
        writes: dict[str, RowRead] = {}
        if doc is not None:
            for name in _blob_names(doc):
                blobs[name] = self._opened(("blob", ex, ns, name), found.get(name))
            if doc.get("writes"):
                index = self._opened(("wi", ex, ns, cid), raw_wi)
                for row in raw_writes:
                    addr = (row.space, row.execution, row.ns, row.name)
                    try:
                        writes[row.name] = RowRead(addr, unwrap(self.keys, addr, row.data))
                    except EnvelopeError as exc:
                        writes[row.name] = RowRead(addr, None, (exc.reason, str(exc)))
        return CheckpointEvidence(manifest, blobs, index, writes)

    def _load(self, tx: RowTx, ex: str, ns: str, cid: str) -> Loaded | None:
        """The verified checkpoint; raises AgentCheckpointError when it is absent or
        does not verify."""
        got = self._load_many(tx, [(cid, ex, ns)])[(cid, ex, ns)]
        if isinstance(got, AgentVerdict):
            raise AgentCheckpointError(got)
        if got is None:
            raise AgentCheckpointError(_judge.judge(CheckpointEvidence(
                RowRead(("cp", ex, ns, cid), None)), self.keys.sign))
        return got

    def _load_many(self, tx: RowTx, keys: Sequence[tuple[str, str, str]]
                   ) -> dict[tuple[str, str, str], Loaded | AgentVerdict | None]:
        """Several checkpoints (``(id, execution, ns)``) in few round trips (per
        history: one for manifests, writes indexes and writes, one for blobs): each
        one verified (:class:`Loaded`), rejected (its verdict), or None when its
        manifest row is absent.

        Verified checkpoints are cached by the exact stored bytes of *every* row
        they were judged on (manifest, writes index, writes, blobs) and by their
        address: a checkpoint is immutable once written and the verdict is a pure
        function of those bytes and the store's keys, so a row changed in any way
        misses the cache and is judged again. The rows are always read."""
        out: dict[tuple[str, str, str], Loaded | AgentVerdict | None] = {}
        groups: dict[tuple[str, str], list[str]] = {}
        for cid, ex, ns in keys:
            groups.setdefault((ex, ns), []).append(cid)
        for (ex, ns), cids in groups.items():
            got, _ = self._load_group(tx, ex, ns, cids, meta=False)
            out.update(((cid, ex, ns), v) for cid, v in got.items())
        return out

    def _remember(self, table: OrderedDict[Any, Any], key: Any, value: Any) -> None:
        with self._cache_lock:
            table[key] = value
            table.move_to_end(key)
            while len(table) > self.cache_size:
                table.popitem(last=False)

    def blob_hint(self, ex: str, ns: str, cid: str) -> list[str]:
        """The blob names this store last saw a checkpoint's manifest list: only a
        guess of which rows to fetch with it, never trusted."""
        with self._cache_lock:
            return list(self._hints.get((ex, ns, cid), ()))

    def head_hint(self, ex: str, ns: str) -> str | None:
        """The head this store last saw for a history: only a guess of which rows to
        fetch together with the head marker (:meth:`_load_group`), never trusted."""
        with self._cache_lock:
            return self._heads.get((ex, ns))

    def _load_group(self, tx: RowTx, ex: str, ns: str, cids: Sequence[str], *, meta: bool
                    ) -> tuple[dict[str, Loaded | AgentVerdict | None], bytes | None]:
        """:meth:`_load_many` for one history, and (``meta``) its stored head marker
        read in the same statement. The blobs this store last saw listed by these
        manifests are fetched in that statement too (a guess: any blob the manifests
        actually list that was not fetched is fetched next)."""
        out: dict[str, Loaded | AgentVerdict | None] = {}
        with self._cache_lock:
            hinted = sorted({n for c in cids for n in self._hints.get((ex, ns, c), ())})
        raw, found, marker = tx.fetch(ex, ns, cids, [writes_prefix(c) for c in cids], hinted,
                                      meta)
        docs: dict[str, list[str]] = {}
        names: set[str] = set()
        for cid in cids:
            raw_cp = raw[cid][0]
            if raw_cp is None:
                continue
            # the blob names a manifest lists (unverified: only what to fetch; the
            # cache key and the verdict below use the bytes themselves)
            nkey = (ex, ns, cid, raw_cp)
            with self._cache_lock:
                listed = self._names.get(nkey)
            if listed is None:
                listed = _blob_names(_loads(self._opened(("cp", ex, ns, cid), raw_cp).data))
                self._remember(self._names, nkey, listed)
            self._remember(self._hints, (ex, ns, cid), listed)
            docs[cid] = listed
            names.update(listed)
        missing = sorted(names - set(hinted))
        if missing:
            found = {**found, **tx.get_many("blob", ex, ns, missing)}
        for cid in cids:
            raw_cp, raw_wi, raw_writes = raw[cid]
            if raw_cp is None:
                out[cid] = None
                continue
            bnames = docs[cid]
            ckey = (ex, ns, cid, raw_cp, raw_wi, tuple((r.name, r.data) for r in raw_writes),
                    tuple((n, found.get(n)) for n in bnames))
            with self._cache_lock:
                hit = self._verified.get(ckey)
                if hit is not None:
                    self._verified.move_to_end(ckey)
            if hit is not None:
                out[cid] = hit
                continue
            ev = self._evidence_of(ex, ns, cid, raw_cp, raw_wi, raw_writes, found)
            verdict = _judge.judge(ev, self.keys.sign)
            if not verdict.ok:
                out[cid] = verdict
                continue
            assert verdict.manifest is not None
            blobs = {k: r.data for k, r in ev.blobs.items() if r.data is not None}
            writes = [d for _, r in sorted(ev.writes.items()) if (d := _loads(r.data)) is not None]
            loaded = Loaded(verdict, verdict.manifest, blobs, writes)
            out[cid] = loaded
            self._remember(self._verified, ckey, loaded)
        return out, marker

    def _prune(self, tx: RowTx, ex: str, ns: str, keep_last: int,
               max_age_s: float | None = None) -> list[str]:
        """Retention counting only verified checkpoints: keep the newest ``keep_last``
        verified ones (0: delete everything), move every damaged checkpoint aside as
        evidence (:meth:`quarantine`), delete the older verified ones."""
        tx.lock_history(ex, ns)
        ids = [k[0] for k in tx.keys("cp", ex, ns, newest_first=False)]
        if not keep_last:
            doomed = ids
            kept: list[str] = []
            damaged: list[str] = []
        else:
            verdicts = {cid: _judge.judge(self._evidence(tx, ex, ns, cid), self.keys.sign)
                        for cid in ids}
            verified = [cid for cid in ids if verdicts[cid].ok]
            damaged = [cid for cid in ids if not verdicts[cid].ok]
            kept = verified[-keep_last:]
            if max_age_s is not None and kept:
                cutoff = now_ms() - max_age_s * 1000
                young = [cid for cid in kept[:-1]
                         if int((verdicts[cid].manifest or {}).get("created_ms", 0)) >= cutoff]
                kept = [*young, kept[-1]]
            doomed = [cid for cid in verified if cid not in kept]
        if not doomed and not damaged:
            return []
        referenced: set[str] = set()
        for cid in kept:
            doc = _loads(self._read(tx, ("cp", ex, ns, cid)).data)
            assert doc is not None and isinstance(doc.get("blobs"), dict)  # verified
            referenced.update(doc["blobs"])
        if damaged:
            self._quarantine(tx, ex, ns, damaged, keep_blobs=referenced)
        tx.delete("cp", ex, ns, doomed)
        tx.delete("wi", ex, ns, doomed)
        for cid in doomed:
            tx.delete("w", ex, ns, [r.name for r in _scan_writes(tx, ex, ns, cid)])
        tx.delete("blob", ex, ns,
                  [k[0] for k in tx.keys("blob", ex, ns) if k[0] not in referenced])
        if kept:
            self._set_meta(tx, ex, ns, head=kept[-1], floor=kept[0], dropped=damaged,
                           reset_head=True)
        else:
            tx.delete("meta", ex, ns)
        return doomed + damaged

    def quarantine(self, execution_id: str, checkpoint_ids: Sequence[str],
                   namespace: str = "") -> None:
        """Move the named checkpoints (manifest, writes index, writes, and the blobs
        only they use) aside as evidence, in one transaction: their rows go to the
        ``x:``-prefixed spaces, byte for byte, and the signed history records them as
        dropped, so the newest remaining verified checkpoint becomes the head."""
        with self.rows.transaction() as tx:
            tx.lock_history(execution_id, namespace)
            keep: set[str] = set()
            for name, _, _ in tx.keys("cp", execution_id, namespace):
                if name not in checkpoint_ids:
                    doc = _loads(self._read(tx, ("cp", execution_id, namespace, name)).data)
                    blobs = doc.get("blobs") if doc else None
                    if not isinstance(blobs, dict):
                        keep = {k[0] for k in tx.keys("blob", execution_id, namespace)}
                        break
                    keep.update(blobs)
            self._quarantine(tx, execution_id, namespace, list(checkpoint_ids), keep_blobs=keep)
            if tx.keys("cp", execution_id, namespace, limit=1):
                self._set_meta(tx, execution_id, namespace, dropped=list(checkpoint_ids),
                               reset_head=True)
            else:
                tx.delete("meta", execution_id, namespace)

    def repair(self, execution_id: str | None = None, *, dry_run: bool = False
               ) -> list[dict[str, Any]]:
        """Re-establish a verified head in every history (or one execution's) that
        needs it: move checkpoints that do not verify aside as evidence
        (:meth:`quarantine`), record checkpoints whose rows are gone as dropped, and
        re-sign the head marker on the newest remaining checkpoint. ``dry_run``:
        only report. Returns one entry per history repaired (or to repair)."""
        histories: set[tuple[str, str]] = set()
        for space in ("cp", "meta"):
            with self.rows.transaction() as tx:
                histories |= {(k[1], k[2]) for k in tx.keys(space, execution_id)}
        out: list[dict[str, Any]] = []
        for ex, ns in sorted(histories):
            verdicts = self.history(ex, ns)
            present = set(self.ids(ex, ns))
            damaged = sorted(v.checkpoint_id for v in verdicts
                             if not v.ok and v.checkpoint_id in present)
            gone = sorted(v.checkpoint_id for v in verdicts if not v.ok
                          and v.checkpoint_id not in present and v.checkpoint_id != "(head)")
            with self.rows.transaction() as tx:
                before, problem = self.head(tx, ex, ns)
            if not damaged and not gone and problem is None and all(v.ok for v in verdicts):
                continue
            entry = {"execution": ex, "namespace": ns, "head_before": before,
                     "moved_aside": damaged, "gone": gone,
                     "problems": [v.to_json() for v in verdicts if not v.ok],
                     "dry_run": dry_run}
            if not dry_run:
                if damaged:
                    self.quarantine(ex, damaged, ns)
                with self.rows.transaction() as tx:
                    if tx.keys("cp", ex, ns, limit=1):
                        self._set_meta(tx, ex, ns, dropped=gone, reset_head=True)
                    else:
                        tx.delete("meta", ex, ns)
                    entry["head_after"] = self.head(tx, ex, ns)[0]
                _log.warning("repaired history %r/%r: moved aside %s, gone %s, head %s",
                             ex, ns, damaged, gone, entry["head_after"])
            out.append(entry)
        return out

    def quarantined(self, execution_id: str, namespace: str = "") -> list[str]:
        """Ids of checkpoints moved aside as evidence (by prune or repair)."""
        with self.rows.transaction() as tx:
            return [k[0] for k in tx.keys("x:cp", execution_id, namespace,
                                          newest_first=False)]

    def _quarantine(self, tx: RowTx, ex: str, ns: str, ids: Sequence[str], *,
                    keep_blobs: set[str]) -> None:
        for cid in ids:
            moved: list[tuple[str, str]] = [("cp", cid), ("wi", cid)]
            moved += [("w", r.name) for r in _scan_writes(tx, ex, ns, cid)]
            doc = _loads(self._read(tx, ("cp", ex, ns, cid)).data)
            blobs = doc.get("blobs") if doc else None
            if isinstance(blobs, dict):
                moved += [("blob", b) for b in blobs if isinstance(b, str)
                          and b not in keep_blobs]
            for space, name in moved:
                data = tx.get(space, ex, ns, name)
                if data is None:
                    continue
                tx.upsert("x:" + space, ex, ns, name, data)
                if space != "blob" or name not in keep_blobs:
                    tx.delete(space, ex, ns, [name])
            _log.warning("execution %r/%r: checkpoint %r moved aside as evidence "
                         "(spaces x:cp, x:wi, x:w, x:blob)", ex, ns, cid)

    def _drop(self, tx: RowTx, ex: str, ns: str, ids: Sequence[str]) -> None:
        """Delete the named checkpoints (not the oldest ones: see :meth:`prune`) with
        their writes, recording them as deliberately dropped in the signed marker."""
        tx.lock_history(ex, ns)  # before any delete: writers of the history hold it
        tx.delete("cp", ex, ns, list(ids))
        tx.delete("wi", ex, ns, list(ids))
        for cid in ids:
            tx.delete("w", ex, ns, [r.name for r in _scan_writes(tx, ex, ns, cid)])
        if tx.scan("cp", ex, ns):
            self._set_meta(tx, ex, ns, dropped=ids)
        else:
            tx.delete("meta", ex, ns)
            tx.delete("blob", ex, ns)


def _scan_writes(tx: RowTx, ex: str, ns: str, cid: str) -> list[Any]:
    prefix = writes_prefix(cid)
    return [r for r in tx.scan("w", ex, ns, prefix) if r.name.startswith(prefix)]


_KIND_NAMES = {KIND_AGENT: "agent checkpoints (AgentCheckpointStore)",
               KIND_LANGGRAPH: "a LangGraph thread's checkpoints (SealstreamSaver)"}


def other_kind(doc: Mapping[str, Any], wanted: str) -> AgentVerdict:
    """The verdict for a checkpoint of another kind than the reader's."""
    ex, ns, cid = str(doc.get("execution")), str(doc.get("ns")), str(doc.get("id"))
    found = _KIND_NAMES.get(str(doc.get("kind")), f"checkpoints of kind {doc.get('kind')!r}")
    return AgentVerdict(
        ex, ns, cid, _judge.INCONSISTENT, "OTHER_KIND",
        f"execution {ex!r} holds {found}, not {_KIND_NAMES[wanted]}: an execution id "
        "holds one kind; give the other its own id")


def _policy(value: Any) -> str:
    if value not in FALLBACKS:
        raise SpecError(f"fallback: expected 'refuse' or 'verified', got {value!r}")
    return str(value)


def _blob_names(doc: Mapping[str, Any] | None) -> list[str]:
    """The blob names a (parsed, not yet verified) manifest lists, sorted."""
    entries = doc.get("blobs") if doc is not None else None
    if not isinstance(entries, dict):
        return []
    return sorted(n for n in entries if isinstance(n, str))


def _loads(data: bytes | None) -> dict[str, Any] | None:
    if data is None:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None
