"""Progress and summaries for ``sealstream run``.

On a terminal: a live line (events, rate, watermark, late and bad records,
last checkpoint) with a progress bar when the input size is known. Without a
terminal: one structured JSON log line per checkpoint on stderr.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, TaskID, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

if TYPE_CHECKING:
    from sealstream._runtime.engine import Job, RunSummary


def _fmt_wm(ms: int | None) -> str:
    from sealstream.watermark import NEG_INF, POS_INF

    if ms is None or ms <= NEG_INF:
        return "-inf"
    if ms >= POS_INF:
        return "+inf"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


class Progress:
    """Reports a running job; call :meth:`stop` at the end."""

    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self.bar: RichProgress | None = None
        self.task: TaskID | None = None
        self.last_ck = 0
        self.last_draw = 0.0

    @classmethod
    def for_terminal(cls) -> Progress:
        return cls(sys.stderr.isatty())

    def __call__(self, job: Job) -> None:
        st = job.ck_stats
        if not self.tty:
            if st.count != self.last_ck:
                self.last_ck = st.count
                c = job.counters
                print(json.dumps({
                    "event": "checkpoint", "id": st.last_id, "ms": round(st.last_ms, 1),
                    "bytes": st.last_bytes, "events": c.events, "late": c.late_events,
                    "bad": c.bad_records, "watermark": _fmt_wm(job.wm.current()),
                }), file=sys.stderr, flush=True)
            return
        now = time.monotonic()
        if now - self.last_draw < 0.1:
            return
        self.last_draw = now
        if self.bar is None:
            self.bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(), console=Console(stderr=True), transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task(job.p.name, total=None, info="")
        hint = job.merger.size_hint() if job.merger else None
        c = job.counters
        elapsed = max(now - job.started, 1e-9)
        ck = f" ckpt {st.last_id} ({st.last_ms:.0f} ms)" if st.last_id is not None else ""
        info = (f"{c.events:,} events {c.events / elapsed:,.0f}/s  wm {_fmt_wm(job.wm.current())}"
                f"  late {c.late_events:,} bad {c.bad_records:,}{ck}")
        assert self.task is not None
        if hint is not None:
            self.bar.update(self.task, completed=hint[0], total=hint[1] or None, info=info)
        else:
            self.bar.update(self.task, info=info)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def print_summary(summary: RunSummary) -> None:
    data = summary.to_json()
    console = Console(stderr=False, highlight=False)
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    rate = data["events_per_second"]
    table.add_row("pipeline", summary.pipeline)
    table.add_row("events", f"{data['events']:,}" + (f"  ({rate:,.0f}/s)" if rate else ""))
    table.add_row("windows fired", f"{data['windows_fired']:,}")
    table.add_row("results written", f"{data['results_written']:,}"
                  + (f"  ({data['suppressed']:,} already committed, not repeated)"
                     if data["suppressed"] else ""))
    table.add_row("late events", f"{data['late_events']:,}")
    table.add_row("bad records", f"{data['bad_records']:,}")
    ck = data["checkpoints"]
    if ck["count"] or summary.resumed_from is not None:
        table.add_row("checkpoints", f"{ck['count']} written, mean {ck['mean_ms']:.1f} ms, "
                      f"{ck['mean_bytes'] / 1024:.1f} KiB")
    if summary.resumed_from is not None:
        table.add_row("resumed from", f"checkpoint {summary.resumed_from}")
    for r in summary.rejected:
        table.add_row("moved aside", f"checkpoint {r['id']}: {r['verdict']} ({r['reason']})")
    table.add_row("time", f"{data['seconds']:.2f} s")
    console.print(table)
