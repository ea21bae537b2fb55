"""Chaos with the archive: a Kafka job SIGKILLed again and again (at named crash
points, and at random instants while it reads and archives), its newest checkpoint
damaged between some restarts (so that it falls back to an older one), and after
every kill the broker deletes every record the job has read. Each restart can only
find what it needs in the archive; the final output is exactly the files' output."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _archive_story import (
    delete_records,
    env,
    files_source,
    highest_read,
    kafka_source,
    outcome,
    produce_lines,
    run,
    write_spec,
)

from sealstream._runtime.crash import POINTS
from sealstream.testing.datagen import generate

pytest.importorskip("confluent_kafka")


def _damage_newest(ckpt: Path, rng: random.Random) -> bool:
    """Truncate or garble the newest manifest when an older checkpoint remains."""
    manifests = sorted(ckpt.glob("cp-*/MANIFEST.json"))
    if len(manifests) < 2:
        return False
    m = manifests[-1]
    data = m.read_bytes()
    m.write_bytes(data[: len(data) // 2] if rng.random() < 0.5 else data.replace(b'"', b"'", 3))
    return True


def _killed_at_random(spec: Path, seconds: float) -> int | None:
    """The run SIGKILLed after ``seconds`` (None: it finished first, with its code)."""
    with subprocess.Popen([sys.executable, "-m", "sealstream", "run", str(spec), "--quiet"],
                          env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True) as proc:
        try:
            _, err = proc.communicate(timeout=seconds)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            return None
        assert proc.returncode in (0, -9), err
        return proc.returncode


@pytest.mark.parametrize("seed", [1, 2])
def test_kills_fallbacks_and_deletions_stay_exact(kafka: Any, tmp_path: Path,
                                                  seed: int) -> None:
    rng = random.Random(seed)
    files = generate(tmp_path / "data", events=600, keys=6, partitions=2, seed=seed,
                     late_fraction=0.03, bad_fraction=0.03)
    ref = tmp_path / "files"
    t0 = time.monotonic()
    assert run(write_spec(ref, files_source(files), archive=None, batch=20,
                          every=60)).returncode == 0
    typical_s = time.monotonic() - t0
    topic = kafka.new_topic(partitions=2)
    produce_lines(kafka.bootstrap, topic, files)
    d = tmp_path / "job"
    spec = write_spec(d, kafka_source(kafka.bootstrap, topic), batch=20, every=60)
    finished = False
    for _round in range(6):
        if rng.random() < 0.6:
            point = f"{rng.choice(POINTS)}:{rng.randint(1, 4)}"
            r = run(spec, crash_at=point)
            assert r.returncode in (0, -9), (point, r.stderr)
            finished = r.returncode == 0
        else:
            finished = _killed_at_random(spec, rng.uniform(0.3, 1.5) * typical_s + 1.0) == 0
        if finished:
            break
        if (d / "ckpt" / "plans").is_dir():
            read = highest_read(d / "ckpt")
            delete_records(kafka.bootstrap, topic,
                           {int(n.rsplit("/", 1)[1]): v for n, v in read.items()})
        if rng.random() < 0.4:
            _damage_newest(d / "ckpt", rng)
    if not finished:
        r = run(spec)
        assert r.returncode == 0, r.stderr
    assert outcome(d) == outcome(ref)
