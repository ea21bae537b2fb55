"""The ``sealstream`` command line: ``main(argv) -> exit code``.

Exit codes: 0 success; 1 runtime failure (bad record without an [errors]
output, more bad records than ``--max-bad-ratio`` allows, no valid checkpoint,
lock held, I/O failure, a checkpoint that did not verify); 2 usage or spec error
(including a missing input file or directory); 130 interrupted by SIGINT
(Ctrl-C) and 143 by SIGTERM (128 + the signal's number, as shells report it).
Errors are printed as one line on stderr, never as a traceback.

Standard output carries a command's result (tables, ``--json``); when a run's
results, late events or bad records go to standard output (``kind = "stdout"``),
everything else it prints (summary, ``--json`` summary, warnings) goes to
stderr, so ``sealstream run spec.toml | jq`` sees only JSON lines.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sealstream import __version__
from sealstream.checkpoint.manifest import checkpoint_key
from sealstream.cli._keys import public_key_option, with_public_key
from sealstream.cli._lazy import LazyGroup
from sealstream.errors import SealstreamError, SpecError

__all__ = ["entrypoint", "main"]


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class _Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: raised in the main thread by the handler, a
    BaseException so that no ``except Exception`` (nor click, which turns a
    KeyboardInterrupt into an abort) swallows it on the way out. A run that it
    stops leaves its committed output and checkpoints as a crash would, and every
    ``finally`` on the way releases files, the writer thread and the lock."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.resume: str | None = None  # what the next run does, when a run was stopped

    @property
    def code(self) -> int:
        return 128 + self.signum


#: the live run that a first SIGINT/SIGTERM stops gracefully (docs/live.md)
_GRACEFUL: list[Any] = []


def _on_signal(signum: int, frame: object) -> None:
    # a live run: the first signal asks it to finish its step, write and commit a final
    # checkpoint and exit 0; a second one stops at once (below)
    if _GRACEFUL and _GRACEFUL[0].stop_requested is None:
        _GRACEFUL[0].stop_requested = signum
        click.echo(f"sealstream: {signal.Signals(signum).name}: finishing the step and "
                   "writing a final checkpoint (send it again to stop at once)", err=True)
        return
    # only the first signal stops the command; later ones would cut the cleanup
    # short (a checkpoint being written finishes, the lock is released)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    raise _Interrupted(signum)


def _fail(err: SealstreamError) -> None:
    click.echo(f"sealstream: error: {err}", err=True)
    raise _Exit(err.exit_code)


def _max_age_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--max-age SECONDS``: how old a checkpoint may be before it is STALE."""
    return click.option("--max-age", "max_age", type=click.FloatRange(min=0.0, min_open=True),
                        metavar="SECONDS", help=help_text)


def _require_receipts_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--require-receipts``: a checkpoint must sign its epoch's Merkle receipt root."""
    return click.option("--require-receipts", "require_receipts", is_flag=True, help=help_text)


#: the resume rules of ``run`` and ``replay``
_RESUME_REQUIRE_RECEIPTS = _require_receipts_option(
    "Resume only from checkpoints that sign their epoch's Merkle receipt root (default: "
    "[checkpoint] require_receipts).")


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="sealstream")
def cli() -> None:
    """Event-time windowed stream processing with verifiable, exactly-once checkpoints."""


@cli.command()
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--start-over", is_flag=True,
              help="Move existing checkpoints aside (never deleted) and start from the beginning.")
@click.option("--summary-json", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the run summary as JSON to this file.")
@click.option("--batch-size", type=click.IntRange(min=1, max=10**15),
              help="Records read per partition per step (does not change results).")
@click.option("--max-bad-ratio", type=click.FloatRange(min=0.0, max=1.0), metavar="R",
              help="Exit 1 (after committing) when more than this share of the job's "
                   "records is bad; 1 accepts any share, even no good record (default: "
                   "[pipeline] max_bad_ratio, else fail only when no record was good and "
                   "warn above half).")
@_max_age_option("Do not resume from a checkpoint older than this (STALE); "
                 "default: [checkpoint] max_age_s, else any age.")
@_RESUME_REQUIRE_RECEIPTS
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but warnings and errors.")
@click.option("--json", "as_json", is_flag=True,
              help="A JSON log line per checkpoint on stderr (also on a terminal), and "
                   "the run summary as JSON (on stderr when results go to stdout).")
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535),
              help="Serve Prometheus metrics on http://127.0.0.1:PORT/metrics "
                   "(0: pick a free port and print it on stderr).")
@click.option("--metrics-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the Prometheus metrics to this file (atomically) after every "
                   "checkpoint, e.g. for node_exporter's textfile collector.")
@click.option("--workers", type=click.IntRange(min=1, max=4096), metavar="N",
              help="Run as N Ray workers (default: [pipeline] workers, else one process); "
                   "see docs/scale-out.md.")
@click.option("--ray", "ray_address", metavar="ADDRESS",
              help="The Ray cluster for --workers (default: a local one for the run).")
@click.option("--accept-table-change", is_flag=True,
              help="Resume although an [[enrich]] table changed since the checkpoint "
                   "(later events join it as it is now); see docs/enrich.md.")
def run(spec: Path, start_over: bool, summary_json: Path | None, batch_size: int | None,
        max_bad_ratio: float | None, max_age: float | None, require_receipts: bool,
        quiet: bool, as_json: bool, metrics_port: int | None,
        metrics_file: Path | None, workers: int | None, ray_address: str | None,
        accept_table_change: bool = False) -> None:
    """Run the pipeline described by SPEC (a TOML file) to the end of its input.

    On a terminal, shows live progress on stderr; off a terminal (or with --json) logs
    one JSON line per checkpoint and a summary line on stderr. The summary is a human
    table on stdout, or JSON with --json. Exit 1 when more records were bad
    than --max-bad-ratio allows (the output is committed all the same, and a rerun
    changes nothing); 130/143 when stopped by SIGINT/SIGTERM (the next run resumes
    from the last checkpoint).
    """
    from sealstream._runtime.engine import Job
    from sealstream.cli._progress import Progress, print_summary, warn_unseen_fields
    from sealstream.pipeline import (
        load_spec,
        with_batch_size,
        with_max_age,
        with_require_receipts,
        with_workers,
    )

    if TYPE_CHECKING:
        from sealstream.cli._metrics import Metrics
    metrics: Metrics | None = None
    job: Job | None = None
    try:
        pipeline = load_spec(spec)
        if batch_size is not None:
            pipeline = with_batch_size(pipeline, batch_size)
        if max_age is not None:
            pipeline = with_max_age(pipeline, max_age)
        if workers is not None:
            pipeline = with_workers(pipeline, workers)
        if ray_address is not None and pipeline.workers is None:
            raise SpecError("--ray: needs --workers N (or [pipeline] workers)")
        if require_receipts:
            pipeline = with_require_receipts(pipeline)
        limit = pipeline.max_bad_ratio if max_bad_ratio is None else max_bad_ratio
        human = sys.stderr if _results_on_stdout(pipeline) else sys.stdout
        for option, target in (("--metrics-file", metrics_file),
                               ("--summary-json", summary_json)):
            if target is not None and not target.parent.is_dir():
                raise SpecError(f"{option}: directory {target.parent} does not exist")
        progress = Progress.choose(quiet=quiet, as_json=as_json)
        hooks: list[Callable[[Job], None]] = []

        def on_batch(j: Job) -> None:
            for h in hooks:
                h(j)

        want_metrics = metrics_port is not None or metrics_file is not None
        on_step = on_batch if (want_metrics or progress) else None
        if pipeline.workers is not None:  # only then: Ray costs seconds to import
            from sealstream.distributed import DistributedJob

            job = DistributedJob(pipeline, address=ray_address, start_over=start_over,
                                 progress=on_step, quiet=quiet)
        else:
            job = Job(pipeline, start_over=start_over, progress=on_step,
                      accept_table_change=accept_table_change)
        if want_metrics:
            # only then: http.server and friends cost about 0.05 s to import
            from sealstream.cli._metrics import Metrics, MetricsServer

            server = None
            if metrics_port is not None:
                try:
                    server = MetricsServer(metrics_port, pipeline.name)
                except OSError as exc:
                    raise SpecError(f"--metrics-port {metrics_port}: cannot listen on "
                                    f"127.0.0.1:{metrics_port}: {exc.strerror or exc}") from None
            metrics = Metrics(server, metrics_file)
            metrics(job)  # partitions and zeros until the first batch
            if server is not None:  # announced once every scrape shows the partitions
                url = f"http://127.0.0.1:{server.port}/metrics"
                if sys.stderr.isatty() and not as_json:
                    click.echo(f"sealstream: metrics on {url}", err=True)
                else:  # the log on stderr is JSON lines
                    click.echo(json.dumps({"event": "metrics", "pipeline": pipeline.name,
                                           "url": url}), err=True)
        hooks.extend(h for h in (metrics, progress) if h is not None)
        if job.live:
            _GRACEFUL[:] = [job]
        _reclaim_signals()
        # What start-up built (modules, the spec, the pipeline; ~60,000 objects) lives as
        # long as the run: out of the cyclic collector's full walks, which the sources'
        # per-batch allocations (a message object per Kafka record) trigger every few
        # batches. The archive found them to be a quarter of a Kafka run's time.
        # Given back at the end: `main(["run", ...])` called in a long-lived process
        # (tests, notebooks) must not keep its cyclic garbage of before out of reach.
        gc.freeze()
        try:
            summary = job.run()
        finally:
            gc.unfreeze()
            _GRACEFUL.clear()
            if progress is not None:
                progress.stop(job)
        if metrics is not None:
            metrics.finish(job)
        if progress is not None:
            progress.finish(job, summary)
    except SealstreamError as err:
        _fail(err)
        return
    except _Interrupted as sig:
        if job is not None:
            sig.resume = _resume_note(job)
        raise
    finally:
        if metrics is not None:
            metrics.close()
    data = summary.to_json()
    if summary_json is not None:
        try:
            summary_json.write_text(json.dumps(data, indent=2) + "\n")
        except OSError as exc:  # the run is committed: say so, and what failed
            _fail(SealstreamError(f"--summary-json: cannot write {summary_json} "
                                  f"({exc.strerror or exc}); the run itself completed"))
            return
    if as_json:
        click.echo(json.dumps(data, indent=2), file=human)
    elif not quiet:
        print_summary(summary, human)
    warn_unseen_fields(summary, pipeline)
    if (late := summary.late_warning()) is not None:
        click.echo(f"sealstream: {late}", err=True)
    warning = _bad_share_warning(summary, limit, pipeline)
    if warning is not None:
        click.echo(f"sealstream: {warning}", err=True)
    problem = _bad_share(summary, limit, pipeline)
    if problem is not None:
        _fail(SealstreamError(problem))


def _results_on_stdout(pipeline: Any) -> bool:
    return any(o is not None and o.kind == "stdout"
               for o in (pipeline.sink, pipeline.late, pipeline.errors))


def _bad_share(summary: Any, limit: float | None, pipeline: Any) -> str | None:
    """Why the job's share of bad records fails the run, or None.

    With a ``limit``, more than that share of bad records fails; without one, only a
    job that had records and none of them good (a misspelt key or time field) fails,
    and more than half bad is a warning (:func:`_bad_share_warning`). Checked after the
    run committed everything (its last checkpoint and output): nothing committed is
    undone, and a rerun, which reads nothing new, reaches the same verdict from the
    same totals (restored from the checkpoint).
    """
    ratio = summary.bad_ratio()
    c = summary.counters
    if ratio is None:
        return None
    if limit is None and c.events > 0:
        return None
    if limit is not None and ratio <= limit:
        return None
    return (f"{_bad_count(summary, pipeline)}; "
            f"{_bad_why(summary, pipeline, limit)}. The output is committed (a rerun "
            "changes nothing); --max-bad-ratio 1 accepts it")


def _bad_count(summary: Any, pipeline: Any) -> str:
    c = summary.counters
    where = (f" (each with its reason in {pipeline.errors.path or pipeline.errors.kind})"
             if pipeline.errors is not None else "")
    return f"{c.bad_records:,} of {c.events + c.bad_records:,} records were bad{where}"


def _bad_why(summary: Any, pipeline: Any, limit: float | None) -> str:
    if summary.counters.events == 0:
        return (f"no record was good: check source.key = {pipeline.source.key!r} and "
                f"source.time = {pipeline.source.time!r} against the input")
    return f"{100 * summary.bad_ratio():.1f} % is over the limit of {limit:g}"


def _bad_share_warning(summary: Any, limit: float | None, pipeline: Any) -> str | None:
    """A warning when, without a limit, more than half of the job's records are bad."""
    from sealstream.pipeline import WARN_BAD_RATIO

    ratio = summary.bad_ratio()
    if limit is not None or ratio is None or ratio <= WARN_BAD_RATIO:
        return None
    if summary.counters.events == 0:
        return None  # that one fails the run
    return (f"warning: {_bad_count(summary, pipeline)} ({100 * ratio:.1f} %); "
            "--max-bad-ratio R makes a share above R fail the run")


def _resume_note(job: Any) -> str:
    if job.store is None:
        return ("nothing was committed (the spec has no [checkpoint]); the next run starts "
                "from the beginning")
    cid = job.resume_point()
    if cid is None:
        return "no checkpoint was committed yet; the next run starts from the beginning"
    why = getattr(job, "resume_point_unlisted", None)
    if why is not None:  # the store could not be listed: a newer one may be published
        return (f"committed output is intact; the next run resumes from checkpoint {cid} "
                f"or a newer one (the store could not be listed: {why})")
    return f"committed output is intact; the next run resumes from checkpoint {cid}"


@cli.command()
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--from", "origin", required=True, metavar="ID|start|p0=OFFSET,...",
              help="Where to start: a live checkpoint id (must be ATOMIC), 'start', or "
                   "partition offsets (by name or p<index>) with empty state.")
@click.option("--to", "to", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Isolated destination: DIR/out, DIR/late, DIR/errors and DIR/ckpt.")
@_max_age_option("Refuse a --from checkpoint older than this (STALE); "
                 "default: [checkpoint] max_age_s, else any age.")
@_RESUME_REQUIRE_RECEIPTS
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but errors.")
@click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON.")
def replay(spec: Path, origin: str, to: Path, max_age: float | None, require_receipts: bool,
           quiet: bool, as_json: bool) -> None:
    """Re-run SPEC from --from into the isolated destination --to.

    Live outputs and live checkpoints are never written (the live checkpoint is only
    read). Offsets start with empty window state: windows spanning the start are partial.
    """
    from sealstream._runtime.replay import replay as run_replay
    from sealstream.cli._progress import Progress, print_summary
    from sealstream.pipeline import load_spec, with_max_age, with_require_receipts

    try:
        pipeline = load_spec(spec)
        if max_age is not None:
            pipeline = with_max_age(pipeline, max_age)
        if require_receipts:
            pipeline = with_require_receipts(pipeline)
        human = sys.stderr if _results_on_stdout(pipeline) else sys.stdout
        progress = None if as_json else Progress.choose(quiet=quiet, as_json=False)
        try:
            summary = run_replay(pipeline, origin, to, progress=progress)
        finally:
            if progress is not None:
                progress.stop()
    except SealstreamError as err:
        _fail(err)
        return
    data = summary.to_json()
    if as_json:
        click.echo(json.dumps(data, indent=2), file=human)
    elif not quiet:
        print_summary(summary, human)
        info = summary.replay or {}
        click.echo(f"replayed from {info.get('from')} into {info.get('to')}", file=human)
        for note in info.get("notes", []):
            click.echo(f"note: {note}", file=human)


@cli.group()
def checkpoints() -> None:
    """Look inside checkpoint directories, export open windows, prune old checkpoints."""


def _store(directory: str, pipeline: str | None = None, *, named: bool = True) -> Any:
    """The store at ``directory`` (a path or URL). ``named``: ``pipeline`` was given
    with --pipeline, so a database without it is an error (exit 2) naming the
    pipelines it holds; else (the name of a --spec) it may have no checkpoints yet."""
    from sealstream.checkpoint.stores import LocalCheckpointStore, is_url

    if is_url(directory):
        store = _url_store(directory, pipeline, named)
        ctx = click.get_current_context(silent=True)
        if ctx is not None:
            ctx.call_on_close(store.close)
        return store
    path = Path(directory)
    if not path.is_dir():
        if not path.exists():
            _fail(SpecError(f"checkpoint directory {path} does not exist"))
        hint = (f"; for a SQLite store give sqlite:///{path}" if path.is_file() else "")
        _fail(SpecError(f"{path} is not a directory: give a checkpoint directory or a "
                        f"store URL{hint}"))
    return LocalCheckpointStore(path)


def _url_store(url: str, pipeline: str | None, named: bool) -> Any:
    from sealstream.checkpoint.stores import check_url, is_postgres, is_s3, redact, sqlite_path

    try:
        check_url(url, Path.cwd())
        if is_s3(url):  # a prefix holds one job's checkpoints, as a directory does
            from sealstream.checkpoint.stores import open_store

            s3 = open_store(url, pipeline)
            if not s3.exists():  # as a missing directory: exit 2 (section 8)
                raise SpecError(f"checkpoint store {redact(url)} does not exist")
            return s3
        if is_postgres(url):
            from sealstream.checkpoint.stores import postgres as pg_store

            # a database without checkpoints is an empty store, as an empty directory
            # or SQLite file is: list and verify show none, inspect says there are none
            names = pg_store.pipelines_in(url, redact(url))
        else:
            from sealstream.checkpoint.stores import sqlite as sqlite_store

            db = sqlite_path(url, Path.cwd())
            if not db.is_file():
                raise SpecError(f"checkpoint database {redact(url)} does not exist")
            names = sqlite_store.pipelines_in(db)
        if named and pipeline is not None and pipeline not in names:
            held = (f"it holds {', '.join(map(repr, names))}" if names
                    else "it holds no checkpoints")
            raise SpecError(f"--pipeline {pipeline}: no pipeline {pipeline!r} in "
                            f"{redact(url)}; {held}")
        if pipeline is None:
            if len(names) > 1:
                raise SpecError(f"{redact(url)} holds the checkpoints of several pipelines "
                                f"({', '.join(names)}); name one with --pipeline")
            pipeline = names[0] if names else ""
        if is_postgres(url):
            return pg_store.PostgresCheckpointStore(url, pipeline)
        return sqlite_store.SqliteCheckpointStore(db, pipeline)
    except SealstreamError as err:
        _fail(err)
        raise


def _shown(directory: str) -> str:
    from sealstream.checkpoint.stores import is_url, redact

    return redact(directory) if is_url(directory) else str(Path(directory))


_PIPELINE_OPT = click.option(
    "--pipeline", "pipeline_name", default=None,
    help="With a database URL: whose checkpoints (default: the only pipeline in it).")
_JSON_OPT = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
_PIPELINE_OPT = with_public_key(_PIPELINE_OPT)  # every reading command: --public-key FILE


@checkpoints.command("list")
@click.argument("directory", type=str)
@_JSON_OPT
@_PIPELINE_OPT
def list_cmd(directory: str, as_json: bool, pipeline_name: str | None) -> None:
    """List the checkpoints in DIRECTORY, oldest first, with the files each depends on.

    DIRECTORY is a checkpoint directory or a store URL (sqlite:///FILE,
    postgresql://HOST/DB)."""
    from sealstream.cli import _agents
    from sealstream.cli._report import list_checkpoints, render_list

    if _agents.is_agent_store(directory):
        raise _Exit(_agents.run(directory, "list", as_json))
    store = _store(directory, pipeline_name)
    try:
        data = list_checkpoints(store)
    except SealstreamError as err:
        _fail(err)
        return
    _emit(data, as_json, lambda d: render_list(d, _shown(directory)))


@checkpoints.command("verify")
@click.argument("directory", type=str)
@_JSON_OPT
@click.option("--spec", type=click.Path(dir_okay=False, path_type=Path),
              help="Also check each checkpoint's pipeline fingerprint against this spec.")
@_max_age_option("A checkpoint older than this is STALE (default: the --spec's "
                 "[checkpoint] max_age_s, else any age).")
@_require_receipts_option("A checkpoint that does not sign its epoch's Merkle receipt root is "
                          "PARTIAL (NO_RECEIPT_ROOTS) (default: the --spec's [checkpoint] "
                          "require_receipts).")
@_PIPELINE_OPT
def verify_cmd(directory: str, as_json: bool, spec: Path | None, max_age: float | None,
               require_receipts: bool, pipeline_name: str | None) -> None:
    """Judge every checkpoint in DIRECTORY; exit 0 only if all are ATOMIC_CHECKPOINT.

    DIRECTORY is a checkpoint directory or a store URL (sqlite:///FILE,
    postgresql://HOST/DB)."""
    from sealstream.cli import _agents
    from sealstream.cli._report import render_verify, verify_checkpoints

    if _agents.is_agent_store(directory):
        raise _Exit(_agents.run(directory, "verify", as_json))
    pipeline = None
    if spec is not None:
        from sealstream.pipeline import load_spec

        try:
            pipeline = load_spec(spec)
        except SealstreamError as err:
            _fail(err)
    named = pipeline_name is not None
    if pipeline is not None and pipeline_name is None:
        pipeline_name = pipeline.name
    if max_age is None and pipeline is not None and pipeline.checkpoint is not None:
        max_age = pipeline.checkpoint.max_age_s
    if pipeline is not None and pipeline.checkpoint is not None:
        require_receipts = require_receipts or pipeline.checkpoint.require_receipts
    store = _store(directory, pipeline_name, named=named)
    try:
        data = verify_checkpoints(store, pipeline, max_age, require_receipts)
    except SealstreamError as err:
        _fail(err)
        return
    _emit(data, as_json, lambda d: render_verify(d, _shown(directory)))
    if any(c["verdict"] != "ATOMIC_CHECKPOINT" for c in data["checkpoints"]):
        raise _Exit(1)


def _emit(data: dict[str, Any], as_json: bool, render: Any) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        render(data)


@checkpoints.command("inspect")
@click.argument("directory", type=str)
@click.argument("checkpoint_id", metavar="[ID]", required=False)
@_JSON_OPT
@click.option("--spec", type=click.Path(dir_okay=False, path_type=Path),
              help="The run's spec: a Kafka source's lag per partition (broker's end offset "
                   "minus the checkpoint's) when the broker answers.")
@_PIPELINE_OPT
def inspect_cmd(directory: str, checkpoint_id: str | None, as_json: bool,
                spec: Path | None, pipeline_name: str | None) -> None:
    """Show what checkpoint ID (default: the newest) in DIRECTORY holds, and its verdict.

    Positions and watermarks per partition, open windows, state size, receipts, age,
    signer, pipeline and fingerprint. Works on partial or corrupt checkpoints too.
    The verdict uses SEALSTREAM_CHECKPOINT_KEY from the environment.
    """
    from sealstream.cli import _agents
    from sealstream.cli._inspect import render_inspect
    from sealstream.inspect import inspect_checkpoint, resolve_id

    if _agents.is_agent_store(directory):
        raise _Exit(_agents.run(directory, "inspect", as_json, checkpoint_id))
    store = _store(directory, pipeline_name)
    try:
        cid = resolve_id(store, checkpoint_id)
        data = inspect_checkpoint(store, cid)
        if spec is not None:
            from sealstream.cli._inspect import add_kafka_lag

            add_kafka_lag(data, spec)
    except SealstreamError as err:
        _fail(err)
        return
    _emit(data, as_json, render_inspect)


@checkpoints.command("diff")
@click.argument("directory", type=str)
@click.argument("a")
@click.argument("b")
@_JSON_OPT
@_PIPELINE_OPT
def diff_cmd(directory: str, a: str, b: str, as_json: bool, pipeline_name: str | None) -> None:
    """Show what advanced from checkpoint A to checkpoint B in DIRECTORY.

    Positions and watermarks per partition, windows opened/closed, outputs emitted,
    state size and counters. Exit 1 when a state file cannot be read or verified.
    """
    from sealstream.cli._inspect import render_diff
    from sealstream.inspect import diff_checkpoints, resolve_id

    store = _store(directory, pipeline_name)
    try:
        data = diff_checkpoints(store, resolve_id(store, a), resolve_id(store, b))
    except SealstreamError as err:
        _fail(err)
        return
    _emit(data, as_json, render_diff)


@checkpoints.command("export")
@click.argument("directory", type=str)
@click.argument("checkpoint_id", metavar="[ID]", required=False)
@click.option("--to", "to", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Output file: FILE.parquet or FILE.jsonl (a new file, unless --replace).")
@click.option("--replace", is_flag=True, help="Replace the --to file if it exists.")
@click.option("--force", is_flag=True,
              help="Export even if the checkpoint is not ATOMIC_CHECKPOINT.")
@_JSON_OPT
@click.option("--receipts", is_flag=True,
              help="Write instead one inclusion proof per result of the checkpoint's epoch "
                   "(JSON lines; check one with `sealstream receipts verify`).")
@_PIPELINE_OPT
def export_cmd(directory: str, checkpoint_id: str | None, to: Path, replace: bool,
               force: bool, as_json: bool, receipts: bool, pipeline_name: str | None) -> None:
    """Export the open windows of checkpoint ID (default: the newest) with the current
    partial value of every aggregate. Only an ATOMIC_CHECKPOINT, unless --force."""
    from sealstream.cli._inspect import export, render_export
    from sealstream.inspect import resolve_id

    store = _store(directory, pipeline_name)
    try:
        if receipts:
            from sealstream.cli._guard import export_proofs

            data = export_proofs(store, resolve_id(store, checkpoint_id), to, replace=replace,
                                 key=checkpoint_key())
            _emit(data, as_json, lambda d: click.echo(
                f"wrote {d['proofs']} proofs of epoch {d['epoch']} (checkpoint "
                f"{d['checkpoint']}) to {d['to']}"))
            return
        data = export(store, resolve_id(store, checkpoint_id), to, force=force,
                      replace=replace)
    except SealstreamError as err:
        _fail(err)
        return
    _emit(data, as_json, render_export)


@checkpoints.command("window")
@click.argument("directory", type=str)
@click.option("--key", "window_key", required=True, help="The window's key.")
@click.option("--start", "start_ms", required=True, type=int, help="window_start (ms).")
@click.option("--end", "end_ms", required=True, type=int, help="window_end (ms).")
@click.option("--id", "checkpoint_id", default=None, help="Checkpoint (default: the newest).")
@_require_receipts_option("PARTIAL_CHECKPOINT_REJECT when the window has no emission receipt.")
@_max_age_option("Refuse a checkpoint older than this (STALE).")
@click.option("--spec", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The pipeline's spec: search the committed output of epochs whose "
                   "checkpoints were pruned, and prove from it.")
@_JSON_OPT
@_PIPELINE_OPT
def window_cmd(directory: str, window_key: str, start_ms: int, end_ms: int,
               checkpoint_id: str | None, require_receipts: bool, max_age: float | None,
               spec: Path | None, as_json: bool, pipeline_name: str | None) -> None:
    """Show one window of a checkpoint as the window-commit guard sees it (open: its
    state hash and watermark; emitted: its receipt with an inclusion proof) and the
    guard's verdict and directive. Exit 1 unless ATOMIC_CHECKPOINT."""
    from sealstream.cli._guard import render_window, window_report
    from sealstream.inspect import resolve_id

    store = _store(directory, pipeline_name)
    try:
        cid = resolve_id(store, checkpoint_id) if checkpoint_id is not None else None
        data = window_report(store, key=window_key, start_ms=start_ms, end_ms=end_ms,
                             checkpoint_id=cid, require_receipts=require_receipts,
                             max_age_s=max_age, spec=spec)
    except SealstreamError as err:
        _fail(err)
        return
    _emit(data, as_json, render_window)
    if data["manifest"]["verdict"] != "ATOMIC_CHECKPOINT" \
            or data["checkpoint"]["status"] == "absent":  # never seen or emitted: exit 1
        raise _Exit(1)


@cli.group(cls=LazyGroup)
def receipts() -> None:
    """Check emission receipts: inclusion proofs against signed checkpoint manifests."""


@receipts.command("verify")
@click.argument("proof", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--manifest", type=click.Path(dir_okay=False, path_type=Path),
              help="The signed MANIFEST.json of the checkpoint the proof names.")
@click.option("--checkpoints", "directory", type=str,
              help="Or the checkpoint store holding it (a directory or a store URL).")
@click.option("--pipeline", "pipeline_name", default=None,
              help="With a database URL: whose checkpoints (default: the proofs').")
@_JSON_OPT
@public_key_option
def receipts_verify_cmd(proof: Path, manifest: Path | None, directory: str | None,
                        as_json: bool, pipeline_name: str | None = None) -> None:
    """Check PROOF (one proof, or JSON lines of them) offline against a signed checkpoint
    manifest (public key or SEALSTREAM_CHECKPOINT_KEY): the result was emitted in the epoch
    it names, under that signature. Reads no state. Exit 1 when any proof fails."""
    from sealstream.cli._guard import summary_line, verify_proof_files

    if (manifest is None) == (directory is None):
        _fail(SpecError("give exactly one of --manifest FILE or --checkpoints DIR"))
    try:
        data = verify_proof_files(proof, manifest, directory, checkpoint_key(),
                                  pipeline_name)
    except SealstreamError as err:
        _fail(err)
        return
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        for r in data["results"]:  # a failure each, and the one proof of a single one
            if r["ok"] and data["proofs"] > 1:
                continue
            click.echo(f"{proof}:{r['line']}: {'OK' if r['ok'] else r['reason']}: "
                       f"{r['message']}")
        click.echo(summary_line(data))
    if data["verified"] != data["proofs"]:
        raise _Exit(1)


@checkpoints.command("prune")
@click.argument("directory", type=str)
@click.option("--keep", required=True, type=click.IntRange(min=1),
              help="How many of the newest ATOMIC checkpoints to keep (>= 1).")
@click.option("--dry-run", is_flag=True, help="Only print what would be done.")
@_JSON_OPT
@_PIPELINE_OPT
def prune_cmd(directory: str, keep: int, dry_run: bool, as_json: bool,
              pipeline_name: str | None) -> None:
    """Keep the KEEP newest ATOMIC checkpoints in DIRECTORY: delete older ATOMIC ones and
    move invalid ones to rejected/ (never deleted). Safe while a job runs. Exit 1 when
    checkpoints exist but none is ATOMIC (nothing is touched)."""
    from sealstream.cli._inspect import render_prune
    from sealstream.cli._prune import prune

    store = _store(directory, pipeline_name)
    try:
        data = prune(store, keep, dry_run=dry_run)
    except SealstreamError as err:
        _fail(err)
        return
    _emit(data, as_json, render_prune)
    if data["newest_atomic"] is None and data["untouched"]:
        click.echo(f"sealstream: error: no checkpoint in {directory} is ATOMIC_CHECKPOINT; "
                   "nothing was pruned (see `sealstream checkpoints verify`)", err=True)
        raise _Exit(1)


def _add_agents() -> None:  # imported when used (cli/_lazy.py)
    assert isinstance(cli, LazyGroup) and isinstance(receipts, LazyGroup)
    cli.add_lazy("agents", "sealstream.cli._agents:agents")
    cli.add_lazy("keys", "sealstream.cli._keys:keys")
    receipts.add_lazy("consistency", "sealstream.cli._guard:consistency_cmd")
    receipts.add_lazy("export", "sealstream.cli._guard:export_cmd")


_add_agents()


def _add_console() -> None:
    assert isinstance(cli, LazyGroup)
    cli.add_lazy("console", "sealstream.cli._console:console_cmd")


_add_console()


def _add_compare() -> None:
    assert isinstance(cli, LazyGroup)
    cli.add_lazy("compare", "sealstream.cli._compare:compare_cmd")


_add_compare()


#: optional Python modules -> the extra that installs them (pyproject.toml)
EXTRAS = {"confluent_kafka": "kafka", "nats": "nats", "psycopg": "postgres",
          "psycopg_pool": "postgres", "ray": "ray", "langgraph": "langgraph"}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv``; return the exit code (never raises SystemExit)."""
    args = list(sys.argv[1:] if argv is None else argv)
    handlers = _catch_signals()
    try:
        cli.main(args=args, prog_name="sealstream", standalone_mode=False)
    except _Interrupted as sig:
        name = signal.Signals(sig.signum).name
        click.echo(f"sealstream: interrupted by {name}"
                   + (f"; {sig.resume}" if sig.resume else ""), err=True)
        return sig.code
    except _Exit as e:
        return e.code
    except click.UsageError as e:
        click.echo(f"sealstream: error: {e.format_message()}", err=True)
        return 2
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except click.Abort as e:
        if isinstance(e.__context__, KeyboardInterrupt):  # a library's own SIGINT handler
            click.echo("sealstream: interrupted by SIGINT", err=True)
            return 130
        click.echo("sealstream: aborted", err=True)
        return 1
    except SealstreamError as err:
        click.echo(f"sealstream: error: {err}", err=True)
        return err.exit_code
    except OSError as err:
        click.echo(f"sealstream: error: {err}", err=True)
        return 1
    except ModuleNotFoundError as err:  # an optional dependency the spec needs
        extra = EXTRAS.get((err.name or "").partition(".")[0])
        if extra is None:
            raise
        click.echo(f"sealstream: error: the '{extra}' extra is not installed (Python "
                   f"module {err.name!r} is missing): pip install 'sealstream[{extra}]'",
                   err=True)
        return 2
    except KeyboardInterrupt:  # SIGINT before the handler was installed, or in a thread
        click.echo("sealstream: interrupted by SIGINT", err=True)
        return 130
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return 0


def _reclaim_signals() -> None:
    """Put this process's SIGINT/SIGTERM handlers back in front of Polars' (main thread).

    Importing Polars installs a low-level SIGINT handler of its own (Rust's
    signal-hook) in front of Python's: a SIGINT that arrives while any thread runs a
    Polars query aborts that query with a KeyboardInterrupt. The first signal to a
    live run must let the step finish and the final checkpoint be written, so after
    Polars is imported the run installs its Python handlers again, which replaces
    Polars' at the operating system (Python's ``signal.signal`` calls ``sigaction``
    every time). Ctrl-C then reaches :func:`_on_signal` only.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    import polars  # noqa: F401 - its import is what installs the handler taken out here

    for sig in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(sig)
        if handler is not None:  # None: installed outside Python, left alone
            signal.signal(sig, handler)


def _catch_signals() -> dict[int, Any]:
    """Install the SIGINT/SIGTERM handlers (main thread only); return the old ones."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    old: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        old[sig] = signal.getsignal(sig)
        signal.signal(sig, _on_signal)
    return old


def entrypoint() -> None:
    """The ``sealstream`` command: :func:`main`, then exit without tearing the heap down.

    When a command returns, its output is durable and every file, connection and
    worker thread it used is closed (a run drains its checkpoint writer and closes
    its readers, sinks and store before returning). Freeing the interpreter's heap
    object by object after that only costs time (about 0.2 s after a 2M-event run),
    so the process ends with ``os._exit`` once stdout and stderr are flushed.
    """
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):  # a closed pipe or stream: nothing left to say
        pass
    os._exit(code)


def _add_archive() -> None:
    assert isinstance(cli, LazyGroup)
    cli.add_lazy("archive", "sealstream.cli._archive:archive")


_add_archive()
