"""JsonlDirSink specifics: file layout, frame checks, real I/O failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sealstream.errors import SinkError
from sealstream.sinks import CommittedFile, JsonlDirSink
from sealstream.testing.sink_contract import records_frame, results_frame, sample_rows


def _rows(epoch: int, n: int = 3) -> list[dict[str, object]]:
    return sample_rows("results", epoch, n=n)


def test_file_names_and_exact_bytes(tmp_path: Path) -> None:
    sink = JsonlDirSink(tmp_path / "out", "results", "abc123")
    rows = _rows(7)
    frame = results_frame(rows)
    sink.write(7, frame)
    assert os.listdir(tmp_path / "out") == [".part-000000000007-abc123.jsonl.inprogress"]
    tokens = sink.prepare(7)
    assert tokens == ["part-000000000007-abc123.jsonl"]
    assert sink.prepare(7) == tokens  # asking again gives the same tokens
    sink.commit(7, tokens)
    text = (tmp_path / "out" / tokens[0]).read_text(encoding="utf-8")
    assert text == "".join(line + "\n" for line in frame["__json"])
    assert [json.loads(x) for x in text.splitlines()] == rows


def test_large_epoch_numbers(tmp_path: Path) -> None:
    sink = JsonlDirSink(tmp_path, "results", "r")
    sink.write(10**12, results_frame(_rows(1)))
    (token,) = sink.prepare(10**12)
    assert token == "part-1000000000000-r.jsonl"
    sink.commit(10**12, [token])
    assert sink.committed() == [CommittedFile(10**12, token)]


def test_write_after_prepare_is_refused(tmp_path: Path) -> None:
    sink = JsonlDirSink(tmp_path, "results", "r")
    sink.write(1, results_frame(_rows(1)))
    sink.prepare(1)
    with pytest.raises(ValueError, match="already prepared"):
        sink.write(1, results_frame(_rows(1)))


@pytest.mark.parametrize(
    "frame, match",
    [
        (pl.DataFrame({"x": ["{}"]}), "no '__json' column"),
        (pl.DataFrame({"__json": [1]}), "must be String"),
        (pl.DataFrame({"__json": ["{}", None]}), "null"),
        (pl.DataFrame({"__json": ['{"a":\n1}']}), "line break"),
    ],
)
def test_bad_frames_are_refused(tmp_path: Path, frame: pl.DataFrame, match: str) -> None:
    sink = JsonlDirSink(tmp_path, "results", "r")
    with pytest.raises(ValueError, match=match):
        sink.write(1, frame)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("token", ["", "a-b", "../x", "ü", "a b"])
def test_bad_run_tokens_are_refused(tmp_path: Path, token: str) -> None:
    with pytest.raises(ValueError, match="run_token"):
        JsonlDirSink(tmp_path, "results", token)


@pytest.mark.parametrize("epoch", [-1, True, 1.0])
def test_bad_epochs_are_refused(tmp_path: Path, epoch: object) -> None:
    sink = JsonlDirSink(tmp_path, "results", "r")
    with pytest.raises(ValueError, match="epoch"):
        sink.write(epoch, results_frame(_rows(1)))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "token", ["../part-000000000001-r.jsonl", "part-000000000002-r.jsonl", "part-1-r.jsonl", "x"]
)
def test_commit_rejects_foreign_tokens(tmp_path: Path, token: str) -> None:
    sink = JsonlDirSink(tmp_path / "out", "results", "r")
    with pytest.raises(SinkError):
        sink.commit(1, [token])


def test_recover_of_a_lost_prepared_token_raises(tmp_path: Path) -> None:
    sink = JsonlDirSink(tmp_path, "results", "r")
    with pytest.raises(SinkError, match="neither"):
        sink.recover({3: ["part-000000000003-r.jsonl"]})


def test_leftover_staging_copy_of_a_committed_file_is_removed(tmp_path: Path) -> None:
    sink = JsonlDirSink(tmp_path, "results", "r")
    sink.write(1, results_frame(_rows(1)))
    tokens = sink.prepare(1)
    sink.commit(1, tokens)
    (tmp_path / f".{tokens[0]}.inprogress").write_text("stale\n")
    sink.commit(1, tokens)
    assert sorted(os.listdir(tmp_path)) == tokens
    assert "stale" not in (tmp_path / tokens[0]).read_text()


def test_noncanonical_names_are_not_ours(tmp_path: Path) -> None:
    (tmp_path / "part-0000000000001-r.jsonl").write_text("{}\n")  # 13 digits, leading 0
    (tmp_path / ".part-0000000000001-r.jsonl.inprogress").write_text("{}\n")
    sink = JsonlDirSink(tmp_path, "results", "r")
    assert sink.committed() == []
    sink.recover({})
    assert len(os.listdir(tmp_path)) == 2


def test_read_ids_reports_unreadable_files(tmp_path: Path) -> None:
    sink = JsonlDirSink(tmp_path, "results", "r")
    (tmp_path / "part-000000000001-r.jsonl").write_text("not json\n")
    with pytest.raises(SinkError, match="cannot read results from"):
        sink.read_ids(sink.committed())
    (tmp_path / "part-000000000001-r.jsonl").write_text('{"key":"a","window_start":1}\n')
    with pytest.raises(SinkError, match="window_end"):
        sink.read_ids(sink.committed())
    with pytest.raises(SinkError, match="cannot read results from"):
        sink.read_ids([CommittedFile(2, "part-000000000002-r.jsonl")])


def test_read_ids_ignores_nested_key_fields(tmp_path: Path) -> None:
    sink = JsonlDirSink(tmp_path, "results", "r")
    lines = [
        '{"window_start":0,"window_end":1,"f":{"key":5},"key":"s"}',
        '{"f":{"key":"t"}, "key" : -12 ,"window_start":0,"window_end":1}',
        '{"key":"{\\"key\\":1}","window_start":0,"window_end":1}',
    ]
    frame = pl.DataFrame({"__json": lines})
    sink.write(1, frame)
    sink.commit(1, sink.prepare(1))
    ids = sink.read_ids(sink.committed())
    assert ids["key"].to_list() == ["s", "-12", '{"key":1}']
    assert ids["__kint"].to_list() == [False, True, False]


def test_records_read_ids_ignore_other_fields(tmp_path: Path) -> None:
    sink = JsonlDirSink(tmp_path, "records", "r")
    rows = [
        {"user": 1, "ts": "2024-01-01T00:00:00Z", "_partition": "in/a.jsonl", "_offset": 0},
        {"user": [1, 2], "_partition": "in/b.jsonl", "_offset": 7, "_line": 8, "_raw": "{"},
    ]
    sink.write(1, records_frame(rows))
    sink.commit(1, sink.prepare(1))
    ids = sink.read_ids(sink.committed())
    assert ids.to_dicts() == [
        {"_partition": "in/a.jsonl", "_offset": 0},
        {"_partition": "in/b.jsonl", "_offset": 7},
    ]


_key = st.one_of(
    st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12),
    st.integers(min_value=-(10**30), max_value=10**30),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=st.lists(_key, min_size=1, max_size=12))
def test_read_ids_round_trips_any_key(keys: list[object]) -> None:
    rows = [
        {"key": k, "window_start": i, "window_end": i + 1, "v": 1.5} for i, k in enumerate(keys)
    ]
    with tempfile.TemporaryDirectory() as d:
        sink = JsonlDirSink(d, "results", "h")
        sink.write(0, results_frame(rows))
        sink.commit(0, sink.prepare(0))
        ids = sink.read_ids(sink.committed())
    assert ids["key"].to_list() == [str(k) for k in keys]
    assert ids["__kint"].to_list() == [isinstance(k, int) for k in keys]


# ---------------------------------------------------------------- real I/O failures
def test_parent_is_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(SinkError, match=r"cannot create the results directory .*file/out: \[Errno"):
        JsonlDirSink(tmp_path / "file" / "out", "results", "r")


def test_path_is_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("x")
    with pytest.raises(SinkError, match=r"Not a directory"):
        JsonlDirSink(tmp_path / "out", "results", "r")


def test_directory_removed_under_the_sink(tmp_path: Path) -> None:
    sink = JsonlDirSink(tmp_path / "out", "records", "r")
    (tmp_path / "out").rmdir()
    with pytest.raises(SinkError, match=r"cannot write records to .*\.inprogress: \[Errno 2\]"):
        sink.write(1, records_frame(sample_rows("records", 1)))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_disk_full_becomes_sink_error_and_publishes_nothing(tmp_path: Path) -> None:
    sink = JsonlDirSink(tmp_path, "results", "r")
    staging = tmp_path / ".part-000000000001-r.jsonl.inprogress"
    os.symlink("/dev/full", staging)  # every write to the staging file hits ENOSPC
    frame = results_frame(_rows(1, n=20_000))
    with pytest.raises(SinkError) as err:
        sink.write(1, frame)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"cannot write results to {staging}: [Errno 28] No space left on device")
    assert os.listdir(tmp_path) == []  # staging removed, nothing visible
    with pytest.raises(SinkError, match="No space left"):
        sink.prepare(1)  # the epoch is poisoned: never publish a partial file
    sink.recover({})
    sink.write(1, frame)  # after recovery the epoch can be replayed
    sink.commit(1, sink.prepare(1))
    assert len(sink.read_ids(sink.committed())) == frame.height


def test_rename_failure_becomes_sink_error(tmp_path: Path) -> None:
    sink = JsonlDirSink(tmp_path, "results", "r")
    sink.write(1, results_frame(_rows(1)))
    tokens = sink.prepare(1)
    (tmp_path / tokens[0]).mkdir()  # the final name is taken by a directory
    (tmp_path / tokens[0] / "x").write_text("x")
    with pytest.raises(SinkError, match=r"cannot commit results .* \[Errno \d+\]"):
        sink.commit(1, tokens)
    assert (tmp_path / f".{tokens[0]}.inprogress").is_file()  # still staged for a retry


_FSIZE_SCRIPT = textwrap.dedent(
    """
    import os, resource, signal, sys
    from sealstream.errors import SinkError
    from sealstream.sinks import JsonlDirSink
    from sealstream.testing.sink_contract import results_frame, sample_rows

    out = sys.argv[1]
    sink = JsonlDirSink(out, "results", "r")
    frame = results_frame(sample_rows("results", 1, n=5000))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        sink.write(1, frame)
        sink.prepare(1)
    except SinkError as exc:
        print("SINKERROR", exc)
    print("FILES", sorted(os.listdir(out)))
    """
)


def test_file_size_limit_in_subprocess(tmp_path: Path) -> None:
    """A write that the OS refuses (RLIMIT_FSIZE works even for root)."""
    pytest.importorskip("resource")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-c", _FSIZE_SCRIPT, str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("SINKERROR cannot write results to ")
    assert "[Errno 27] File too large" in lines[0]
    assert lines[1] == "FILES []"


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_write_after_commit_is_refused(tmp_path: Path, kind: str) -> None:
    from sealstream.sinks import ParquetDirSink

    sink = (
        JsonlDirSink(tmp_path, "results", "r")
        if kind == "jsonl"
        else ParquetDirSink(tmp_path, "results", "r")
    )
    sink.write(1, results_frame(_rows(1)))
    sink.commit(1, sink.prepare(1))
    with pytest.raises(ValueError, match="already committed"):
        sink.write(1, results_frame(_rows(1)))


# ---------------------------------------------------------------- files that are not ours
SECRET = "Qz7-very-secret\n"


def _commit_one(path: Path) -> str:
    sink = JsonlDirSink(path, "results", "r")
    sink.write(1, results_frame(_rows(1)))
    (token,) = sink.prepare(1)
    sink.commit(1, [token])
    return token


def test_a_symlinked_results_file_is_refused_and_not_followed(tmp_path: Path) -> None:
    """A results file replaced by a link to a secret: refused with a clear message,
    never read (O_NOFOLLOW), and nothing of the secret is printed."""
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    token = _commit_one(tmp_path / "out")
    link = tmp_path / "out" / token
    link.unlink()
    link.symlink_to(secret)
    sink = JsonlDirSink(tmp_path / "out", "results", "r2")
    for read in (sink.committed, lambda: sink.read_ids([CommittedFile(1, token)])):
        with pytest.raises(SinkError) as err:
            read()
        msg = str(err.value)
        assert msg.startswith(f"{link} is a symbolic link, not a results file written by")
        assert "not followed and nothing of its target was read" in msg
        assert "Qz7" not in msg and "'Q'" not in msg and "secret" not in msg.replace(
            str(tmp_path), "")
    assert secret.read_text() == SECRET


def test_unparsable_file_content_is_never_quoted(tmp_path: Path) -> None:
    """A regular file of our name holding someone else's text (a hard link, a copy):
    the refusal names the file, not its content."""
    token = _commit_one(tmp_path / "out")
    (tmp_path / "out" / token).write_text(SECRET)
    sink = JsonlDirSink(tmp_path / "out", "results", "r2")
    with pytest.raises(SinkError, match="is not JSON Lines as sealstream writes them") as err:
        sink.read_ids(sink.committed())
    assert "Qz7" not in str(err.value) and "'Q'" not in str(err.value)


def test_a_fifo_under_a_final_name_does_not_hang(tmp_path: Path) -> None:
    from sealstream.sinks._files import read_own_file

    out = tmp_path / "out"
    sink = JsonlDirSink(out, "results", "r")
    fifo = out / "part-000000000003-x.jsonl"
    os.mkfifo(fifo)
    assert sink.committed() == []  # not a regular file: not listed
    with pytest.raises(SinkError, match="it is not a regular file"):
        read_own_file(fifo, "results")


def test_commit_replaces_a_planted_link_not_its_target(tmp_path: Path) -> None:
    target = tmp_path / "target.txt"
    target.write_text(SECRET)
    sink = JsonlDirSink(tmp_path / "out", "results", "r")
    sink.write(1, results_frame(_rows(1)))
    (token,) = sink.prepare(1)
    (tmp_path / "out" / token).symlink_to(target)
    sink.commit(1, [token])
    assert not (tmp_path / "out" / token).is_symlink()
    assert target.read_text() == SECRET
    assert sink.read_ids(sink.committed()).height == len(_rows(1))
