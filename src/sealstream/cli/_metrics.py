"""Prometheus metrics for ``sealstream run --metrics-port/--metrics-file``.

The job's state changes on its processing thread; the HTTP server runs in a
daemon thread. To read the job's values consistently, :func:`snapshot` copies
them in the progress callback (which runs between batches) and the server only
ever renders the latest snapshot, never the live job. The result counters
(windows fired, results written) are kept by the job's output thread, one batch
behind, and are exact once the run has ended.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sealstream._runtime.engine import Job

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class Snapshot:
    """The job's values at one instant between batches."""

    pipeline: str
    events: int = 0
    late_events: int = 0
    bad_records: int = 0
    windows_fired: int = 0
    checkpoints: int = 0
    watermark_ms: int | None = None
    partitions: tuple[tuple[str, int], ...] = ()
    last_checkpoint_ms: float | None = None
    last_checkpoint_bytes: int | None = None
    last_checkpoint_at: float | None = None
    """``time.monotonic()`` when the last checkpoint was written."""
    last_checkpoint_unix: float | None = None
    open_windows: int | None = None
    #: the partition holding the watermark back (None: none holds it)
    holder: str | None = None
    #: live runs on a broker: whether it answers, and records behind each partition's end
    connected: bool | None = None
    lags: tuple[tuple[str, int], ...] = ()
    taken_at: float = field(default_factory=time.monotonic)


def snapshot(job: Job) -> Snapshot:
    """Copy what the metrics need from ``job`` (cheap: a few attribute reads)."""
    c, st, wm = job.counters, job.ck_stats, job.wm
    operator = getattr(job, "operator", None)
    open_windows = getattr(operator, "open_windows", None) if operator is not None else None
    has_ck = st.last_id is not None and st.count > 0
    return Snapshot(
        pipeline=job.p.name,
        events=c.events,
        late_events=c.late_events,
        bad_records=c.bad_records,
        windows_fired=c.windows_fired,
        checkpoints=st.count,
        watermark_ms=wm.current(),
        partitions=tuple((name, wm.partition_ms(q)) for q, name in enumerate(job.names)),
        last_checkpoint_ms=st.last_ms if has_ck else None,
        last_checkpoint_bytes=st.last_bytes if has_ck else None,
        last_checkpoint_at=st.last_at if has_ck else None,
        last_checkpoint_unix=(
            time.time() - (time.monotonic() - st.last_at)
            if has_ck and st.last_at is not None else None
        ),
        open_windows=int(open_windows) if isinstance(open_windows, int) else None,
        holder=_holder_name(job),
        **_source_status(job),
    )


def _source_status(job: Job) -> dict[str, Any]:
    merger = getattr(job, "merger", None)
    connected = getattr(merger, "connected", None)
    lags = getattr(merger, "lags", None)
    if not callable(connected) or not callable(lags):
        return {}
    return {"connected": connected(),
            "lags": tuple((n, lag) for n, lag in zip(job.names, lags(), strict=False)
                          if lag is not None)}


def _holder_name(job: Job) -> str | None:
    q = job.wm.holder()
    return job.names[q] if q is not None and q < len(job.names) else None


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(v: float) -> str:
    from sealstream.watermark import NEG_INF, POS_INF

    if isinstance(v, int):
        if v >= POS_INF:
            return "+Inf"
        if v <= NEG_INF:
            return "-Inf"
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


_METRICS: tuple[tuple[str, str, str], ...] = (
    ("sealstream_events_total", "counter", "Events processed."),
    ("sealstream_late_events_total", "counter", "Events that arrived after their window closed."),
    ("sealstream_bad_records_total", "counter", "Records that could not be used."),
    ("sealstream_windows_fired_total", "counter", "Windows fired (results produced)."),
    ("sealstream_checkpoints_total", "counter", "Checkpoints written by this run."),
    ("sealstream_watermark_ms", "gauge", "Global event-time watermark (ms since the epoch)."),
    ("sealstream_partition_watermark_ms", "gauge",
     "Watermark of each source partition (ms since the epoch)."),
    ("sealstream_last_checkpoint_duration_seconds", "gauge",
     "How long the last checkpoint took to write."),
    ("sealstream_last_checkpoint_bytes", "gauge", "Size of the last checkpoint."),
    ("sealstream_last_checkpoint_age_seconds", "gauge", "Time since the last checkpoint."),
    ("sealstream_last_checkpoint_timestamp_seconds", "gauge",
     "When the last checkpoint was written (Unix time; the age for --metrics-file readers)."),
    ("sealstream_open_windows", "gauge", "Windows holding state, not yet fired."),
    ("sealstream_source_connected", "gauge",
     "1 while the source's broker answers, 0 while it is lost (live runs on a broker)."),
    ("sealstream_source_lag", "gauge",
     "Records between each partition's position and the broker's end offset."),
    ("sealstream_watermark_holder", "gauge",
     "1 for the partition holding the global watermark back (absent when none does)."),
)


def render(snap: Snapshot, now: float | None = None) -> str:
    """The Prometheus text exposition format (version 0.0.4) of ``snap``.

    ``now`` (``time.monotonic()``) is used for the checkpoint age only.
    """
    now = time.monotonic() if now is None else now
    pl = f'pipeline="{_escape(snap.pipeline)}"'
    samples: dict[str, list[tuple[str, float]]] = {
        "sealstream_events_total": [(pl, snap.events)],
        "sealstream_late_events_total": [(pl, snap.late_events)],
        "sealstream_bad_records_total": [(pl, snap.bad_records)],
        "sealstream_windows_fired_total": [(pl, snap.windows_fired)],
        "sealstream_checkpoints_total": [(pl, snap.checkpoints)],
        "sealstream_watermark_ms": [] if snap.watermark_ms is None else [(pl, snap.watermark_ms)],
        "sealstream_partition_watermark_ms": [
            (f'{pl},partition="{_escape(name)}"', ms) for name, ms in snap.partitions
        ],
        "sealstream_source_connected": (
            [] if snap.connected is None else [(pl, 1 if snap.connected else 0)]
        ),
        "sealstream_source_lag": [
            (f'{pl},partition="{_escape(name)}"', lag) for name, lag in snap.lags
        ],
        "sealstream_watermark_holder": (
            [] if snap.holder is None else [(f'{pl},partition="{_escape(snap.holder)}"', 1)]
        ),
        "sealstream_last_checkpoint_duration_seconds": (
            [] if snap.last_checkpoint_ms is None else [(pl, snap.last_checkpoint_ms / 1000)]
        ),
        "sealstream_last_checkpoint_bytes": (
            [] if snap.last_checkpoint_bytes is None else [(pl, snap.last_checkpoint_bytes)]
        ),
        "sealstream_last_checkpoint_age_seconds": (
            [] if snap.last_checkpoint_at is None
            else [(pl, max(0.0, now - snap.last_checkpoint_at))]
        ),
        "sealstream_last_checkpoint_timestamp_seconds": (
            [] if snap.last_checkpoint_unix is None else [(pl, snap.last_checkpoint_unix)]
        ),
        "sealstream_open_windows": [] if snap.open_windows is None else [(pl, snap.open_windows)],
    }
    lines: list[str] = []
    for name, kind, help_text in _METRICS:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples[name]:
            lines.append(f"{name}{{{labels}}} {_num(value)}")
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename (readers never see a partial file)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class MetricsServer:
    """Serves the latest snapshot on ``http://127.0.0.1:PORT/metrics`` from a daemon thread."""

    def __init__(self, port: int, pipeline: str, host: str = "127.0.0.1") -> None:
        self._lock = threading.Lock()
        self._snap = Snapshot(pipeline=pipeline)
        server_ref = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                if self.path.split("?", 1)[0] not in ("/", "/metrics"):
                    self.send_error(404, "only /metrics is served")
                    return
                body = render(server_ref.current()).encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                return  # keep stderr for the job's own log

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="sealstream-metrics", daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def current(self) -> Snapshot:
        with self._lock:
            return self._snap

    def update(self, snap: Snapshot) -> None:
        with self._lock:
            self._snap = snap

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class Metrics:
    """Progress callback part: snapshot the job for the server, and write the
    metrics file after every checkpoint (and at the end)."""

    def __init__(self, server: MetricsServer | None, file: Path | None) -> None:
        self.server = server
        self.file = file
        self._last_ck = -1
        self._warned = False

    def __call__(self, job: Job) -> None:
        snap = snapshot(job)
        if self.server is not None:
            self.server.update(snap)
        if self.file is not None and snap.checkpoints != self._last_ck:
            self._last_ck = snap.checkpoints
            self._write(snap)

    def finish(self, job: Job) -> None:
        snap = snapshot(job)
        if self.server is not None:
            self.server.update(snap)
        if self.file is not None:
            self._last_ck = snap.checkpoints
            self._write(snap)

    def _write(self, snap: Snapshot) -> None:
        """Write the metrics file; a failure is reported once and does not stop the job."""
        assert self.file is not None
        try:
            write_atomic(self.file, render(snap))
        except OSError as exc:
            if not self._warned:
                self._warned = True
                print(f"sealstream: warning: cannot write metrics file {self.file}: "
                      f"{exc.strerror or exc}; the job continues", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
