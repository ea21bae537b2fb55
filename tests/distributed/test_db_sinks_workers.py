"""Results in PostgreSQL staged and committed by the workers: each key worker stages
its share of an epoch in ``sealstream_sink_staging`` on its own connection (token
``<epoch>-<run>w<i>``), the manifest names every worker's token, each worker commits
its own after the manifest, recovery commits what the restored checkpoint names. The
table equals one process's, no result row crosses the coordinator, and a worker
SIGKILLed between its staging and its commit loses nothing. Results in SQLite stay
on the coordinator (one file on one host)."""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
if str(SCENARIOS) not in sys.path:  # _kafka_story imports _story as its neighbour
    sys.path.append(str(SCENARIOS))

from _kafka_story import kafka_source_spec, produce_input  # noqa: E402
from _story import make_input, write_spec  # noqa: E402

from sealstream._runtime.crash import CrashPoints  # noqa: E402

STORY = {"every_events": 150, "batch_size": 40, "errors": True}
EVENTS = 500
JSONL_SINK = '[sink]\nkind = "jsonl"\npath = "out"'


def _db_spec(d: Path, names: list[str], sink: str, table: str,
             store: str | None = None) -> Path:
    """The story's spec with its results in ``table`` of ``sink`` (a PostgreSQL URL or
    ``sqlite``); ``store``: the checkpoint store's URL (else a directory)."""
    d.mkdir(parents=True, exist_ok=True)
    spec = write_spec(d, names, **STORY)  # type: ignore[arg-type]
    text = spec.read_text()
    assert JSONL_SINK in text
    if sink == "sqlite":
        new = f'[sink]\nkind = "sqlite"\nurl = "sqlite:///results.db"\ntable = "{table}"'
    else:
        new = f'[sink]\nkind = "postgresql"\nurl = {json.dumps(sink)}\ntable = "{table}"'
    text = text.replace(JSONL_SINK, new)
    if store is not None:
        text = text.replace('path = "ckpt"', f"url = {json.dumps(store)}")
    spec.write_text(text)
    return spec


def _run(spec: Path, workers: int | None, **kw: Any) -> Any:
    from sealstream import Job, load_spec
    from sealstream.distributed import DistributedJob

    pipeline = load_spec(spec)
    job = Job(pipeline, **kw) if workers is None else DistributedJob(
        pipeline, workers=workers, **kw)
    job.run()
    return job


#: one process's rows of the story in PostgreSQL, made once per test process
_REF_ROWS: list[list[tuple[Any, ...]]] = []


def _ref_rows(d: Path, pg_url: str) -> list[tuple[Any, ...]]:
    """The table of one process's run of the story (files, EVENTS events) into
    PostgreSQL, run in ``d`` the first time only: the tests only compare with it."""
    if not _REF_ROWS:
        names = make_input(d, events=EVENTS, bad_every=97)
        _run(_db_spec(d, names, pg_url, "ref_results"), None)
        _REF_ROWS.append(_rows(pg_url, "ref_results"))
    return _REF_ROWS[0]


def _pg(url: str, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute(sql, args).fetchall()


def _rows(url: str, table: str) -> list[tuple[Any, ...]]:
    """Every row of ``table``, each value as PostgreSQL prints it, in id order (the
    first four columns are a single key's id, the first five a two-field key's)."""
    cols = [r[0] for r in _pg(url, "SELECT column_name FROM information_schema.columns "
                                   "WHERE table_name = %s ORDER BY ordinal_position", (table,))]
    select = ", ".join(f'"{c}"::text' for c in cols)
    return _pg(url, f'SELECT {select} FROM "{table}" ORDER BY 1, 2, 3, 4, 5')


def _assert_same_rows(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> None:
    """The same rows in the same id order, every value the same text, except a float sum
    or mean (a text with a point or an exponent), equal within 1e-9 (the workers may add
    a window's floats in another order, as ``_story.assert_same_output`` allows)."""
    assert want and len(got) == len(want), (len(got), len(want))
    for g, w in zip(got, want, strict=True):
        for a, b in zip(g, w, strict=True):
            if a == b:
                continue
            assert a is not None and b is not None and any(c in b for c in ".eE"), (g, w)
            assert math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12), (g, w)


def _tokens(url: str, table: str) -> list[str]:
    return [t for (t,) in _pg(url, "SELECT token FROM sealstream_sink_commits WHERE tbl = %s "
                                   "ORDER BY token", (table,))]


def _staged(url: str, table: str) -> list[str]:
    return [t for (t,) in _pg(url, "SELECT token FROM sealstream_sink_staging WHERE tbl = %s "
                                   "ORDER BY token", (table,))]


def _by_worker(tokens: list[str]) -> set[str]:
    """The stagers of commit tokens: ``w<i>`` for worker i, ``coordinator`` else."""
    return {("w" + t.rsplit("w", 1)[1]) if "w" in t.split("-", 1)[1] else "coordinator"
            for t in tokens}


@pytest.mark.parametrize("store", ["dir", "same"])
def test_postgres_results_staged_by_two_workers_equal_one_process(
        ray_cluster: Any, pg_url: str, tmp_path: Path, store: str) -> None:
    """A bounded job, 2 workers: the table equals one process's, every epoch's rows
    committed under the workers' own tokens (none of the coordinator's), no staging
    left, and no result row crossed the coordinator (``output_bytes`` stays 0; it was
    every fired window when the coordinator staged them). ``same``: the checkpoint
    store in the results' database too."""
    want = _ref_rows(tmp_path / "ref", pg_url)
    d = tmp_path / "dist"
    names = make_input(d, events=EVENTS, bad_every=97)
    job = _run(_db_spec(d, names, pg_url, "dist_results",
                        pg_url if store == "same" else None), 2)
    assert job.counters.results_written > 0
    assert sum(job.merger.output_bytes) == 0
    _assert_same_rows(_rows(pg_url, "dist_results"), want)
    tokens = _tokens(pg_url, "dist_results")
    assert _by_worker(tokens) == {"w0", "w1"}, tokens
    assert _staged(pg_url, "dist_results") == []


def test_postgres_results_of_a_kafka_job_staged_by_two_workers_equal_one_process(
        ray_cluster: Any, kafka: Any, pg_url: str, tmp_path: Path) -> None:
    """A 3-partition Kafka topic read by 2 workers: the table equals one process's,
    committed by the workers, no result row through the coordinator."""
    from sealstream.distributed.live import LivePlanner

    names = make_input(tmp_path / "in", events=EVENTS, bad_every=97)
    topic = produce_input(kafka.bootstrap, tmp_path / "in", names)
    specs = {}
    for label in ("ref", "dist"):
        spec = _db_spec(tmp_path / label, names, pg_url, f"{label}_results")
        kafka_source_spec(spec, kafka.bootstrap, topic)
        specs[label] = spec
    _run(specs["ref"], None)
    job = _run(specs["dist"], 2)
    assert isinstance(job.merger, LivePlanner)
    assert job.counters.results_written > 0
    assert sum(job.merger.output_bytes) == 0
    _assert_same_rows(_rows(pg_url, "dist_results"), _rows(pg_url, "ref_results"))
    assert _by_worker(_tokens(pg_url, "dist_results")) == {"w0", "w1"}
    assert _staged(pg_url, "dist_results") == []


class _KillWorkerAfterManifest(CrashPoints):
    """At the ``at``-th published manifest (every worker's rows of the epoch staged,
    none committed yet), check that both workers' staging rows are there, then SIGKILL
    worker 1's process."""

    def __init__(self, url: str, table: str, at: int) -> None:
        super().__init__("")
        self.url, self.table, self.at = url, table, at
        self.job: Any = None
        self.manifests = 0
        self.killed: list[int] = []
        self.staged: list[str] = []

    def __call__(self, point: str) -> None:
        if point != "after_manifest_publish" or self.killed:
            return
        self.manifests += 1
        if self.manifests < self.at:
            return
        self.staged = _staged(self.url, self.table)
        pid = self.job.worker_pids[1]
        os.kill(pid, signal.SIGKILL)
        self.killed.append(pid)


def test_worker_sigkilled_between_its_staging_and_its_commit(
        ray_cluster: Any, pg_url: str, tmp_path: Path) -> None:
    """Worker 1 is SIGKILLed once the manifest naming both workers' staged rows is
    published, before it commits: the job restarts every worker from that checkpoint,
    whose recovery commits both staged shares (the dead worker's too), and replays the
    rest: the table equals one process's, each token committed once, nothing staged."""
    from sealstream import load_spec
    from sealstream.distributed import DistributedJob

    want = _ref_rows(tmp_path / "ref", pg_url)
    d = tmp_path / "dist"
    names = make_input(d, events=EVENTS, bad_every=97)
    crash = _KillWorkerAfterManifest(pg_url, "dist_results", at=3)
    job = DistributedJob(load_spec(_db_spec(d, names, pg_url, "dist_results")), workers=2,
                         crash=crash)
    crash.job = job
    job.run()
    assert crash.killed and job.restarts == 1
    assert _by_worker(crash.staged) == {"w0", "w1"}, crash.staged
    tokens = _tokens(pg_url, "dist_results")
    assert set(crash.staged) <= set(tokens)
    _assert_same_rows(_rows(pg_url, "dist_results"), want)
    assert _staged(pg_url, "dist_results") == []


def test_sqlite_results_stay_on_the_coordinator(ray_cluster: Any, tmp_path: Path) -> None:
    """SQLite (one file on one host): the coordinator stages and commits the results
    under its own tokens, as on one process; the table equals one process's."""
    names = make_input(tmp_path / "ref", events=EVENTS, bad_every=97)
    _run(_db_spec(tmp_path / "ref", names, "sqlite", "results"), None)
    d = tmp_path / "dist"
    make_input(d, events=EVENTS, bad_every=97)
    _run(_db_spec(d, names, "sqlite", "results"), 2)
    got = {}
    for label in ("ref", "dist"):
        conn = sqlite3.connect(tmp_path / label / "results.db")
        try:
            got[label] = conn.execute("SELECT * FROM results ORDER BY key, key_is_int, "
                                      "window_start, window_end").fetchall()
            tokens = [t for (t,) in conn.execute("SELECT token FROM sealstream_sink_commits")]
        finally:
            conn.close()
        assert _by_worker(tokens) == {"coordinator"}, tokens
    _assert_same_rows([tuple(None if v is None else str(v) for v in r) for r in got["dist"]],
                      [tuple(None if v is None else str(v) for v in r) for r in got["ref"]])


def test_postgres_decimal_results_of_two_workers_are_one_process_exactly(
        ray_cluster: Any, pg_url: str, tmp_path: Path) -> None:
    """Sums, minima, maxima and means of a decimal field, in NUMERIC columns: the
    workers' rows are one process's, digit for digit (each worker's table sink knows the
    field is a decimal, as the coordinator's does)."""
    from test_decimals import _input
    from test_decimals import write_spec as decimal_spec

    for label, workers in (("ref", None), ("dist", 2)):
        d = tmp_path / label
        d.mkdir()
        sink = (f'kind = "postgresql"\nurl = {json.dumps(pg_url)}\n'
                f'table = "{label}_results"')
        spec = decimal_spec(d, _input(d, events=900), sink=sink, checkpoint='path = "ckpt"',
                            every_events=300, max_delay_ms=2000)
        job = _run(spec, workers)
    assert sum(job.merger.output_bytes) == 0
    assert _by_worker(_tokens(pg_url, "dist_results")) == {"w0", "w1"}
    want = _rows(pg_url, "ref_results")
    assert want and _rows(pg_url, "dist_results") == want


def test_coordinator_killed_between_the_workers_commits_then_rescaled(
        ray_cluster: Any, pg_url: str, tmp_path: Path) -> None:
    """``run --workers 2`` SIGKILLs itself after worker 0 committed its share of an
    epoch and before worker 1 did (the manifest naming both is published); ``--workers
    3`` resumes: the recovery finds worker 0's share recorded, commits worker 1's from
    its staging row, and the table equals one process's, the third worker committing
    its own shares."""
    import subprocess

    want = _ref_rows(tmp_path / "ref", pg_url)
    d = tmp_path / "dist"
    names = make_input(d, events=EVENTS, bad_every=97)
    spec = _db_spec(d, names, pg_url, "dist_results")
    env = dict(os.environ, SEALSTREAM_CRASH_AT="after_commit_worker_part:3")
    proc = subprocess.run(
        [sys.executable, "-m", "sealstream", "run", str(spec), "--quiet", "--workers", "2",
         "--ray", ray_cluster.address],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    staged = _staged(pg_url, "dist_results")
    assert _by_worker(staged) == {"w1"}, staged
    epoch = staged[0].split("-", 1)[0]
    assert any(t.startswith(epoch) and t.endswith("w0") for t in _tokens(pg_url, "dist_results"))
    job = _run(spec, 3)
    assert job.resumed_from is not None
    assert staged[0] in _tokens(pg_url, "dist_results")
    assert "w2" in _by_worker(_tokens(pg_url, "dist_results"))
    assert _staged(pg_url, "dist_results") == []
    _assert_same_rows(_rows(pg_url, "dist_results"), want)


def test_postgres_compound_key_results_of_two_workers_equal_one_process(
        ray_cluster: Any, pg_url: str, tmp_path: Path) -> None:
    """``key = ["tenant", "user"]`` (integer and string users): each worker's table sink
    writes one column per field and ``key_types``, as the coordinator's does; the
    table equals one process's."""
    from sinks.test_sinks_compound_key import write_job

    for label, workers in (("ref", None), ("dist", 2)):
        d = tmp_path / label
        d.mkdir()
        spec = write_job(d, "postgresql", pg_url)
        spec.write_text(spec.read_text().replace('table = "ck_results"',
                                                 f'table = "{label}_results"'))
        job = _run(spec, workers)
    assert sum(job.merger.output_bytes) == 0
    assert _by_worker(_tokens(pg_url, "dist_results")) == {"w0", "w1"}
    _assert_same_rows(_rows(pg_url, "dist_results"), _rows(pg_url, "ref_results"))
