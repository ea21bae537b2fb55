"""Story: a job reads a JetStream stream (kind = "nats", stop = "end"). Its results
equal those of the same events in JSONL files; SIGKILLed at random instants with its
newest checkpoint or step plan damaged between restarts, its committed output equals
an uninterrupted run, exactly once.

Seeds: ``SEALSTREAM_NATS_CHAOS_SEEDS`` (default 1; the producer-while-killed story is
test_nats_live_crash.py) random stories."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
if str(SCENARIOS) not in sys.path:
    sys.path.insert(0, str(SCENARIOS))

from _story import assert_same_output, committed, make_input, write_spec  # noqa: E402

SEEDS = int(os.environ.get("SEALSTREAM_NATS_CHAOS_SEEDS", "1"))


def nats_spec(d: Path, jet: Any, names: list[str], **kw: Any) -> Path:
    """The story's spec with the files replaced by the stream (one subject per file)."""
    spec = write_spec(d, names, **kw)
    subjects = json.dumps([jet.s(f"p{i}") for i in range(len(names))])
    source = (f'kind = "nats"\nservers = "{jet.url}"\nstream = "{jet.stream}"\n'
              f'subjects = {subjects}\nstop = "end"')
    text = re.sub(r'kind = "jsonl"\npaths = \[[^\]]*\]', source, spec.read_text(), count=1)
    spec.write_text(text)
    return spec


def publish_files(jet: Any, d: Path, names: list[str]) -> None:
    """Each file's non-blank lines to its subject, the files interleaved line by line
    (so every subject has sequence gaps)."""
    per = [[ln.encode() for ln in (d / n).read_text().splitlines() if ln.strip()]
           for n in names]
    items: list[tuple[str, bytes | dict[str, Any]]] = []
    for i in range(max(map(len, per))):
        for p, lines in enumerate(per):
            if i < len(lines):
                items.append((f"p{p}", lines[i]))
    jet.publish(items)


def run(spec: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                          capture_output=True, text=True, timeout=300)


def test_a_stream_gives_the_results_of_the_same_events_in_files(
    jet: Any, tmp_path: Path
) -> None:
    """Events never late (disorder below max_delay_ms): the results cannot depend on
    how the partitions' records were interleaved, so they equal a run over files."""
    from sealstream.testing.datagen import generate

    d = tmp_path / "nats"
    f = tmp_path / "files"
    for where in (d, f):
        generate(where / "in", events=1500, keys=20, partitions=3, seed=5, disorder_ms=800)
    names = [f"in/p{i}.jsonl" for i in range(3)]
    jet.create([f"p{i}" for i in range(3)])
    publish_files(jet, d, names)
    res = run(nats_spec(d, jet, names, every_events=200, batch_size=100))
    assert res.returncode == 0, res.stderr
    res = run(write_spec(f, names, every_events=200, batch_size=100))
    assert res.returncode == 0, res.stderr
    assert not committed(d, "late") and not committed(f, "late")
    ident = ("key", "window_start", "window_end")
    got = {tuple(r[k] for k in ident): r for r in committed(d, "out")}
    want = {tuple(r[k] for k in ident): r for r in committed(f, "out")}
    assert got.keys() == want.keys() and got
    for k, r in got.items():  # sums may differ in the last bit: another addition order
        assert r.keys() == want[k].keys()
        for name, v in r.items():
            exp = want[k][name]
            assert (v == pytest.approx(exp, rel=1e-12) if isinstance(exp, float)
                    else v == exp), (k, name, v, exp)


def _damage_newest(d: Path, rng: random.Random) -> str:
    """Flip a byte of a file of the newest checkpoint, or of the newest step plan."""
    ckpt = d / "ckpt"
    cps = sorted(ckpt.glob("cp-*"))
    plans = sorted((ckpt / "plans").glob("step-*.json")) if (ckpt / "plans").is_dir() else []
    # the newest checkpoint only while an older one remains: damaging the only one is a
    # refusal by contract (semantics section 6), not a fall-back
    files = [p for p in (cps[-1].iterdir() if len(cps) >= 2 else []) if p.is_file()]
    if plans:
        files.append(plans[-1])
    if not files:
        return "nothing to damage"
    victim = rng.choice(files)
    data = bytearray(victim.read_bytes())
    if data:
        at = rng.randrange(len(data))
        data[at] ^= 0x20
        victim.write_bytes(bytes(data))
    return str(victim.relative_to(d))


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_sigkills_and_damaged_checkpoints_give_an_uninterrupted_runs_output(
    jet: Any, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    events = 900
    ref = tmp_path / "ref"
    names = make_input(ref, events=events, seed=seed)
    jet.create([f"p{i}" for i in range(len(names))])
    publish_files(jet, ref, names)
    story = {"every_events": 200, "batch_size": 100, "keep": 3}
    started = time.monotonic()
    res = run(nats_spec(ref, jet, names, **story))
    assert res.returncode == 0, res.stderr
    expected_s = time.monotonic() - started

    d = tmp_path / "killed"
    spec = nats_spec(d, jet, make_input(d, events=events, seed=seed), **story)
    kills = tries = 0
    damaged: list[str] = []
    while kills < 3:
        timer = rng.uniform(0.05, 0.95) * expected_s
        begun = time.monotonic()
        with subprocess.Popen([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) as proc:
            try:
                _, err = proc.communicate(timeout=timer)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.communicate()
                kills += 1
                if rng.random() < 0.5:
                    damaged.append(_damage_newest(d, rng))
                continue
        assert proc.returncode == 0, err
        if kills:
            break
        # it finished before the first kill: start over, timed by this run
        tries += 1
        assert tries <= 20, "20 runs in a row finished before their timer"
        for sub in ("out", "late", "ckpt"):
            subprocess.run(["rm", "-rf", str(d / sub)], check=True)
        expected_s = time.monotonic() - begun
    else:
        res = run(spec)
        assert res.returncode == 0, (res.stderr, damaged)
    assert kills >= 1
    assert_same_output(d, ref)


def _newest_events(ckpt: Path) -> int:
    """How many events the newest complete checkpoint has counted (0 when none)."""
    for cp in sorted(ckpt.glob("cp-*"), reverse=True):
        try:
            doc = json.loads((cp / "MANIFEST.json").read_text())
        except (OSError, ValueError):
            continue
        return int(doc.get("counters", {}).get("events", 0))
    return 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_a_never_ending_run_which_then_resumes_exactly_once(
    jet: Any, tmp_path: Path, sig: signal.Signals
) -> None:
    from sealstream.testing.datagen import generate

    names = [f"in/p{i}.jsonl" for i in range(2)]
    ref, d = tmp_path / "ref", tmp_path / "stopped"
    for where in (ref, d):
        generate(where / "in", events=600, keys=10, partitions=2, seed=1, disorder_ms=800)
    jet.create(["p0", "p1"])
    publish_files(jet, d, names)
    total = jet.state().messages
    spec = nats_spec(d, jet, names, every_events=100, batch_size=50)
    text = spec.read_text().replace('stop = "end"', 'stop = "never"')
    spec.write_text(text.replace("every_events = 100", "every_events = 100\nevery_ms = 200"))
    with subprocess.Popen([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True) as proc:
        try:
            deadline = time.monotonic() + 120
            # everything published so far is in a checkpoint: the run is idle, waiting
            while _newest_events(d / "ckpt") < total:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, _newest_events(d / "ckpt")
                time.sleep(0.05)
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:  # a failed test never leaves a never-ending run behind
                proc.kill()
    assert proc.returncode == 0, err
    # the end: the same events again (a second batch), then a backfill to the end
    more = [f"in/q{i}.jsonl" for i in range(2)]
    for where in (ref, d):
        generate(where / "more", events=300, keys=10, partitions=2, seed=2, disorder_ms=800,
                 start_ms=1_700_001_000_000)
        for i in range(2):
            (where / more[i]).write_text((where / "more" / f"p{i}.jsonl").read_text())
    publish_files(jet, d, more)
    spec.write_text(spec.read_text().replace('stop = "never"', 'stop = "end"'))
    res = run(spec)
    assert res.returncode == 0, res.stderr
    # the uninterrupted run reads the same stream from its start in one go
    ref_spec = nats_spec(ref, jet, names, every_events=100, batch_size=50)
    res = run(ref_spec)
    assert res.returncode == 0, res.stderr
    assert_same_output(d, ref)
    assert committed(d, "out")
