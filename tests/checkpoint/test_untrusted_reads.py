"""What a store reads of a checkpoint before trusting it: bounded documents, names a
writer produces, regular files only, never more than the recorded size, and nothing at
all that a manifest with a bad signature names."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from sealstream import _fs
from sealstream.checkpoint import crypto, guard
from sealstream.checkpoint import manifest as mf
from sealstream.checkpoint.stores import LocalCheckpointStore
from sealstream.state.codec import encode_table, schema_problem

KEY = b"k-untrusted"


# ---------------------------------------------------------------- bounded JSON
def test_load_json_bounds_nesting_and_size() -> None:
    assert mf.load_json(b'{"a": [[1]]}') == {"a": [[1]]}
    ok = "[" * mf.MAX_JSON_DEPTH + "]" * mf.MAX_JSON_DEPTH
    assert mf.load_json(ok) is not None
    deeper = "[" * (mf.MAX_JSON_DEPTH + 1) + "]" * (mf.MAX_JSON_DEPTH + 1)
    with pytest.raises(ValueError, match="nested deeper than 64 levels"):
        mf.load_json(deeper, "manifest")
    with pytest.raises(ValueError, match="manifest is nested deeper"):
        mf.load_json(b"[" * 100_000, "manifest")  # the interpreter's limit: same answer
    with pytest.raises(ValueError, match="larger than"):
        mf.load_json(b" " * (mf.MAX_JSON_BYTES + 1))


def test_the_guard_judges_a_deep_manifest_partial_without_raising() -> None:
    v = guard.judge(guard.Evidence(3, b"[" * 100_000), None, guard.Policy())
    assert (v.verdict, v.reason) == (guard.PARTIAL, "MANIFEST_UNREADABLE")


# ---------------------------------------------------------------- names
@pytest.mark.parametrize("role,path,ok", [
    ("state", "cp-000000000007/state.arrow", True),
    ("state", "cp-000000000007/state.delta.arrow", True),
    ("receipts", "cp-000000000007/receipts.json", True),
    ("suppress", "cp-000000000007/suppress.arrow", True),
    ("base", "cp-000000000003/state.arrow", True),
    ("delta:000000000005", "cp-000000000005/state.delta.arrow", True),
    ("state", "/dev/zero", False),
    ("state", "/tmp/cp-000000000007/state.arrow", False),
    ("state", "cp-000000000007/../cp-000000000007/state.arrow", False),
    ("state", "cp-000000000006/state.arrow", False),  # another checkpoint's own file
    ("state", "cp-000000000007/receipts.json", False),
    ("receipts", "cp-000000000007/MANIFEST.json", False),
    ("base", "cp-000000000007/state.arrow", False),  # a base is older
    ("base", "cp-000000000009/state.arrow", False),
    ("delta:000000000005", "cp-000000000004/state.delta.arrow", False),
    ("delta:x", "cp-000000000004/state.delta.arrow", False),
    ("other", "cp-000000000007/state.arrow", False),
    ("state", "cp-7/state.arrow", False),
    ("state", "cp-000000000007/state.arrow\n", False),
])
def test_only_names_a_writer_produces_are_accepted(role: str, path: str, ok: bool) -> None:
    assert (mf.path_problem(7, role, path) is None) is ok


# ---------------------------------------------------------------- the store
def _checkpoint(tmp_path: Path, key: bytes | None = None) -> LocalCheckpointStore:
    import polars as pl

    store = LocalCheckpointStore(tmp_path / "ckpt", encryption_key=None)
    store.ensure_root()
    wm = {"global_ms": 10, "partition_ms": [10]}
    state = encode_table(pl.DataFrame({"key": ["a"], "n": [1]}),
                         {"sealstream.watermark": wm})
    receipts = json.dumps({"summary": {}, "epochs": []}).encode()
    d = "cp-000000000001"
    body = {
        "format": 1, "id": 1, "pipeline": "p", "fingerprint": "f", "watermark": wm,
        "positions": [], "receipts": {}, "sinks": {}, "created_ms": 0,
        "files": {
            "state": {"path": f"{d}/state.arrow", "sha256": hashlib.sha256(state).hexdigest(),
                      "bytes": len(state)},
            "receipts": {"path": f"{d}/receipts.json",
                         "sha256": hashlib.sha256(receipts).hexdigest(),
                         "bytes": len(receipts)},
        },
    }
    store.write_checkpoint(1, {"state.arrow": state, "receipts.json": receipts},
                           mf.seal(body, key))
    assert guard.judge(store.evidence(1, key), None, guard.Policy(key=key)).ok
    return store


class Counting(LocalCheckpointStore):
    """Records every blob read."""

    reads: list[str]

    def _read(self, rel: str, limit: int | None) -> bytes | None:
        self.reads.append(rel)
        return super()._read(rel, limit)


def test_with_a_key_nothing_a_badly_signed_manifest_names_is_read(tmp_path: Path) -> None:
    _checkpoint(tmp_path, KEY)
    store = Counting(tmp_path / "ckpt", encryption_key=None)
    store.reads = []
    ev = store.evidence(1, b"another key")
    assert store.reads == ["cp-000000000001/MANIFEST.json"]
    assert ev.unread == "SIGNATURE_MISMATCH" and not ev.files
    v = guard.judge(ev, None, guard.Policy(key=b"another key"))
    assert (v.verdict, v.reason) == (guard.INCONSISTENT, "SIGNATURE_MISMATCH")
    store.reads = []
    assert guard.judge(store.evidence(1, KEY), None, guard.Policy(key=KEY)).ok
    assert len(store.reads) == 3


def test_a_file_longer_than_recorded_is_read_only_up_to_its_size(tmp_path: Path) -> None:
    store = _checkpoint(tmp_path)
    state = tmp_path / "ckpt" / "cp-000000000001" / "state.arrow"
    size = state.stat().st_size
    with open(state, "ab") as f:
        f.write(b"\0" * (64 << 20))
    ev = store.evidence(1, None)
    fact = ev.files["cp-000000000001/state.arrow"]
    assert size < fact.size <= size + crypto.OVERHEAD + 1  # not the 64 MiB appended
    v = guard.judge(ev, None, guard.Policy())
    assert (v.verdict, v.reason) == (guard.INCONSISTENT, "HASH_MISMATCH")


def test_read_regular_refuses_fifos_devices_and_links_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(_fs.NotRegularFileError):
        _fs.read_regular(tmp_path / "fifo", 10)
    with pytest.raises(_fs.NotRegularFileError):
        _fs.read_regular("/dev/zero", 10)
    (tmp_path / "real").write_bytes(b"0123456789")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        _fs.read_regular(tmp_path / "link", 10)
    assert _fs.read_regular(tmp_path / "real", 3) == b"0123"
    assert _fs.read_regular(tmp_path / "real") == b"0123456789"


def test_the_store_never_opens_a_name_outside_itself(tmp_path: Path) -> None:
    store = _checkpoint(tmp_path)
    (tmp_path / "outside").write_bytes(b"secret")
    assert store._raw(str(tmp_path / "outside")) is None
    assert store._raw("../outside") is None
    assert store._raw("cp-000000000001/../../outside") is None


# ---------------------------------------------------------------- state schema
def test_extension_and_unexpected_types_are_a_schema_problem() -> None:
    import pyarrow.ipc as ipc

    def stream(table: pa.Table) -> bytes:
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        return bytes(sink.getvalue().to_pybytes())

    plain = pa.table({"key": ["a"], "n": pa.array([1], pa.int64()),
                      "l": pa.array([[1.5]], pa.list_(pa.float64()))})
    assert schema_problem(stream(plain)) is None
    tagged = pa.schema([pa.field("x", pa.int64(),
                                 metadata={b"ARROW:extension:name": b"forged.unregistered"})])
    ext = pa.table({"x": pa.array([1], pa.int64())}).cast(tagged)
    assert "forged.unregistered" in (schema_problem(stream(ext)) or "")
    when = pa.table({"t": pa.array([1], pa.timestamp("ms"))})
    assert "which no state holds" in (schema_problem(stream(when)) or "")
    nested = pa.table({"s": pa.array([{"u": 1}], pa.struct([("u", pa.duration("s"))]))})
    assert "'s.u'" in (schema_problem(stream(nested)) or "")
    assert schema_problem(b"not arrow") is None  # unreadable: reading says why
