"""A running job, read from its Prometheus metrics endpoint (``sealstream run
--metrics-port``): progress, rates, watermark and the partition holding it back.

The console's page polls :func:`read` through ``/api/job`` every two seconds; the
rates are the differences between two successive reads (events per second).
"""

from __future__ import annotations

import re
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from sealstream.checkpoint.stores import redact
from sealstream.inspect import wm_iso

#: how long one read of the endpoint may take
TIMEOUT_S = 2.0
_SAMPLE = re.compile(r'^([a-z_:][a-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metrics_url(url: str) -> str:
    """``url`` naming the ``/metrics`` path (``http://127.0.0.1:9100`` -> ``.../metrics``)."""
    if "://" not in url:
        url = f"http://{url}"
    return url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"


def parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text format 0.0.4: name -> [(labels, value)]; comments skipped."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m is None or line.startswith("#"):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\")
                  for k, v in _LABEL.findall(m.group(2) or "")}
        out.setdefault(m.group(1), []).append((labels, value))
    return out


class JobReader:
    """Reads one job's endpoint; remembers the previous read for the rates."""

    def __init__(self, url: str) -> None:
        self.url = metrics_url(url)
        self.shown = redact(self.url)
        self._lock = threading.Lock()
        self._last: tuple[float, dict[str, float]] | None = None

    def read(self) -> dict[str, Any]:
        """The job's state now, or ``{"error": ...}`` when the endpoint does not answer."""
        try:
            with urllib.request.urlopen(self.url, timeout=TIMEOUT_S) as resp:  # noqa: S310
                text = resp.read(4_000_000).decode("utf-8", "replace")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            return {"url": self.shown, "ok": False,
                    "error": f"cannot read {self.shown}: {redact(str(reason))}"}
        m = parse(text)

        def one(name: str) -> float | None:
            s = m.get(name)
            return s[0][1] if s else None

        now = time.monotonic()
        counts = {k: one(f"sealstream_{k}_total") or 0.0
                  for k in ("events", "late_events", "bad_records", "windows_fired",
                            "checkpoints")}
        with self._lock:
            last, self._last = self._last, (now, counts)
        rates: dict[str, float | None] = {k: None for k in counts}
        if last is not None and now > last[0]:
            rates = {k: max(0.0, (counts[k] - last[1].get(k, 0.0)) / (now - last[0]))
                     for k in counts}
        pipeline = next((lab.get("pipeline") for lab, _ in m.get("sealstream_events_total", [])),
                        None)
        lags = {lab.get("partition", "?"): int(v) for lab, v in m.get("sealstream_source_lag", [])}
        parts = [{"partition": lab.get("partition", "?"), "watermark_iso": _iso(v),
                  "lag": lags.get(lab.get("partition", "?"))}
                 for lab, v in m.get("sealstream_partition_watermark_ms", [])]
        holder = next((lab.get("partition") for lab, v in m.get("sealstream_watermark_holder", [])
                       if v >= 1), None)
        wm = one("sealstream_watermark_ms")
        connected = one("sealstream_source_connected")
        return {
            "url": self.shown, "ok": True, "pipeline": pipeline,
            "counts": {k: int(v) for k, v in counts.items()},
            "rates": {k: None if v is None else round(v, 1) for k, v in rates.items()},
            "watermark_iso": _iso(wm), "holder": holder, "partitions": parts,
            "open_windows": _int(one("sealstream_open_windows")),
            "connected": None if connected is None else connected >= 1,
            "last_checkpoint": {
                "duration_s": one("sealstream_last_checkpoint_duration_seconds"),
                "bytes": _int(one("sealstream_last_checkpoint_bytes")),
                "age_s": one("sealstream_last_checkpoint_age_seconds"),
            },
        }


def _int(v: float | None) -> int | None:
    return None if v is None else int(v)


def _iso(v: float | None) -> str | None:
    if v is None:
        return None
    if v == float("inf"):
        return "+inf"
    if v == float("-inf"):
        return "-inf"
    return wm_iso(int(v))
