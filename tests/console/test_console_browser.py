"""The console in a real headless Chromium (Debian's, installed by
scripts/install-chromium; Playwright drives the system browser, it never downloads
one): a newcomer opens the pipelines page, finds the checkpoint that was corrupted on
purpose and why it was rejected, reads the charts, looks up a window and downloads its
proof, watches the running job refresh, and a console listening beyond loopback
refuses a browser without its token.

One console server and one browser per module (a real ``sealstream console``
subprocess) keep the added time small. The browser is module-scoped, not session-scoped:
Playwright's sync API keeps an asyncio event loop running in the main thread until
``stop()``, and a later module's ``asyncio.run()`` would fail on it. Screenshots are saved as test
artefacts under ``$SEALSTREAM_TEST_ARTIFACTS`` (default: the session's tmp dir)."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _consolekit import emitted_window

from sealstream.testing.lifeline import die_with_parent

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 120.0  # generous: the machine is shared and noisy


def _chromium() -> str:
    res = subprocess.run([str(ROOT / "scripts" / "install-chromium")], capture_output=True,
                         text=True, timeout=900)
    path = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    if res.returncode != 0 or not path:
        msg = f"no system Chromium: {res.stderr.strip()}"
        if os.environ.get("SEALSTREAM_REQUIRE_BROWSER") == "1":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    path = _chromium()
    pw = sync_api.sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=path, headless=True,
                               args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            yield b
        finally:
            b.close()
    finally:
        pw.stop()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900},
                                  accept_downloads=True)
    context.set_default_timeout(WAIT_S * 1000)
    p = context.new_page()
    try:
        yield p
    finally:
        context.close()


@pytest.fixture(scope="session")
def artefacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("SEALSTREAM_TEST_ARTIFACTS")
    d = Path(where) / "console" if where else tmp_path_factory.mktemp("console-screenshots")
    d.mkdir(parents=True, exist_ok=True)
    return d


class Served:
    """A ``sealstream console`` subprocess; its URL from the line it prints when bound."""

    def __init__(self, *args: str) -> None:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("SEALSTREAM_CHECKPOINT_KEY")}
        self.proc = subprocess.Popen([sys.executable, "-m", "sealstream", "console", *args],
                                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True, env=env,
                                     preexec_fn=die_with_parent())  # not left running
        self.lines: queue.Queue[str] = queue.Queue()
        self.pump = threading.Thread(target=self._pump, daemon=True)
        self.pump.start()
        self.printed: list[str] = []
        deadline = time.monotonic() + WAIT_S
        while not any("serving http" in ln for ln in self.printed):
            try:
                self.printed.append(self.lines.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                self.stop()
                raise AssertionError(f"the console did not start: {self.printed}") from None
        if any("token" in ln for ln in self.printed[-1:]):
            self.printed.append(self.lines.get(timeout=WAIT_S))  # the token's line
        m = re.search(r"serving (http://\S+?:(\d+)/)", "\n".join(self.printed))
        assert m is not None, self.printed
        self.port = int(m.group(2))
        self.url = f"http://127.0.0.1:{self.port}/"

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line.rstrip("\n"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.pump.join(timeout=WAIT_S)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture(scope="module")
def damaged_job(tmp_path_factory: pytest.TempPathFactory, finished_job: Path) -> Path:
    """The finished job with its newest checkpoint's state corrupted on purpose."""
    d = Path(shutil.copytree(finished_job, tmp_path_factory.mktemp("browser") / "job"))
    newest = sorted((d / "ckpt").glob("cp-*"))[-1]
    state = newest / "state.arrow"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 1
    state.write_bytes(bytes(data))
    return d


@pytest.fixture(scope="module")
def metrics() -> Iterator[Any]:
    from sealstream.cli._metrics import MetricsServer

    server = MetricsServer(0, "story")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def console(damaged_job: Path, metrics: Any) -> Iterator[Served]:
    s = Served(str(damaged_job / "ckpt"), "--port", "0", "--job",
               f"http://127.0.0.1:{metrics.port}")
    try:
        yield s
    finally:
        s.stop()


def _newest(job: Path) -> int:
    return int(sorted((job / "ckpt").glob("cp-*"))[-1].name[3:])


def test_a_newcomer_finds_why_the_last_checkpoint_was_rejected(
        console: Served, page: Any, damaged_job: Path, artefacts: Path) -> None:
    n = _newest(damaged_job)
    page.goto(console.url)
    row = page.locator("table.pipelines tbody tr").first
    assert "INCONSISTENT_STATE" in row.inner_text() and "HASH_MISMATCH" in row.inner_text()
    page.screenshot(path=str(artefacts / "pipelines.png"))
    page.click("a.pipeline-link")
    page.wait_for_url(re.compile(r"/history"))
    assert page.locator("tr.row").count() == n
    page.screenshot(path=str(artefacts / "history.png"), full_page=True)
    page.select_option("#verdict-filter", "INCONSISTENT_STATE")  # submits the form
    page.wait_for_url(re.compile(r"verdict=INCONSISTENT_STATE"))
    rows = page.locator("tr.row")
    assert rows.count() == 1 and rows.first.get_attribute("data-id") == str(n)
    rows.first.locator("a").first.click()
    page.wait_for_url(re.compile(rf"/cp/{n}$"))
    verdict = page.locator("#verdict").inner_text()
    assert "INCONSISTENT_STATE" in verdict and "HASH_MISMATCH" in verdict
    assert "does not match its SHA-256" in page.locator("#verdict-message").inner_text()
    failed = page.locator("table.components tr.bad").all_inner_texts()
    assert any("state.arrow" in t and "FAILED" in t for t in failed), failed
    page.screenshot(path=str(artefacts / "detail.png"), full_page=True)


def test_the_charts_are_drawn_with_their_data_points(
        console: Served, page: Any, damaged_job: Path, artefacts: Path) -> None:
    n = _newest(damaged_job)
    page.goto(console.url + "s/0/0/charts")
    for chart in ("chart-watermark", "chart-partition-watermarks", "chart-positions",
                  "chart-size", "chart-results"):
        svg = page.locator(f"svg#{chart}")
        box = svg.bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 100, chart
        points = svg.locator("circle.pt")
        assert points.count() >= n - 1, (chart, points.count())
        dot = points.first.bounding_box()
        assert dot is not None and dot["width"] > 0  # rendered, not just present
        assert svg.locator("polyline").count() >= 1
    page.screenshot(path=str(artefacts / "charts.png"), full_page=True)


def test_a_window_lookup_downloads_a_proof_that_verifies(
        console: Served, page: Any, damaged_job: Path, tmp_path: Path) -> None:
    w = emitted_window(damaged_job, back=1)
    n = _newest(damaged_job) - 1  # the newest verified checkpoint: its epoch emitted w
    page.goto(console.url + "s/0/0/window")
    page.fill("#w-key", str(w["key"]))
    page.fill("#w-start", str(w["window_start"]))
    page.fill("#w-end", str(w["window_end"]))
    page.fill("#w-id", str(n))
    page.click("#w-go")
    page.wait_for_selector("#window-result")
    assert page.locator("#window-status").inner_text() == "emitted"
    with page.expect_download() as info:
        page.click("#proof-download")
    target = tmp_path / "proof.json"
    info.value.save_as(str(target))
    proof = json.loads(target.read_text())
    assert proof["receipt_proof"] == 2 and proof["checkpoint"] == n
    res = subprocess.run([sys.executable, "-m", "sealstream", "receipts", "verify", str(target),
                          "--checkpoints", str(damaged_job / "ckpt")], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_running_job_refreshes_live(console: Served, page: Any, metrics: Any) -> None:
    from sealstream.cli._metrics import Snapshot

    metrics.update(Snapshot(pipeline="story", events=1000, watermark_ms=1_700_000_000_000,
                            partitions=(("in/p0.jsonl", 1_700_000_000_000),
                                        ("in/p1.jsonl", 1_700_000_005_000)),
                            holder="in/p0.jsonl"))
    page.goto(console.url + "job")
    page.wait_for_function("document.querySelector('[data-f=\"counts.events\"]')"
                           ".textContent === '1000'")
    assert page.locator("#job-holder").inner_text() == "in/p0.jsonl"
    metrics.update(Snapshot(pipeline="story", events=54321, watermark_ms=1_700_000_009_000,
                            partitions=(("in/p0.jsonl", 1_700_000_009_000),
                                        ("in/p1.jsonl", 1_700_000_010_000)),
                            holder="in/p0.jsonl"))
    # no reload: the page polls the job through the console
    page.wait_for_function("document.querySelector('[data-f=\"counts.events\"]')"
                           ".textContent === '54321'")
    assert "2023-11-14T22:13:29" in page.locator("#job-watermark").inner_text()


def test_beyond_loopback_a_browser_without_the_token_is_refused(
        finished_job: Path, page: Any) -> None:
    served = Served(str(finished_job / "ckpt"), "--host", "0.0.0.0", "--port", "0")
    try:
        text = "\n".join(served.printed)
        m = re.search(r"\?token=(\S+)", text)
        assert m is not None, text
        resp = page.goto(served.url)
        assert resp.status == 401
        assert "token is required" in page.content() and "story" not in page.content()
        resp = page.goto(served.url + "s/0/0/history")
        assert resp.status == 401
        resp = page.goto(served.url + "?token=not-" + m.group(1))
        assert resp.status == 401
        resp = page.goto(served.url + "?token=" + m.group(1))  # sets the cookie once
        assert resp.status == 200 and "story" in page.content()
        assert "token=" not in page.url
        resp = page.goto(served.url + "s/0/0/history")  # the cookie carries it now
        assert resp.status == 200 and page.locator("tr.row").count() >= 1
    finally:
        served.stop()
