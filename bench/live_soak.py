"""Live latency and memory over time, on a followed JSONL file fed at a fixed rate.

    python -m bench.live_soak [--rate N] [--events N] [--full]

A writer appends events at ``--rate`` events per second to ``in/a.jsonl`` (event
time = the writer's wall clock, 1,000 keys); ``sealstream run`` follows it
(``stop = "never"``, tumbling 1 s windows, ``max_delay_ms = 200``, checkpoint every
1 s). It measures:

* latency: per window, from the moment the watermark can pass its end (the writer's
  clock reaching ``window_end + max_delay_ms``) to its result being seen in a
  committed output file (polled every 20 ms), p50 and p99; target p99 under the
  checkpoint interval + 0.5 s (1.5 s);
* memory: the job's peak RSS (``/proc/PID/status``, sampled every 0.2 s) after the
  first tenth of the events (``--full``: after the first 1,000,000 of 10,000,000)
  and over the whole run; target: the end within 10 % of the first.

``--events`` defaults to a reduced 300,000 (a loaded 2-core machine); ``--full`` is
the issue's 10,000,000 (about 3 hours at the default rate; ``--rate 5000``: about
35 minutes). Results go to ``bench/results/live_soak.md`` and ``.json``
(``--full``: ``live_soak-full.md`` and ``.json``), with the load average at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work" / "live_soak"
RESULTS = ROOT / "bench" / "results"
EVERY_MS = 1000
MAX_DELAY_MS = 200


def writer(path: Path, rate: int, events: int, done: threading.Event) -> None:
    """``events`` lines at ``rate`` per second, in 20 ms slices."""
    written, t0 = 0, time.time()
    with open(path, "a", encoding="utf-8") as f:
        while written < events:
            due = min(events, int((time.time() - t0) * rate))
            if due > written:
                now = int(time.time() * 1000)
                f.write("".join(
                    f'{{"user":"u{(written + k) % 1000}","ts":{now},"amount":{k % 7}}}\n'
                    for k in range(due - written)))
                f.flush()
                written = due
            time.sleep(0.02)
    done.set()


def rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def events_read(ckpt: Path) -> int:
    best = 0
    for cp in ckpt.glob("cp-*"):
        try:
            doc = json.loads((cp / "MANIFEST.json").read_text())
            best = max(best, int(doc["counters"]["events"]))
        except (OSError, ValueError, KeyError):
            continue
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.live_soak")
    ap.add_argument("--rate", type=int, default=1000, help="events per second")
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--full", action="store_true", help="10,000,000 events, first 1,000,000")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    from sealstream.testing.specs import files_source, spec_text, tumbling

    events = 10_000_000 if a.full else a.events
    first = 1_000_000 if a.full else events // 10
    subprocess.run(["rm", "-rf", str(WORK)], check=True)
    (WORK / "in").mkdir(parents=True)
    source = files_source(["in/*.jsonl"]) + '\nfollow = true\nstop = "never"\npoll_ms = 20'
    (WORK / "spec.toml").write_text(spec_text("live_soak", source, max_delay_ms=MAX_DELAY_MS,
                                              window=tumbling(1000), every_ms=EVERY_MS, keep=3))
    src = WORK / "in" / "a.jsonl"
    src.touch()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "sealstream", "run", "spec.toml", "--quiet"],
                            cwd=WORK, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    done = threading.Event()
    w = threading.Thread(target=writer, args=(src, a.rate, events, done), daemon=True)
    w.start()
    seen: dict[int, float] = {}  # window_end -> when first seen committed
    read_parts: set[str] = set()
    peak_first = peak_all = 0
    samples: list[tuple[float, int, int]] = []
    t0 = last_sample = time.time()
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the job ended: {proc.stderr.read() if proc.stderr else ''}")
            now = time.time()
            # a committed part file is complete (renamed into place) and never changes:
            # read each new one once (re-reading thousands of them every 20 ms would
            # take a core from the job by the end of a 10M run)
            out = WORK / "out"
            names = os.listdir(out) if out.is_dir() else []
            for name in sorted(set(names) - read_parts):
                if not (name.startswith("part-") and name.endswith(".jsonl")):
                    continue
                read_parts.add(name)
                for line in (out / name).read_bytes().splitlines():
                    end = int(json.loads(line)["window_end"])
                    seen.setdefault(end, now)
            if now - last_sample >= 0.2:
                last_sample = now
                rss = rss_kb(proc.pid) or 0
                n = events_read(WORK / "ckpt")
                peak_all = max(peak_all, rss)
                if n <= first:
                    peak_first = max(peak_first, rss)
                samples.append((round(now - t0, 1), n, rss))
                if done.is_set() and n >= events:
                    break
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
    lat = sorted(seen[e] - (e + MAX_DELAY_MS) / 1000 for e in seen)[1:]  # first: warm-up
    res: dict[str, Any] = {
        "events": events, "rate": a.rate, "reduced": not a.full, "first": first,
        "windows": len(lat),
        "latency_p50_s": round(statistics.median(lat), 3) if lat else None,
        "latency_p99_s": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 3) if lat else None,
        "latency_target_s": EVERY_MS / 1000 + 0.5,
        "rss_peak_first_mb": round(peak_first / 1024, 1),
        "rss_peak_end_mb": round(peak_all / 1024, 1),
        "rss_growth": round(peak_all / peak_first - 1, 3) if peak_first else None,
        "samples": samples[:: max(1, len(samples) // 50)],
    }
    a.out.mkdir(parents=True, exist_ok=True)
    # the full run has files of its own: the reduced run's stay beside it
    stem = "live_soak-full" if a.full else "live_soak"
    load = os.getloadavg()
    (a.out / f"{stem}.json").write_text(json.dumps({**res, "load_end": load}, indent=1) + "\n")
    (a.out / f"{stem}.md").write_text(
        "# Live latency and memory (followed JSONL file)\n\n"
        f"{events:,} events at {a.rate:,}/s ({'reduced run' if not a.full else 'full run'}; "
        "a shared, loaded 2-core machine). `python -m bench.live_soak"
        f"{' --full' if a.full else f' --events {events}'} --rate {a.rate}`.\n\n"
        f"- latency, window end passing the watermark -> result committed: p50 "
        f"{res['latency_p50_s']} s, p99 {res['latency_p99_s']} s over {len(lat)} windows "
        f"(target p99 < {res['latency_target_s']} s)\n"
        f"- peak RSS after the first {first:,} events: {res['rss_peak_first_mb']} MB; over "
        f"the whole run: {res['rss_peak_end_mb']} MB (growth {res['rss_growth']}, target "
        "<= 0.10)\n"
        f"- load average at the end (1, 5, 15 min): {load[0]:.2f}, {load[1]:.2f}, "
        f"{load[2]:.2f}\n")
    print(json.dumps({k: v for k, v in res.items() if k != "samples"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
