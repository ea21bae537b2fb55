"""A reusable pytest contract suite for checkpoint stores.

Subclass :class:`StoreContract` in a test module (the subclass name must start
with ``Test``) and say how to build the store and how to damage what it holds
behind its back::

    from sealstream.testing.store_contract import StoreContract

    class TestLocalStore(StoreContract):
        def make_store(self, where, pipeline, key=None):
            return LocalCheckpointStore(where / "ckpt", encryption_key=key)

        def tamper(self, store, rel, data):
            ...  # replace (or, with None, remove) the stored bytes of blob ``rel``

        def kept_aside(self, store, cid):
            ...  # the stored bytes of checkpoint ``cid`` after move_aside

Every ``test_*`` method then runs against that store. What is checked (the
contract of :class:`sealstream.checkpoint.stores.CheckpointStore`):

* an absent store has no checkpoints, and reading it creates nothing;
* a written checkpoint reads back (plaintext) and the guard judges it
  ``ATOMIC_CHECKPOINT``; its parent verifies;
* atomic publish: a writer killed at any step before the manifest's publish
  leaves a partial checkpoint (``NO_MANIFEST``) and no manifest;
* create-if-absent: writing an id that exists fails and changes nothing;
* ids are listed in numeric order whatever the writing order;
* the run lock is refused to a second holder (naming the first) and is free
  again after release;
* ``move_aside`` takes a checkpoint out of the listing, keeps its bytes and its
  id (``max_id_ever``), and is a no-op the second time; ``delete`` removes it;
* the guard's verdicts when a component is deleted, truncated, flipped or
  replaced through the store's own storage (:meth:`StoreContract.tamper`);
* with an encryption key, nothing is stored in clear, and the encryption
  verdicts (no key, damaged envelope) are the same as the directory store's.

:func:`sample_checkpoint` builds the files and the sealed manifest of one
checkpoint the way the engine does.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from sealstream.checkpoint import crypto, guard
from sealstream.checkpoint.manifest import (
    MANIFEST_NAME,
    RECEIPTS_NAME,
    STATE_NAME,
    seal,
)
from sealstream.checkpoint.stores import CheckpointStore, checkpoint_dirname
from sealstream.errors import CheckpointError, LockHeldError
from sealstream.state.codec import WATERMARK_META, encode_table

__all__ = ["PIPELINE", "StoreContract", "sample_checkpoint"]

PIPELINE = "contract"
KEY = b"k" * 32  # the encryption key of the encrypted cases
SIGNING_KEY = b"contract signing key"


class _Crash(Exception):
    """Stands for a SIGKILL at a crash point."""


def sample_checkpoint(cid: int, parent: int | None = None, *, key: bytes | None = SIGNING_KEY,
                      pipeline: str = PIPELINE) -> tuple[dict[str, bytes], bytes]:
    """The files and the sealed manifest of checkpoint ``cid`` as the engine writes
    them (watermark, positions and receipts growing with ``cid``)."""
    t = 10_000 * cid
    wm = {"max_delay_ms": 1000, "max_time": [t], "exhausted": [False],
          "global_ms": t - 1000, "partition_ms": [t - 1000]}
    state = encode_table(pl.DataFrame({"key": [f"k{cid}"], "n": [cid]}),
                         {WATERMARK_META.decode(): wm})
    summary = {"results": cid, "late": 0, "errors": 0, "digest": "d" * 64,
               "last_epoch": cid}
    receipts = json.dumps({"summary": summary, "epochs": [{
        "epoch": cid,
        "results": {"count": 1, "digest": "a" * 64, "tokens": [f"part-{cid}.jsonl"],
                    "max_window_end": 0},
    }]}, sort_keys=True, indent=1).encode()
    files = {STATE_NAME: state, RECEIPTS_NAME: receipts}
    d = checkpoint_dirname(cid)
    entries = {role: {"path": f"{d}/{name}", "sha256": hashlib.sha256(files[name]).hexdigest(),
                      "bytes": len(files[name])}
               for role, name in (("state", STATE_NAME), ("receipts", RECEIPTS_NAME))}
    body = {
        "format": 1, "id": cid, "parent": parent, "pipeline": pipeline,
        "fingerprint": "f" * 64,
        "definition": {"format": 1, "pipeline": pipeline},
        "created_ms": 1_700_000_000_000 + cid, "epoch": cid, "lateness_ms": 0,
        "watermark": wm,
        "positions": [{"partition": "in.jsonl", "next_offset": 100 * cid,
                       "resume": {"offset": 100 * cid, "byte": 1000 * cid,
                                  "identity": "x"}}],
        "files": entries,
        "state": {"open_windows": 1, "sha256": entries["state"]["sha256"]},
        "receipts": summary,
        "sinks": {"results": {"epoch": cid, "tokens": [f"part-{cid}.jsonl"]}},
        "counters": {"events": cid, "late_events": 0, "bad_records": 0, "results": cid},
    }
    return files, seal(body, key)


def _flip(data: bytes) -> bytes:
    i = len(data) // 2
    return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:]


def _retag(data: bytes) -> bytes:
    doc = json.loads(data)
    doc["epoch"] = int(doc["epoch"]) + 1  # a signed field changed, JSON still valid
    return json.dumps(doc).encode()


#: (blob, how it is damaged, expected verdict, expected reason)
CORRUPTIONS: list[tuple[str, str, str, str]] = [
    (STATE_NAME, "delete", guard.PARTIAL, "FILE_MISSING"),
    (STATE_NAME, "truncate", guard.PARTIAL, "FILE_TRUNCATED"),
    (STATE_NAME, "flip", guard.INCONSISTENT, "HASH_MISMATCH"),
    (STATE_NAME, "extend", guard.INCONSISTENT, "HASH_MISMATCH"),
    (RECEIPTS_NAME, "delete", guard.PARTIAL, "NO_RECEIPTS"),
    (RECEIPTS_NAME, "flip", guard.INCONSISTENT, "HASH_MISMATCH"),
    (MANIFEST_NAME, "delete", guard.PARTIAL, "NO_MANIFEST"),
    (MANIFEST_NAME, "truncate", guard.PARTIAL, "MANIFEST_UNREADABLE"),
    (MANIFEST_NAME, "retag", guard.INCONSISTENT, "SIGNATURE_MISMATCH"),
]


def _damage(how: str, data: bytes) -> bytes | None:
    if how == "delete":
        return None
    if how == "truncate":
        return data[: len(data) // 2]
    if how == "flip":
        return _flip(data)
    if how == "extend":
        return data + b"\x00"
    assert how == "retag"
    return _retag(data)


class StoreContract:
    """The contract every checkpoint store must pass; see the module docstring."""

    # ------------------------------------------------------------ to implement
    def make_store(self, where: Path, pipeline: str = PIPELINE,
                   key: bytes | None = None) -> CheckpointStore:
        """A store at a location under the empty directory ``where`` (the same
        location for the same ``where``), encrypting with ``key``."""
        raise NotImplementedError

    def tamper(self, store: CheckpointStore, rel: str, data: bytes | None) -> None:
        """Replace the stored bytes of blob ``rel`` (None: remove it), bypassing the
        store's API, as a disk fault or an intruder would."""
        raise NotImplementedError

    def stored(self, store: CheckpointStore, rel: str) -> bytes | None:
        """The stored (possibly encrypted) bytes of blob ``rel``."""
        raise NotImplementedError

    def kept_aside(self, store: CheckpointStore, cid: int) -> list[bytes]:
        """The stored bytes of every blob of ``cid`` kept after ``move_aside``."""
        raise NotImplementedError

    def pipelines_in(self, store: CheckpointStore) -> list[str] | None:
        """For a store several pipelines share (a database): the pipeline names it
        holds, sorted. None (the default) for a store that belongs to one job, which
        skips :meth:`test_pipelines_sharing_the_store_are_isolated`."""
        return None

    def test_pipelines_sharing_the_store_are_isolated(self, tmp_path: Path) -> None:
        """Each pipeline sees only its own checkpoints, ids, retention and lock."""
        a = self.make_store(tmp_path, "a")
        b = self.make_store(tmp_path, "b")
        if self.pipelines_in(a) is None:
            pytest.skip("this store belongs to one job")
        a.ensure_root()
        files, manifest = sample_checkpoint(1, pipeline="a")
        a.write_checkpoint(1, files, manifest)
        files, manifest = sample_checkpoint(1, pipeline="b")
        b.write_checkpoint(1, files, manifest)  # the same id, another pipeline
        files, manifest = sample_checkpoint(2, 1, pipeline="b")
        b.write_checkpoint(2, files, manifest)
        assert a.ids() == [1] and b.ids() == [1, 2]
        assert self.pipelines_in(a) == ["a", "b"]
        b.move_aside(2, "test")
        assert a.max_id_ever() == 1 and b.max_id_ever() == 2
        a.delete(1)
        assert a.ids() == [] and b.ids() == [1]
        policy = guard.Policy(key=SIGNING_KEY, pipeline="b")
        assert guard.judge(b.evidence(1), None, policy).ok
        with a.locked():  # one writer per job, not per store
            assert b.is_locked() is None
            with b.locked():
                held = a.is_locked()
                assert held is not None and '"pid"' in held
        a.close()
        b.close()

    # ------------------------------------------------------------ helpers
    def _store(self, tmp_path: Path, **kw: Any) -> CheckpointStore:
        store = self.make_store(tmp_path, **kw)
        store.ensure_root()
        return store

    @staticmethod
    def _write(store: CheckpointStore, cid: int, parent: int | None = None,
               crash: Any = None) -> tuple[dict[str, bytes], bytes]:
        files, manifest = sample_checkpoint(cid, parent)
        store.write_checkpoint(cid, files, manifest, crash=crash)
        return files, manifest

    @staticmethod
    def _judge(store: CheckpointStore, cid: int) -> guard.Verdict:
        policy = guard.Policy(key=SIGNING_KEY)
        return guard.judge(store.evidence(cid), store.verified_parent(cid, SIGNING_KEY),
                           policy)

    # ------------------------------------------------------------ tests
    def test_absent_store_is_empty(self, tmp_path: Path) -> None:
        store = self.make_store(tmp_path)
        assert not store.exists()
        assert store.ids() == []
        assert store.max_id_ever() == 0
        assert store.is_locked() is None
        assert store.read_manifest(1) is None
        assert not store.exists()

    def test_written_checkpoint_reads_back_and_is_atomic(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        assert store.exists()
        self._write(store, 1)
        files, manifest = self._write(store, 2, parent=1)
        assert store.ids() == [1, 2]
        assert store.max_id_ever() == 2
        d = checkpoint_dirname(2)
        for name, data in files.items():
            assert store.read(f"{d}/{name}") == data
        assert store.read_manifest_bytes(2) == manifest
        assert store.has_manifest(2)
        assert store.files_of(2) == sorted(f"{d}/{n}" for n in [*files, MANIFEST_NAME])
        parent = store.verified_parent(2, SIGNING_KEY)
        assert parent is not None and parent["id"] == 1
        for cid in (1, 2):
            v = self._judge(store, cid)
            assert (v.verdict, v.reason) == (guard.ATOMIC, "OK"), v.message
        with pytest.raises(FileNotFoundError):
            store.read(f"{d}/nothing.arrow")

    @pytest.mark.parametrize("point", ["after_write_state", "after_write_receipts",
                                       "before_manifest_publish"])
    def test_publish_is_atomic(self, tmp_path: Path, point: str) -> None:
        store = self._store(tmp_path)
        self._write(store, 1)

        def crash(at: str) -> None:
            if at == point:
                raise _Crash(at)

        with pytest.raises(_Crash):
            self._write(store, 2, parent=1, crash=crash)
        assert store.ids() == [1, 2]
        assert not store.has_manifest(2)
        assert store.read_manifest(2) is None
        v = self._judge(store, 2)
        assert (v.verdict, v.reason) == (guard.PARTIAL, "NO_MANIFEST")
        assert self._judge(store, 1).ok
        # recovery moves the partial one aside, and the next id is still unused
        assert store.move_aside(2, "NO_MANIFEST") is not None
        assert store.ids() == [1]
        assert store.max_id_ever() == 2
        self._write(store, 3, parent=1)
        assert self._judge(store, 3).ok

    def test_create_if_absent(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        files, manifest = self._write(store, 1)
        other_files, other_manifest = sample_checkpoint(1, key=b"another key")
        with pytest.raises(CheckpointError):
            store.write_checkpoint(1, other_files, other_manifest)
        assert store.read_manifest_bytes(1) == manifest
        assert store.read(f"{checkpoint_dirname(1)}/{STATE_NAME}") == files[STATE_NAME]
        assert self._judge(store, 1).ok

    def test_listing_is_in_numeric_order(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        for cid in (30, 4, 10**11, 200):
            self._write(store, cid)
        assert store.ids() == [4, 30, 200, 10**11]
        assert store.max_id_ever() == 10**11

    def test_lock_is_refused_to_a_second_holder(self, tmp_path: Path) -> None:
        first = self._store(tmp_path)
        second = self.make_store(tmp_path)
        with first.locked():
            holder = second.is_locked()
            assert holder is not None and '"pid"' in holder
            with pytest.raises(LockHeldError, match="locked"), second.locked():
                pass  # pragma: no cover
        assert second.is_locked() is None
        with second.locked():
            assert first.is_locked() is not None

    def test_move_aside_keeps_the_evidence(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        self._write(store, 1)
        files, manifest = self._write(store, 2, parent=1)
        assert store.move_aside(2, "HASH_MISMATCH") is not None
        assert store.ids() == [1]
        assert store.max_id_ever() == 2
        assert not store.has_manifest(2)
        kept = self.kept_aside(store, 2)
        assert sorted(kept) == sorted([*files.values(), manifest])
        assert store.move_aside(2, "HASH_MISMATCH") is None
        assert self._judge(store, 1).ok

    def test_delete(self, tmp_path: Path) -> None:
        store = self._store(tmp_path)
        self._write(store, 1)
        self._write(store, 2, parent=1)
        store.delete(1)
        store.clear_trash()
        assert store.ids() == [2]
        assert store.read_manifest(1) is None
        assert store.files_of(1) == []
        store.delete(1)  # already gone: nothing to do
        v = self._judge(store, 2)  # a deleted parent does not condemn its child
        assert v.ok, v.message

    @pytest.mark.parametrize(("blob", "how", "verdict", "reason"), CORRUPTIONS)
    def test_guard_verdicts_on_damage(self, tmp_path: Path, blob: str, how: str,
                                      verdict: str, reason: str) -> None:
        store = self._store(tmp_path)
        self._write(store, 1)
        rel = f"{checkpoint_dirname(1)}/{blob}"
        raw = self.stored(store, rel)
        assert raw is not None
        self.tamper(store, rel, _damage(how, raw))
        v = self._judge(store, 1)
        assert (v.verdict, v.reason) == (verdict, reason), v.message

    def test_encrypted_at_rest(self, tmp_path: Path) -> None:
        store = self._store(tmp_path, key=KEY)
        files, manifest = self._write(store, 1)
        d = checkpoint_dirname(1)
        for name, data in [*files.items(), (MANIFEST_NAME, manifest)]:
            raw = self.stored(store, f"{d}/{name}")
            assert raw is not None and crypto.is_envelope(raw) and raw != data
            assert store.read(f"{d}/{name}") == data
        assert self._judge(store, 1).ok
        keyless = self.make_store(tmp_path, key=None)
        v = self._judge(keyless, 1)
        assert (v.verdict, v.reason) == (guard.INCONSISTENT, "ENCRYPTED_WITHOUT_KEY")
        raw = self.stored(store, f"{d}/{STATE_NAME}")
        assert raw is not None
        self.tamper(store, f"{d}/{STATE_NAME}", _flip(raw))
        v = self._judge(store, 1)
        assert (v.verdict, v.reason) == (guard.INCONSISTENT, "DECRYPTION_FAILED")

    def test_plaintext_refused_when_a_key_is_set(self, tmp_path: Path) -> None:
        self._write(self._store(tmp_path, key=None), 1)
        v = self._judge(self.make_store(tmp_path, key=KEY), 1)
        assert (v.verdict, v.reason) == (guard.INCONSISTENT, "PLAINTEXT_WHEN_ENCRYPTED")

    # ------------------------------------------------------------ step plans
    def test_step_plans_round_trip_chain_and_damage(self, tmp_path: Path) -> None:
        from sealstream.checkpoint.plans import StepPlan, judge_plan, plan_name

        store = self._store(tmp_path, key=None)
        store.ensure_root()
        prev = ""
        plans = []
        for step in (1, 2, 3):
            plan = StepPlan(step=step, prev=prev, partitions=("p0", "p1"),
                            ranges={"p0": (step * 10, step * 10 + 10)}, idle=("p1",),
                            advance_ms=None, now_ms=step)
            store.write_plan(step, plan.encode(b"k"))
            plans.append(plan)
            prev = plan.digest()
        assert store.plan_steps() == [1, 2, 3]
        assert store.ids() == []  # plans are not checkpoints
        v = judge_plan(store.read_plan(2), 2, plans[0].digest(), b"k")
        assert v.ok and v.plan == plans[1]
        # never overwritten
        with pytest.raises(CheckpointError):
            store.write_plan(2, plans[1].encode(b"k"))
        # a record out of its chain, unsigned or damaged is refused, with a reason
        assert judge_plan(store.read_plan(3), 3, "other", b"k").reason == "CHAIN_BROKEN"
        assert judge_plan(store.read_plan(3), 3, plans[1].digest(), None).reason == \
            "SIGNED_WITHOUT_KEY"
        raw = store.read_plan(3)
        assert raw is not None
        self.tamper(store, plan_name(3), raw.replace(b'"now_ms":3', b'"now_ms":4'))
        assert judge_plan(store.read_plan(3), 3, plans[1].digest(), b"k").reason == \
            "SIGNATURE_MISMATCH"
        store.move_plan_aside(3, "SIGNATURE_MISMATCH")
        assert store.plan_steps() == [1, 2]
        store.delete_plans([1])
        assert store.plan_steps() == [2]
