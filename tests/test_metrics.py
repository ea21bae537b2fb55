"""Seeing a running job: Prometheus metrics, the JSON log, the terminal panel."""

from __future__ import annotations

import io
import json
import math
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from sealstream.cli._metrics import CONTENT_TYPE, Snapshot, render
from sealstream.testing.datagen import generate
from sealstream.testing.specs import files_source, spec_text, tumbling
from sealstream.watermark import NEG_INF, POS_INF

COUNTERS = {
    "sealstream_events_total", "sealstream_late_events_total",
    "sealstream_bad_records_total", "sealstream_windows_fired_total",
    "sealstream_checkpoints_total",
}
GAUGES = {
    "sealstream_watermark_ms", "sealstream_partition_watermark_ms",
    "sealstream_last_checkpoint_duration_seconds", "sealstream_last_checkpoint_bytes",
    "sealstream_last_checkpoint_age_seconds", "sealstream_open_windows",
}

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')

Labels = tuple[tuple[str, str], ...]


def _unescape(v: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), v)


def parse(text: str) -> tuple[dict[str, str], dict[str, str], dict[tuple[str, Labels], float]]:
    """(types, helps, samples) of the Prometheus text format; strict about syntax."""
    types: dict[str, str] = {}
    helps: dict[str, str] = {}
    samples: dict[tuple[str, Labels], float] = {}
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, doc = line[7:].partition(" ")
            assert name not in helps and doc
            helps[name] = doc
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert name not in types and kind in ("counter", "gauge")
            assert name in helps  # HELP comes first
            types[name] = kind
        else:
            m = _SAMPLE.match(line)
            assert m, f"bad sample line {line!r}"
            name, raw_labels, raw_value = m.groups()
            assert name in types, f"{name} has no TYPE line before its samples"
            labels: list[tuple[str, str]] = []
            if raw_labels:
                consumed = "".join(x.group(0) for x in _LABEL.finditer(raw_labels))
                assert consumed == raw_labels, f"bad labels {raw_labels!r}"
                labels = [(k, _unescape(v)) for k, v in _LABEL.findall(raw_labels)]
            key = (name, tuple(sorted(labels)))
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = float(raw_value)
    return types, helps, samples


# ------------------------------------------------------------------ rendering
def test_render_text_format_unit() -> None:
    snap = Snapshot(
        pipeline='odd "name"\\x', events=1234, late_events=5, bad_records=2,
        windows_fired=17, checkpoints=3, watermark_ms=1_700_000_000_123,
        partitions=(("in/p0.jsonl", 1_700_000_000_500), ("in/p1.jsonl", POS_INF),
                    ("in/p\n2", NEG_INF)),
        last_checkpoint_ms=12.5, last_checkpoint_bytes=4096, last_checkpoint_at=100.0,
        last_checkpoint_unix=1_800_000_000.5, open_windows=42,
    )
    types, helps, samples = parse(render(snap, now=102.5))
    assert COUNTERS <= types.keys() and GAUGES <= types.keys()
    assert all(types[n] == "counter" and n.endswith("_total") for n in COUNTERS)
    assert all(types[n] == "gauge" for n in GAUGES)
    pl = ("pipeline", 'odd "name"\\x')
    assert samples[("sealstream_events_total", (pl,))] == 1234
    assert samples[("sealstream_late_events_total", (pl,))] == 5
    assert samples[("sealstream_bad_records_total", (pl,))] == 2
    assert samples[("sealstream_windows_fired_total", (pl,))] == 17
    assert samples[("sealstream_checkpoints_total", (pl,))] == 3
    assert samples[("sealstream_watermark_ms", (pl,))] == 1_700_000_000_123
    part = "sealstream_partition_watermark_ms"
    assert samples[(part, (("partition", "in/p0.jsonl"), pl))] == 1_700_000_000_500
    assert samples[(part, (("partition", "in/p1.jsonl"), pl))] == math.inf
    assert samples[(part, (("partition", "in/p\n2"), pl))] == -math.inf
    assert samples[("sealstream_last_checkpoint_duration_seconds", (pl,))] == 0.0125
    assert samples[("sealstream_last_checkpoint_bytes", (pl,))] == 4096
    assert samples[("sealstream_last_checkpoint_age_seconds", (pl,))] == 2.5
    assert samples[("sealstream_open_windows", (pl,))] == 42
    # integers are printed exactly (no float rounding of ms timestamps)
    assert "sealstream_watermark_ms{" in render(snap) and " 1700000000123\n" in render(snap)


def test_render_before_any_checkpoint_has_no_checkpoint_samples() -> None:
    types, _, samples = parse(render(Snapshot(pipeline="p")))
    assert COUNTERS <= types.keys() and GAUGES <= types.keys()
    names = {n for n, _ in samples}
    assert "sealstream_last_checkpoint_age_seconds" not in names
    assert "sealstream_last_checkpoint_bytes" not in names
    assert samples[("sealstream_events_total", (("pipeline", "p"),))] == 0


# ------------------------------------------------------------------ a running job
def write_spec(d: Path, paths: list[Path], *, checkpoint: str = 'path = "ckpt"',
               every_events: int = 40000) -> Path:
    """``d/spec.toml``: the standard pipeline ("metrics-test") on the generated files
    ``paths``, late events and bad records written, checkpoints every ``every_events``."""
    spec = d / "spec.toml"
    spec.write_text(spec_text(
        "metrics-test", files_source(p.relative_to(d) for p in paths), batch_size=500,
        window=tumbling(60_000, allowed_lateness_ms=1000), late=True, errors=True,
        checkpoint=checkpoint, every_events=every_events, keep=3))
    return spec


@pytest.fixture(scope="module")
def big_spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("metrics")
    paths = generate(d / "in", events=300_000, keys=300, partitions=3, late_fraction=0.01,
                     bad_fraction=0.001, seed=5)
    return write_spec(d, paths)


def _scrape(url: str) -> tuple[str, str] | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.headers.get("Content-Type", ""), resp.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def test_metrics_endpoint_while_running(big_spec: Path) -> None:
    d = big_spec.parent
    metrics_file = d / "metrics.prom"
    summary_file = d / "summary.json"
    stderr_lines: list[str] = []
    with subprocess.Popen(
        [sys.executable, "-m", "sealstream", "run", str(big_spec), "--metrics-port", "0",
         "--metrics-file", str(metrics_file), "--summary-json", str(summary_file), "--json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    ) as proc:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", first)
        assert m, first
        url = f"http://127.0.0.1:{int(m.group(1))}/metrics"
        drain = threading.Thread(target=lambda: stderr_lines.extend(proc.stderr or []))
        drain.start()
        scrapes: list[str] = []
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            got = _scrape(url)
            if got is not None:
                ctype, body = got
                assert ctype.startswith("text/plain; version=0.0.4"), ctype
                scrapes.append(body)
            time.sleep(0.02)
        proc.wait(timeout=60)
        drain.join(timeout=10)
        assert proc.returncode == 0, "".join(stderr_lines)
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")
    assert len(scrapes) >= 3, f"only {len(scrapes)} scrapes while the job ran"

    names = ["in/p0.jsonl", "in/p1.jsonl", "in/p2.jsonl"]
    pl = ("pipeline", "metrics-test")
    previous: dict[str, float] = {}
    saw_checkpoint = False
    for body in scrapes:
        types, _, samples = parse(body)
        assert {n: types[n] for n in COUNTERS} == dict.fromkeys(COUNTERS, "counter")
        assert {n: types[n] for n in GAUGES} == dict.fromkeys(GAUGES, "gauge")
        for (name, labels), _value in samples.items():
            assert dict(labels)["pipeline"] == "metrics-test"
            if name in ("sealstream_partition_watermark_ms", "sealstream_watermark_holder"):
                assert dict(labels)["partition"] in names
            else:
                assert labels == (pl,), (name, labels)
        parts = {dict(lab)["partition"] for n, lab in samples
                 if n == "sealstream_partition_watermark_ms"}
        assert parts == set(names)
        for name in COUNTERS:  # counters never go down
            v = samples[(name, (pl,))]
            assert v >= previous.get(name, 0), (name, v, previous)
            previous[name] = v
        if ("sealstream_last_checkpoint_bytes", (pl,)) in samples:
            saw_checkpoint = True
            assert samples[("sealstream_last_checkpoint_bytes", (pl,))] > 0
            assert samples[("sealstream_last_checkpoint_age_seconds", (pl,))] >= 0
            assert samples[("sealstream_checkpoints_total", (pl,))] >= 1
    assert saw_checkpoint, "no scrape saw a checkpoint"
    assert previous["sealstream_events_total"] > 0

    # the metrics file holds the final values
    summary = json.loads(summary_file.read_text())
    _, _, final = parse(metrics_file.read_text())
    assert final[("sealstream_events_total", (pl,))] == summary["events"]
    assert final[("sealstream_late_events_total", (pl,))] == summary["late_events"]
    assert final[("sealstream_bad_records_total", (pl,))] == summary["bad_records"]
    assert final[("sealstream_windows_fired_total", (pl,))] == summary["windows_fired"]
    assert final[("sealstream_checkpoints_total", (pl,))] == summary["checkpoints"]["count"]
    assert not list(d.glob(".metrics.prom.*"))  # no temporary file left behind

    # --json: one JSON line per checkpoint, then the summary
    records = [json.loads(line) for line in stderr_lines if line.strip()]
    cks = [r for r in records if r["event"] == "checkpoint"]
    assert records[-1]["event"] == "summary" and records[-1]["events"] == summary["events"]
    assert len(cks) == summary["checkpoints"]["count"] >= 2
    assert [r["id"] for r in cks] == sorted(r["id"] for r in cks)
    assert cks[-1]["id"] == summary["checkpoints"]["last_id"]
    for r in cks:
        assert {"id", "ms", "bytes", "events", "late", "bad", "watermark",
                "positions"} <= r.keys()
        assert [p["partition"] for p in r["positions"]] == names
        assert all(isinstance(p["next_offset"], int) for p in r["positions"])
    assert [r["events"] for r in cks] == sorted(r["events"] for r in cks)
    assert cks[-1]["events"] == summary["events"]


def test_metrics_port_in_use_is_a_usage_error(big_spec: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        res = subprocess.run(
            [sys.executable, "-m", "sealstream", "run", str(big_spec), "--quiet",
             "--metrics-port", str(port)],
            capture_output=True, text=True, timeout=60,
        )
    assert res.returncode == 2, res.stderr
    assert f"--metrics-port {port}" in res.stderr and "Traceback" not in res.stderr


# ------------------------------------------------------------------ the terminal panel
def test_terminal_panel_renders_progress_and_partition_lag(tmp_path: Path) -> None:
    from sealstream._runtime.engine import Job
    from sealstream.cli._progress import Progress
    from sealstream.pipeline import load_spec

    paths = generate(tmp_path / "in", events=6_000, keys=20, partitions=2, seed=2)
    # synchronous: checkpoint 1 is committed before the next panel, whatever the
    # machine's load (asynchronous, it may still be in flight and only 2 shown)
    spec = write_spec(tmp_path, paths, checkpoint='path = "ckpt"\nasynchronous = false',
                      every_events=2000)
    panels: list[str] = []
    stream = io.StringIO()
    progress = Progress(tty=True, stream=stream)

    def hook(job: Job) -> None:
        progress(job)
        console = Console(file=io.StringIO(), width=120, color_system=None)
        console.print(progress.render(job, time.monotonic()))
        assert isinstance(console.file, io.StringIO)
        panels.append(console.file.getvalue())

    job = Job(load_spec(spec), progress=hook)
    try:
        job.run()
    finally:
        progress.stop()
    late = panels[-1]
    assert "metrics-test" in late and "events" in late and "watermark" in late
    assert "in/p0.jsonl" in late and "in/p1.jsonl" in late and "lag" in late
    assert "%" in late  # the input size is known: a progress bar
    assert any("checkpoint 1 " in p for p in panels), panels[-1]


def _panel_job(tmp_path: Path, partitions: int) -> Any:
    """A job that is not run: the panel is drawn from its watermark and a stand-in
    reader whose consumed bytes the test sets."""
    from sealstream._runtime.engine import Job
    from sealstream.pipeline import load_spec

    paths = generate(tmp_path / "in", events=300, keys=5, partitions=partitions, seed=3)
    return Job(load_spec(write_spec(tmp_path, paths)))


def _panel_text(progress: Any, job: Any, now: float) -> str:
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(progress.render(job, now))
    assert isinstance(console.file, io.StringIO)
    return console.file.getvalue()


def test_panel_rows_keep_the_partition_order(tmp_path: Path) -> None:
    """The rows were sorted by lag: they swapped places whenever another partition
    fell behind. They follow the spec's partition order in every refresh."""
    from sealstream.cli._progress import Progress

    job = _panel_job(tmp_path, 3)
    progress = Progress(tty=True, stream=io.StringIO())
    orders = []
    for times in ([10_000, 50_000, 90_000], [90_000, 10_000, 50_000],
                  [50_000, 90_000, 10_000]):
        job.wm.max_time = list(times)
        text = _panel_text(progress, job, time.monotonic())
        rows = [line.split()[0] for line in text.splitlines()
                if line.strip().startswith(tuple(job.names))]
        orders.append(rows)
    assert orders == [job.names] * 3, orders


def test_panel_eta_does_not_jump_with_each_batch(tmp_path: Path) -> None:
    """Input is consumed one batch a second while the panel refreshes ten times a
    second: between two refreshes the ETA counts down (by about the batch's second),
    it does not jump with the batch rhythm (the rate of the last seconds did: by
    half)."""
    from types import SimpleNamespace

    from sealstream.cli._progress import Progress

    job = _panel_job(tmp_path, 1)
    state = {"consumed": 0}
    total = 200_000
    reader = SimpleNamespace(size_hint=lambda: (state["consumed"], total))
    job.merger = SimpleNamespace(buffers=[SimpleNamespace(reader=reader)])
    progress = Progress(tty=True, stream=io.StringIO())
    job.started = 0.0
    etas = []
    for k in range(1, 1000):
        now = k / 10
        state["consumed"] = 1_000 * int(now)  # a batch of 1,000 bytes each second
        m = re.search(r"eta ([\d.]+) (s|min)", _panel_text(progress, job, now))
        if now > 30 and m:
            etas.append(float(m.group(1)) * (60 if m.group(2) == "min" else 1))
    assert len(etas) > 600
    assert 90 < etas[-1] < 110 and 150 < etas[0] < 220  # 170 s, then 100 s left at 1,000 B/s
    jumps = [abs(b - a) for a, b in zip(etas, etas[1:], strict=False)]
    i = max(range(len(jumps)), key=jumps.__getitem__)
    # at most one display step (0.1 min) and a batch's second
    assert max(jumps) < 7, (i, str(etas[max(0, i - 12):i + 12]))


def test_render_live_source_status_and_watermark_holder() -> None:
    snap = Snapshot(pipeline="p", partitions=(("orders/0", 5), ("orders/1", 9)),
                    holder="orders/0", connected=False,
                    lags=(("orders/0", 12), ("orders/1", 0)))
    text = render(snap)
    assert 'sealstream_source_connected{pipeline="p"} 0' in text
    assert 'sealstream_source_lag{pipeline="p",partition="orders/0"} 12' in text
    assert 'sealstream_watermark_holder{pipeline="p",partition="orders/0"} 1' in text
    assert "sealstream_source_connected{" not in render(Snapshot(pipeline="p"))


def test_a_narrow_terminal_never_splits_a_partitions_watermark(tmp_path: Path) -> None:
    """On a 48-column terminal the watermark was cut ('2026-11-30T00:53:19.00…'):
    the timestamp stays whole; the partition's name is shortened instead."""
    from sealstream.cli._progress import Progress

    job = _panel_job(tmp_path, 2)
    job.wm.max_time = [1_796_000_000_000, 1_796_000_050_000]
    progress = Progress(tty=True, stream=io.StringIO())
    console = Console(file=io.StringIO(), width=48, color_system=None)
    console.print(progress._partition_table(job, [None, None]))
    assert isinstance(console.file, io.StringIO)
    lines = console.file.getvalue().splitlines()
    body = [ln for ln in lines[1:] if ln.strip()]
    assert len(body) == 2, lines  # one line per partition
    for ln in body:
        assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", ln), lines
