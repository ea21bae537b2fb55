"""A reusable pytest contract suite for durable two-phase sinks.

Subclass :class:`SinkContract` in a test module (the subclass name must start
with ``Test``) and say how to build the sink and which files readers see::

    from sealstream.testing.sink_contract import SinkContract

    class TestJsonlResults(SinkContract):
        role = "results"
        visible_glob = "*.jsonl"

        def make_sink(self, path, run_token):
            return JsonlDirSink(path, self.role, run_token)

Every ``test_*`` method then runs against that sink. What is checked (the
contract of :class:`sealstream.sinks._base.Sink` for outputs that can be read
back, i.e. directory sinks):

* staged rows are invisible to a reader that globs ``visible_glob`` (shell
  rules: names starting with ``.`` are not matched) until ``commit``, and
  ``committed()`` does not list them;
* prepare + commit publishes exactly the written rows of the epoch, and so does
  prepare_deferred with its durability step run on another thread;
* a second ``commit`` of the same tokens changes nothing (bytes and listing);
* ``commit`` of prepared tokens whose staged data vanished raises ``SinkError``;
* ``recover`` commits the prepared tokens still staged and deletes every other
  staging file, of this and of other run tokens, and is idempotent;
* an epoch without rows creates no file and ``prepare`` returns ``[]``;
* ``read_ids`` returns exactly the identities written (string and integer
  keys; keys with quotes, backslashes, control characters and non-ASCII; an
  integer beyond Int64; a string that looks like an integer) with the schema
  of :func:`sealstream.sinks._files.id_schema`;
* ``committed()`` is ordered by epoch (numerically, past 12 digits) then token,
  and ignores files of other names that users keep in the directory.

:func:`results_frame` and :func:`records_frame` build sink input frames from
plain rows (test code; they loop in Python on purpose).

Assumed of the sink: it writes under ``path`` only (created if missing), its
staging names start with ``.`` or ``_``, and it accepts any run token of ASCII
letters and digits.
"""

from __future__ import annotations

import glob
import json
import math
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import polars as pl
import pytest

from sealstream.errors import SinkError
from sealstream.sinks._base import JSON_LINE, Sink, SinkRole, id_columns
from sealstream.sinks._files import id_schema

__all__ = ["SinkContract", "records_frame", "results_frame", "sample_rows"]

Row = Mapping[str, Any]


def _json(row: Row) -> str:
    return json.dumps(dict(row), ensure_ascii=False, separators=(",", ":"))


def results_frame(rows: Sequence[Row]) -> pl.DataFrame:
    """A results frame as the runtime hands it to sinks.

    Each row has ``key`` (str or int), ``window_start``, ``window_end`` and any
    aggregates (same names in every row); ``__json`` is the row as compact JSON
    in that field order.
    """
    rows = list(rows)
    aggs = [c for c in (rows[0] if rows else {}) if c not in ("key", "window_start", "window_end")]
    typed = (
        pl.DataFrame({a: [r[a] for r in rows] for a in aggs}, strict=False)
        if aggs
        else pl.DataFrame()
    )
    base = pl.DataFrame(
        {
            "key": [str(r["key"]) for r in rows],
            "__kint": [isinstance(r["key"], int) and not isinstance(r["key"], bool) for r in rows],
            "window_start": [int(r["window_start"]) for r in rows],
            "window_end": [int(r["window_end"]) for r in rows],
        },
        schema={
            "key": pl.String,
            "__kint": pl.Boolean,
            "window_start": pl.Int64,
            "window_end": pl.Int64,
        },
    )
    out = pl.concat([base, typed], how="horizontal") if aggs else base
    return out.with_columns(pl.Series(JSON_LINE, [_json(r) for r in rows], dtype=pl.String))


def records_frame(rows: Sequence[Row]) -> pl.DataFrame:
    """A record-output frame (late events, bad records): each row has
    ``_partition`` (str) and ``_offset`` (int) plus any fields."""
    rows = list(rows)
    return pl.DataFrame(
        {
            "_partition": [r["_partition"] for r in rows],
            "_offset": [r["_offset"] for r in rows],
            JSON_LINE: [_json(r) for r in rows],
        },
        schema={"_partition": pl.String, "_offset": pl.Int64, JSON_LINE: pl.String},
    )


def sample_rows(role: SinkRole, epoch: int, n: int = 3, start: int = 0) -> list[dict[str, Any]]:
    """``n`` distinct rows for ``epoch``: results alternate string and integer keys."""
    if role == "results":
        return [
            {
                "key": f"u{i}" if i % 2 else i,
                "window_start": epoch * 1_000_000 + i * 1000,
                "window_end": epoch * 1_000_000 + i * 1000 + 1000,
                "n": i + 1,
                "total": i * 1.5 + 0.25,
            }
            for i in range(start, start + n)
        ]
    return [
        {"_partition": f"in/p{i % 2}.jsonl", "_offset": epoch * 1_000_000 + i, "user": "u", "ts": i}
        for i in range(start, start + n)
    ]


def _canonical(row: Row) -> str:
    """A comparable text of a row: keys sorted, ``key`` as text, NaN-safe."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if k == "key":
            v = str(v)
        elif isinstance(v, float) and math.isnan(v):
            v = "NaN"
        out[k] = v
    return json.dumps(out, sort_keys=True, ensure_ascii=False)


class SinkContract:
    """The contract tests; see the module docstring. Override :meth:`make_sink`."""

    role: ClassVar[SinkRole] = "results"
    visible_glob: ClassVar[str] = "*"

    # ------------------------------------------------------------------ hooks
    def make_sink(self, path: Path, run_token: str) -> Sink:
        """A new sink writing to directory ``path`` under ``run_token``."""
        raise NotImplementedError

    def frame(self, rows: Sequence[Row]) -> pl.DataFrame:
        return results_frame(rows) if self.role == "results" else records_frame(rows)

    # Where the sink's files are: a directory ``path`` by default. A sink that writes
    # elsewhere (object storage) maps ``path`` to its place and overrides these.
    def names(self, path: Path) -> list[str]:
        """The names directly under ``path`` ([] when it does not exist)."""
        return sorted(os.listdir(path)) if path.exists() else []

    def read_name(self, path: Path, name: str) -> bytes:
        return (path / name).read_bytes()

    def remove_name(self, path: Path, name: str) -> None:
        os.unlink(path / name)

    def put_name(self, path: Path, name: str, data: bytes) -> None:
        """A user's own file ``name`` under ``path`` (a trailing ``/``: a directory)."""
        if name.endswith("/"):
            (path / name).mkdir()
        else:
            (path / name).write_bytes(data)

    def has_name(self, path: Path, name: str) -> bool:
        return os.path.lexists(path / name.rstrip("/"))

    def is_place(self, path: Path) -> bool:
        """``path`` exists as a place to write (a directory)."""
        return path.is_dir()

    def visible_files(self, path: Path) -> list[str]:
        """The names a reader globbing ``visible_glob`` in ``path`` sees, sorted."""
        return sorted(os.path.basename(n) for n in
                      glob.glob(os.path.join(glob.escape(str(path)), self.visible_glob)))

    def visible_rows(self, path: Path) -> list[dict[str, Any]]:
        """Rows that a reader globbing ``visible_glob`` in ``path`` sees.

        Supports ``.jsonl`` (one JSON object per line) and ``.parquet`` files;
        override for other formats.
        """
        rows: list[dict[str, Any]] = []
        for name in self.visible_files(path):
            data = self.read_name(path, name)
            if name.endswith(".parquet"):
                rows.extend(pl.read_parquet(data).to_dicts())
            else:
                text = data.decode("utf-8")
                assert text == "" or text.endswith("\n"), f"{name} does not end with a newline"
                rows.extend(json.loads(line) for line in text.splitlines())
        return rows

    # ------------------------------------------------------------------ helpers
    def assert_visible(self, path: Path, rows: Sequence[Row]) -> None:
        seen = sorted(_canonical(r) for r in self.visible_rows(path))
        want = sorted(_canonical(r) for r in rows)
        assert seen == want

    def ids_of(self, rows: Sequence[Row]) -> pl.DataFrame:
        frame = self.frame(rows)
        return frame.select(list(id_columns(self.role))).cast(
            id_schema(self.role)  # type: ignore[arg-type]
        )

    def staging_files(self, path: Path) -> list[str]:
        return sorted(n for n in self.names(path) if n.startswith((".part", "_part")))

    @staticmethod
    def _sorted(df: pl.DataFrame) -> pl.DataFrame:
        return df.sort(df.columns)

    # ------------------------------------------------------------------ tests
    def test_staged_rows_invisible_until_commit(self, tmp_path: Path) -> None:
        out = tmp_path / "out"
        sink = self.make_sink(out, "run1")
        rows = sample_rows(self.role, 1)
        sink.write(1, self.frame(rows))
        assert self.visible_rows(out) == []
        assert sink.committed() == []
        tokens = sink.prepare(1)
        assert tokens
        assert self.visible_rows(out) == []
        assert sink.committed() == []
        sink.commit(1, tokens)
        self.assert_visible(out, rows)
        assert [c.epoch for c in sink.committed()] == [1] * len(tokens)
        assert self.staging_files(out) == []

    def test_prepare_commit_publishes_exactly_the_rows(self, tmp_path: Path) -> None:
        out = tmp_path / "out"
        sink = self.make_sink(out, "run1")
        a = sample_rows(self.role, 3, n=4)
        b = sample_rows(self.role, 3, n=2, start=10)
        c = sample_rows(self.role, 4, n=5)
        sink.write(3, self.frame(a))
        sink.write(3, self.frame(b))
        sink.write(4, self.frame(c))
        t3 = sink.prepare(3)
        sink.commit(3, t3)
        self.assert_visible(out, a + b)
        t4 = sink.prepare(4)
        sink.commit(4, t4)
        self.assert_visible(out, a + b + c)
        ids = sink.read_ids(sink.committed())
        assert ids.height == len(a + b + c)

    def test_deferred_prepare_publishes_exactly_the_rows(self, tmp_path: Path) -> None:
        """``prepare_deferred``: the tokens ``prepare`` would give, the epoch closed
        to more rows at once, its rows durable once the callable ran (possibly on
        another thread, while the next epoch is written)."""
        out = tmp_path / "out"
        sink = self.make_sink(out, "run1")
        a = sample_rows(self.role, 3, n=4)
        b = sample_rows(self.role, 4, n=3, start=20)
        sink.write(3, self.frame(a))
        tokens, durable = sink.prepare_deferred(3)
        assert tokens == sink.prepare(3)  # asking again gives the same tokens
        with pytest.raises(ValueError):
            sink.write(3, self.frame(b))
        worker = threading.Thread(target=durable)
        worker.start()
        sink.write(4, self.frame(b))  # the next epoch meanwhile
        worker.join()
        sink.commit(3, tokens)
        self.assert_visible(out, a)
        t4, durable4 = sink.prepare_deferred(4)
        durable4()
        sink.commit(4, t4)
        self.assert_visible(out, a + b)
        empty, durable5 = sink.prepare_deferred(5)
        durable5()
        assert empty == []

    def test_commit_twice_is_a_no_op(self, tmp_path: Path) -> None:
        out = tmp_path / "out"
        sink = self.make_sink(out, "run1")
        rows = sample_rows(self.role, 2)
        sink.write(2, self.frame(rows))
        tokens = sink.prepare(2)
        sink.commit(2, tokens)
        before = {n: self.read_name(out, n) for n in self.names(out)}
        listed = sink.committed()
        sink.commit(2, tokens)
        again = self.make_sink(out, "run2")  # a later run re-committing after recovery
        again.commit(2, tokens)
        assert {n: self.read_name(out, n) for n in self.names(out)} == before
        assert sink.committed() == listed
        self.assert_visible(out, rows)

    def test_commit_of_lost_staging_raises(self, tmp_path: Path) -> None:
        out = tmp_path / "out"
        sink = self.make_sink(out, "run1")
        sink.write(2, self.frame(sample_rows(self.role, 2)))
        tokens = sink.prepare(2)
        for name in self.staging_files(out):
            self.remove_name(out, name)
        with pytest.raises(SinkError):
            sink.commit(2, tokens)

    def test_recover_commits_prepared_and_deletes_unreferenced_staging(
        self, tmp_path: Path
    ) -> None:
        out = tmp_path / "out"
        old = self.make_sink(out, "runA")
        r1 = sample_rows(self.role, 1)
        r2 = sample_rows(self.role, 2)
        old.write(1, self.frame(r1))
        t1 = old.prepare(1)  # the checkpoint records t1, then the process dies
        old.write(2, self.frame(r2))
        old.prepare(2)  # prepared but no checkpoint refers to it
        old.write(3, self.frame(sample_rows(self.role, 3)))  # staged, never prepared
        old.close()
        other = self.make_sink(out, "runB")  # a crashed run with another token
        other.write(2, self.frame(sample_rows(self.role, 2, start=50)))
        other.prepare(2)
        other.close()
        assert self.staging_files(out)

        new = self.make_sink(out, "runC")
        new.recover({1: t1})
        self.assert_visible(out, r1)
        assert self.staging_files(out) == []
        assert [(c.epoch, c.token) for c in new.committed()] == [(1, t) for t in sorted(t1)]
        # idempotent: recovering again (another crash) changes nothing
        self.make_sink(out, "runD").recover({1: t1})
        self.assert_visible(out, r1)
        assert self.staging_files(out) == []

    def test_recover_after_commit_and_new_epochs(self, tmp_path: Path) -> None:
        out = tmp_path / "out"
        sink = self.make_sink(out, "runA")
        r1 = sample_rows(self.role, 1)
        sink.write(1, self.frame(r1))
        t1 = sink.prepare(1)
        sink.commit(1, t1)
        new = self.make_sink(out, "runB")
        new.recover({1: t1})
        r2 = sample_rows(self.role, 2)
        new.write(2, self.frame(r2))
        new.commit(2, new.prepare(2))
        self.assert_visible(out, r1 + r2)

    def test_empty_epoch_creates_no_file(self, tmp_path: Path) -> None:
        out = tmp_path / "out"
        sink = self.make_sink(out, "run1")
        before = self.names(out)
        assert sink.prepare(7) == []
        sink.write(8, self.frame([]))
        assert sink.prepare(8) == []
        sink.commit(7, [])
        sink.commit(8, [])
        assert self.names(out) == before
        assert sink.committed() == []
        assert self.visible_rows(out) == []

    def test_read_ids_round_trip(self, tmp_path: Path) -> None:
        out = tmp_path / "out"
        sink = self.make_sink(out, "run1")
        if self.role == "results":
            keys: list[Any] = [
                "u1",
                42,
                -7,
                0,
                "42",
                "-7",
                'qu"ote',
                "back\\slash",
                "ünïcødé ✓ 😀",
                "",
                "tab\there\nnewline",
                "\u2028",
                2**63 - 1,
                -(2**63),
                12345678901234567890123,
                '{"key": 5}',
            ]
            rows: list[dict[str, Any]] = [
                {"key": k, "window_start": i * 10, "window_end": i * 10 + 10, "n": i}
                for i, k in enumerate(keys)
            ]
            ints: list[dict[str, Any]] = [
                {"key": i, "window_start": -5, "window_end": 5, "n": 1} for i in range(3)
            ]
            texts: list[dict[str, Any]] = [
                {"key": f"s{i}", "window_start": 0, "window_end": 1, "n": 2} for i in range(3)
            ]
        else:
            parts = ["in/p0.jsonl", 'we"ird\\päth ✓.jsonl', ""]
            rows = [
                {"_partition": p, "_offset": i, "x": {"_offset": "nested"}}
                for i, p in enumerate(parts)
            ]
            ints = [{"_partition": "a", "_offset": 2**40 + i} for i in range(3)]
            texts = [{"_partition": "b", "_offset": i} for i in range(3)]
        for epoch, chunk in enumerate([rows, ints, texts], start=1):
            sink.write(epoch, self.frame(chunk))
            sink.commit(epoch, sink.prepare(epoch))
        files = sink.committed()
        ids = sink.read_ids(files)
        assert ids.schema == pl.Schema(id_schema(self.role))
        expected = self.ids_of(rows + ints + texts)
        assert self._sorted(ids).equals(self._sorted(expected))
        # a subset of the files gives the identities of those files only
        only_second = sink.read_ids([f for f in files if f.epoch == 2])
        assert self._sorted(only_second).equals(self._sorted(self.ids_of(ints)))
        empty = sink.read_ids([])
        assert empty.height == 0 and empty.schema == pl.Schema(id_schema(self.role))

    def test_committed_ordering(self, tmp_path: Path) -> None:
        out = tmp_path / "out"
        epochs = [10**12, 2, 11, 0, 10**12 + 1, 999_999_999_999]
        for token in ("runB", "runA"):
            sink = self.make_sink(out, token)
            for e in epochs:
                sink.write(e, self.frame(sample_rows(self.role, 1, n=1)))
                sink.commit(e, sink.prepare(e))
        listed = self.make_sink(out, "runC").committed()
        assert [c.epoch for c in listed] == sorted(epochs * 2)
        assert listed == sorted(listed, key=lambda c: (c.epoch, c.token))
        for e in epochs:
            pair = [c.token for c in listed if c.epoch == e]
            assert len(pair) == 2 and pair == sorted(pair)

    def test_foreign_files_are_ignored_and_kept(self, tmp_path: Path) -> None:
        out = tmp_path / "out"
        sink = self.make_sink(out, "run1")
        foreign = [
            "README.md",
            ".gitignore",
            "_SUCCESS",
            "notes.jsonl",
            "part-abc.jsonl",
            "data.parquet",
            "part-12.parquet",
            ".part-1.inprogress",
        ]
        for name in foreign:
            self.put_name(out, name, b"not sealstream output\n")
        self.put_name(out, "subdir/", b"")
        rows = sample_rows(self.role, 5)
        sink.write(5, self.frame(rows))
        tokens = sink.prepare(5)
        sink.commit(5, tokens)
        assert [(c.epoch, c.token) for c in sink.committed()] == [(5, t) for t in tokens]
        self.make_sink(out, "run2").recover({})
        for name in foreign:
            assert self.read_name(out, name) == b"not sealstream output\n"
        assert self.has_name(out, "subdir/")
        assert sink.read_ids(sink.committed()).height == len(rows)

    def test_creates_missing_directory_with_parents(self, tmp_path: Path) -> None:
        out = tmp_path / "a" / "b" / "out"
        sink = self.make_sink(out, "run1")
        assert self.is_place(out)
        assert sink.committed() == []
