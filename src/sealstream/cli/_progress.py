"""Progress and summaries for ``sealstream run``.

On a terminal: a live panel (events, rate, watermark, per-partition lag, late
and bad records, last checkpoint's age, duration and size) with a progress bar
when the input size is known, redrawn at most 10 times a second. Off a terminal,
or with ``--json``: one structured JSON log line per checkpoint on stderr, and a
final summary line (what log collectors and supervisors read). **choice:** stderr
carries the log and stdout the summary, each in one format: off a terminal the
stderr log is JSON lines only and stdout the human summary table (JSON with
``--json``); a stream never mixes the two.
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.live import Live
    from rich.table import Table

    from sealstream._runtime.engine import Job, RunSummary
    from sealstream.pipeline import Pipeline

REDRAW_S = 0.1
"""At most ten redraws a second: the callback runs after every batch."""
MAX_PARTITION_ROWS = 8
ETA_HALF_LIFE_S = 10.0
"""The ETA divides what is left by a rate smoothed with this half-life (an
exponentially weighted moving average, fed one sample per :data:`ETA_SAMPLE_S`
at least), so it does not jump from one refresh to the next with the speed of
the last batch."""
ETA_SAMPLE_S = 1.0


def _fmt_wm(ms: int | None) -> str:
    from sealstream.watermark import NEG_INF, POS_INF

    if ms is None or ms <= NEG_INF:
        return "-inf"
    if ms >= POS_INF:
        return "+inf"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _wm_json(ms: int | None) -> int | str | None:
    """A watermark for JSON, as in every JSON output of sealstream: integer ms, the
    strings "-inf"/"+inf" for the infinities, None when there is none."""
    from sealstream.watermark import json_ms

    return json_ms(ms)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def _fmt_s(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _fmt_lag(ms: int) -> str:
    return "0" if ms <= 0 else _fmt_s(ms / 1000)


def partition_sizes(job: Job) -> list[tuple[int, int] | None]:
    """``(consumed, total)`` bytes per partition, None where the reader cannot tell."""
    merger = job.merger
    buffers = getattr(merger, "buffers", None) if merger is not None else None
    if not buffers:
        return [None] * len(job.names)
    out: list[tuple[int, int] | None] = []
    for b in buffers:
        try:
            out.append(b.reader.size_hint())
        except Exception:  # a progress display must never stop the job
            out.append(None)
    return out


def partition_lags(job: Job) -> list[tuple[str, int, int | None]]:
    """``(name, watermark_ms, lag_ms)`` per partition; lag is how far its watermark is
    behind the most advanced live partition's (None when it has no watermark yet)."""
    from sealstream.watermark import NEG_INF, POS_INF

    wms = [job.wm.partition_ms(q) for q in range(len(job.names))]
    live = [w for w in wms if NEG_INF < w < POS_INF]
    top = max(live) if live else None
    out: list[tuple[str, int, int | None]] = []
    for name, w in zip(job.names, wms, strict=True):
        if w >= POS_INF:
            lag: int | None = 0
        elif w <= NEG_INF or top is None:
            lag = None
        else:
            lag = top - w
        out.append((name, w, lag))
    return out


class Progress:
    """Reports a running job after every batch; call :meth:`finish` (success) or
    :meth:`stop` (always) at the end."""

    def __init__(self, tty: bool, stream: TextIO | None = None) -> None:
        self.tty = tty
        self.stream = stream
        self.live: Live | None = None
        self.last_ck = 0
        self.last_draw = 0.0
        self.samples: deque[tuple[float, int, int]] = deque(maxlen=64)
        self.base: tuple[float, int] | None = None
        self.smooth_byte_rate: float | None = None
        self._last_sample: tuple[float, int] | None = None
        self._ewma_bytes = 0.0
        self._ewma_s = 0.0

    @classmethod
    def for_terminal(cls) -> Progress:
        return cls(sys.stderr.isatty())

    @classmethod
    def choose(cls, *, quiet: bool, as_json: bool) -> Progress | None:
        """``run``'s progress: the live panel on a terminal, the JSON log on stderr
        off a terminal or with ``--json``; none with --quiet."""
        if quiet:
            return None
        return cls(sys.stderr.isatty() and not as_json)

    @property
    def out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    # ------------------------------------------------------------ callback
    def __call__(self, job: Job) -> None:
        if not self.tty:
            self._log_checkpoint(job)
            return
        now = time.monotonic()
        if now - self.last_draw < REDRAW_S:
            return
        self.last_draw = now
        if self.live is None:
            from rich.console import Console  # rich only for a terminal: 0.1 s to import
            from rich.live import Live

            self.live = Live(console=Console(file=self.out), auto_refresh=False,
                             transient=True, redirect_stdout=False, redirect_stderr=False)
            self.live.start()
        self.live.update(self.render(job, now), refresh=True)

    # ------------------------------------------------------------ JSON log
    def _log_checkpoint(self, job: Job) -> None:
        """One line per checkpoint finished since the last call (several may finish
        between two batches: each gets its line)."""
        st = job.ck_stats
        new = st.count - self.last_ck
        if new <= 0:
            return
        self.last_ck = st.count
        for cid, ms, nbytes in list(st.recent)[-new:]:
            self._emit(checkpoint_record(job, cid, ms, nbytes))

    def _emit(self, record: dict[str, Any]) -> None:
        print(json.dumps(record), file=self.out, flush=True)

    def finish(self, job: Job, summary: RunSummary) -> None:
        """Log the last checkpoint (written after the last callback) and the summary."""
        self.stop()
        if self.tty:
            return
        self._log_checkpoint(job)
        data = summary.to_json()
        self._emit({"event": "summary", "ts": _now_iso(), **data,
                    "watermark": _fmt_wm(summary.watermark_ms)})

    def stop(self, job: Job | None = None) -> None:
        """Stop drawing; with ``job``, log a checkpoint not logged yet (e.g. on failure)."""
        if self.live is not None:
            self.live.stop()
            self.live = None
        if job is not None and not self.tty:
            self._log_checkpoint(job)

    # ------------------------------------------------------------ terminal
    def _rates(self, now: float, events: int, consumed: int) -> tuple[float, float]:
        """Events/s and bytes/s over the last few seconds."""
        self.samples.append((now, events, consumed))
        while len(self.samples) > 2 and now - self.samples[0][0] > 3.0:
            self.samples.popleft()
        t0, e0, b0 = self.samples[0]
        dt = now - t0
        if dt <= 0:
            return 0.0, 0.0
        return (events - e0) / dt, (consumed - b0) / dt

    def smoothed_byte_rate(self, now: float, consumed: int) -> float | None:
        """Bytes/s for the ETA: bytes over time, both weighted down by half every
        :data:`ETA_HALF_LIFE_S` (an exponentially weighted average of the rate that
        starts as the plain average since the first sample, with no bias to 0)."""
        last = self._last_sample
        if last is None or consumed < last[1]:
            self._last_sample = (now, consumed)
            return self.smooth_byte_rate
        dt = now - last[0]
        if dt < ETA_SAMPLE_S:  # a rate over a shorter time is mostly batch jitter
            return self.smooth_byte_rate
        self._last_sample = (now, consumed)
        decay = 0.5 ** (dt / ETA_HALF_LIFE_S)
        self._ewma_bytes = self._ewma_bytes * decay + (consumed - last[1])
        self._ewma_s = self._ewma_s * decay + dt
        self.smooth_byte_rate = self._ewma_bytes / self._ewma_s
        return self.smooth_byte_rate

    def render(self, job: Job, now: float) -> RenderableType:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        c, st = job.counters, job.ck_stats
        sizes = partition_sizes(job)
        known = all(s is not None for s in sizes) and bool(sizes)
        consumed = sum(s[0] for s in sizes if s is not None)
        total = sum(s[1] for s in sizes if s is not None)
        if self.base is None:
            # counters are restored on resume: rates count this run's events only
            self.base = (job.started, job.run_base.events)
        rate, _ = self._rates(now, c.events, consumed)
        smooth = self.smoothed_byte_rate(now, consumed)
        elapsed = max(now - self.base[0], 1e-9)
        this_run = c.events - self.base[1]
        avg = this_run / elapsed

        head = Table.grid(padding=(0, 1))
        head.add_row(Text(job.p.name, style="bold"), Text(f"{_fmt_s(elapsed)} elapsed"))
        rows: list[RenderableType] = [head]
        if known and total:
            bar = Table.grid(padding=(0, 1))
            eta = (
                f"eta {_fmt_s((total - consumed) / smooth)}" if smooth else "eta -"
            )
            bar.add_row(ProgressBar(total=total, completed=consumed, width=40),
                        Text(f"{100 * consumed / total:5.1f}%  "
                             f"{_fmt_bytes(consumed)} / {_fmt_bytes(total)}  {eta}"))
            rows.append(bar)
        total_note = f"  (job total {c.events:,})" if self.base[1] else ""
        rows.append(Text(f"events this run {this_run:,}  {rate:,.0f}/s (avg {avg:,.0f}/s)"
                         f"{total_note}"))
        open_windows = getattr(job.operator, "open_windows", None) if job.operator else None
        ow = f"  open windows {open_windows:,}" if isinstance(open_windows, int) else ""
        late_bad = Text(f"late {c.late_events:,}  ")
        late_bad.append(f"bad {c.bad_records:,}", style="bold red" if c.bad_records else "")
        late_bad.append(f"  windows fired {c.windows_fired:,}{ow}")
        rows.append(late_bad)
        held = job.wm.holder()
        by = (f"  held by {job.names[held]}" if held is not None and held < len(job.names)
              and len(job.names) > 1 else "")
        rows.append(Text(f"watermark {_fmt_wm(job.wm.current())}{by}"))
        connected = getattr(job.merger, "connected", None)
        if callable(connected) and connected() is not None:
            rows.append(Text("source connected" if connected() else
                             "source DISCONNECTED (retrying)",
                             style="" if connected() else "bold red"))
        if st.last_id is not None and st.last_at is not None:
            rows.append(Text(
                f"checkpoint {st.last_id}  {_fmt_s(max(0.0, now - st.last_at))} ago  "
                f"took {st.last_ms:.0f} ms  {_fmt_bytes(st.last_bytes)}  "
                f"({st.count} this run)"))
        elif job.store is not None:
            resumed = f" (resumed from {job.resumed_from})" if job.resumed_from else ""
            rows.append(Text(f"checkpoint none yet{resumed}"))
        rows.append(self._partition_table(job, sizes))
        return Group(*rows)

    def _partition_table(self, job: Job, sizes: list[tuple[int, int] | None]) -> Table:
        from rich.table import Table

        table = Table(box=None, pad_edge=False, show_edge=False, header_style="dim")
        # a narrow terminal shortens the partition's name, never splits a timestamp
        table.add_column("partition", overflow="ellipsis", no_wrap=True)
        table.add_column("watermark", no_wrap=True, min_width=24)
        table.add_column("lag", justify="right", no_wrap=True)
        table.add_column("left", justify="right", no_wrap=True)
        lags = partition_lags(job)
        # spec order, always: rows that moved between refreshes could not be followed
        for q in range(min(len(lags), MAX_PARTITION_ROWS)):
            name, w, lag = lags[q]
            size = sizes[q] if q < len(sizes) else None
            left = _fmt_bytes(max(0, size[1] - size[0])) if size is not None else "?"
            table.add_row(name, _fmt_wm(w), "-" if lag is None else _fmt_lag(lag), left)
        if len(lags) > MAX_PARTITION_ROWS:
            rest = lags[MAX_PARTITION_ROWS:]
            name, _, lag = max(rest, key=lambda x: x[2] or 0)
            behind = f" (most behind: {name}, lag {_fmt_lag(lag)})" if lag else ""
            table.add_row(f"... {len(rest)} more{behind}", "", "", "")
        return table


def _now_iso() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


def checkpoint_record(job: Job, cid: int, ms: float, nbytes: int) -> dict[str, Any]:
    """The JSON log record of checkpoint ``cid`` (``ms`` and ``nbytes`` as finished).

    Counters, watermark and positions come from the checkpoint's manifest (their
    values at the checkpoint); if it cannot be read, from the job as it is now.
    """
    doc = None
    if job.store is not None:
        try:
            doc = job.store.read_manifest(cid)
        except Exception:  # logging must never stop the job
            doc = None
    c: dict[str, Any] = dict(job.counters.to_json())
    wm_ms: int | None = job.wm.current()
    part_wm = [job.wm.partition_ms(q) for q in range(len(job.names))]
    positions: list[dict[str, Any]] = []
    if doc is not None:
        c.update({k: v for k, v in doc.get("counters", {}).items() if k in c})
        wdoc = doc.get("watermark", {})
        if isinstance(wdoc.get("partition_ms"), list):
            part_wm = [int(v) for v in wdoc["partition_ms"]]
            wm_ms = max(int(wdoc.get("global_ms", min(part_wm))), min(part_wm or [0]))
        by_name = {p.get("partition"): p for p in doc.get("positions", [])}
        for q, name in enumerate(job.names):
            pos = by_name.get(name, {})
            positions.append({
                "partition": name,
                "next_offset": pos.get("next_offset"),
                "byte_offset": pos.get("resume", {}).get("byte_offset"),
                "watermark_ms": _wm_json(part_wm[q]) if q < len(part_wm) else None,
            })
    else:
        for q, (name, pos) in enumerate(
            zip(job.names, getattr(job, "positions", []) or [], strict=False)
        ):
            positions.append({
                "partition": name, "next_offset": pos.next_offset,
                "byte_offset": pos.resume.byte_offset, "watermark_ms": _wm_json(part_wm[q]),
            })
    return {
        "event": "checkpoint", "ts": _now_iso(), "pipeline": job.p.name,
        "id": cid, "ms": round(ms, 1), "bytes": nbytes,
        "events": c["events"], "late": c["late_events"], "bad": c["bad_records"],
        "windows_fired": c["windows_fired"], "results_written": c["results_written"],
        "watermark": _fmt_wm(wm_ms), "watermark_ms": _wm_json(wm_ms),
        "watermark_held_by": _held_by(job),
        "positions": positions,
    }


def _held_by(job: Job) -> str | None:
    """The partition holding the watermark back now (None: none does)."""
    q = job.wm.holder()
    return job.names[q] if q is not None and q < len(job.names) else None


def print_summary(summary: RunSummary, stream: TextIO | None = None) -> None:
    """The run summary on ``stream`` (stdout by default; the CLI passes stderr when
    results go to stdout): with rich on a terminal (labels in bold), else plain
    aligned text (rich is not imported).

    What this run did and what the job did in total are two labelled columns (the
    second only when they differ: after a resume); results, late events and bad
    records are counted apart, as is the output found already committed by an
    earlier run; the rate is this run's events over this run's time.
    """
    out = stream if stream is not None else sys.stdout
    data = summary.to_json()
    this, total = data["this_run"], data["job_total"]
    both = any(this[k] != total[k] for k in total)
    rows: list[tuple[str, ...]] = []

    def row(label: str, key: str) -> None:
        rows.append((label, f"{this[key]:,}", *((f"{total[key]:,}",) if both else ())))

    rows.append(("pipeline", summary.pipeline, *(("",) if both else ())))
    rows.append(("", "this run", *(("job total",) if both else ())))
    row("events", "events")
    rate = this["events_per_second"]
    if rate:
        rows.append(("  per second", f"{rate:,.0f}", *(("",) if both else ())))
    row("windows fired", "windows_fired")
    row("results written", "results_written")
    row("late events", "late_events")
    row("bad records", "bad_records")
    done = this["already_committed"]
    if any(done.values()):
        what = ", ".join(f"{n:,} {label}" for label, n in (
            ("results", done["results"]), ("late events", done["late_events"]),
            ("bad records", done["bad_records"])) if n)
        rows.append(("not repeated", f"{what} already committed by an earlier run"))
    ck = data["checkpoints"]
    if ck["count"] or summary.resumed_from is not None:
        rows.append(("checkpoints", f"{ck['count']} written by this run, mean "
                     f"{ck['mean_ms']:.1f} ms, {ck['mean_bytes'] / 1024:.1f} KiB"
                     if ck["count"] else "none written by this run"))
    if summary.resumed_from is not None:
        rows.append(("resumed from", f"checkpoint {summary.resumed_from}"))
    for rej in summary.rejected:
        rows.append(("moved aside",
                     f"checkpoint {rej['id']}: {rej['verdict']} ({rej['reason']})"))
    rows.append(("time", f"{data['seconds']:.2f} s"))
    dist = data.get("distributed")
    if dist is not None:
        rows.append(("workers", f"{dist['workers']} (Ray start {dist['ray_start_s']:.2f} s, "
                     f"worker start {dist['worker_start_s']:.2f} s, "
                     f"engine {dist['engine_s']:.2f} s)"))
    if not out.isatty():
        w0 = max(len(r[0]) for r in rows)
        w1 = max((len(r[1]) for r in rows if len(r) > 2), default=0)
        lines: list[str] = []
        for r in rows:
            cells = [r[0].ljust(w0), *((r[1].rjust(w1), *r[2:]) if len(r) > 2 else r[1:])]
            lines.append("  ".join(cells).rstrip() + "\n")
        out.write("".join(lines))
        out.flush()
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    for _ in range(max(len(r) for r in rows) - 1):
        table.add_column()
    for r in rows:
        table.add_row(*r)
    Console(file=out, highlight=False).print(table)


def warn_unseen_fields(summary: RunSummary, pipeline: Pipeline,
                       stream: TextIO | None = None) -> None:
    """One line on stderr per aggregated field that none of this run's good events
    carried: every aggregate over it is null (a typo in a field name, most often)."""
    events = summary.this_run.events
    if not events:
        return
    out = stream if stream is not None else sys.stderr
    for name in summary.fields_never_seen:
        aggs = [f"{a.name} = {a.expr}" for a in pipeline.parsed_aggregates if a.field == name]
        print(f"sealstream: warning: field {name!r} appeared in none of this run's "
              f"{events:,} good events, so {', '.join(aggs)} is null in every result; "
              "check the field name against the input", file=out, flush=True)
