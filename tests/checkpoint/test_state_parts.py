"""A state split into parts (one per worker of a distributed run): the names a
manifest may give them, and the whole state rebuilt from them, verified."""

from __future__ import annotations

import polars as pl
import pytest

from sealstream.checkpoint.manifest import part_name, path_problem
from sealstream.state import incremental
from sealstream.state.codec import encode_table, sha256_hex

CP = "cp-000000000007"


def test_part_roles_name_their_own_files_only() -> None:
    assert part_name(2) == "state.part-0002.arrow"
    assert path_problem(7, "part:2", f"{CP}/state.part-0002.arrow") is None
    assert path_problem(7, "part:2", f"{CP}/state.part-0003.arrow") is not None
    assert path_problem(7, "part:2", "cp-000000000006/state.part-0002.arrow") is not None
    assert path_problem(7, "part:x", f"{CP}/state.part-0002.arrow") is not None
    assert path_problem(7, "part:12345", f"{CP}/state.part-12345.arrow") is not None


def _entry(name: str, data: bytes) -> dict[str, object]:
    return {"path": f"{CP}/{name}", "sha256": sha256_hex(data), "bytes": len(data)}


def test_the_state_is_the_union_of_its_parts_and_each_is_verified() -> None:
    head = pl.DataFrame({"__key": ["x"], "n": [1]}).clear()
    parts = [pl.DataFrame({"__key": ["a", "c"], "n": [1, 3]}),
             pl.DataFrame({"__key": ["b"], "n": [2]})]
    blobs = {"state.arrow": encode_table(head, {"watermark": 5})}
    for i, p in enumerate(parts):
        blobs[part_name(i)] = encode_table(p, {"watermark": 5})
    files = {"state": _entry("state.arrow", blobs["state.arrow"]),
             "part:1": _entry(part_name(1), blobs[part_name(1)]),
             "part:0": _entry(part_name(0), blobs[part_name(0)])}
    store = {f"{CP}/{k}": v for k, v in blobs.items()}
    state, meta = incremental.load_chain(files, store.__getitem__)
    assert meta == {"watermark": 5}
    assert state.sort("__key").to_dicts() == [
        {"__key": "a", "n": 1}, {"__key": "b", "n": 2}, {"__key": "c", "n": 3}]
    store[f"{CP}/{part_name(1)}"] = encode_table(parts[0], {"watermark": 5})  # swapped
    with pytest.raises(ValueError, match="SHA-256"):
        incremental.load_chain(files, store.__getitem__)


def test_incremental_checkpoints_never_build_on_a_state_in_parts() -> None:
    """A single process resuming from a distributed run's checkpoint: its ``state``
    file holds no rows, so the next checkpoint must be a full snapshot."""
    from sealstream._runtime.persist import Checkpointing

    ck = Checkpointing.__new__(Checkpointing)
    ck._incremental = True
    head = {"path": f"{CP}/state.arrow", "sha256": "0" * 64, "bytes": 1}
    ck._remember_chain(7, {"state": head, "part:0": dict(head)})
    assert ck._chain is None
    ck._remember_chain(7, {"state": head})
    assert ck._chain == {incremental.BASE_ROLE: head}
