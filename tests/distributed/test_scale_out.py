"""Scale-out stories: N Ray workers give the single-process output, exactly once,
across lost workers, lost nodes, damaged checkpoints and changes of worker count.

Sampled: a few seeds by default, more with ``SEALSTREAM_RAY_EXAMPLES=N``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from helpers import Case, Output, assert_same_output, read_jsonl_dir, run_engine, write_case
from scenarios._story import assert_same_output as assert_same_dirs
from scenarios._story import make_input, write_spec
from test_properties import cases

EXAMPLES = int(os.environ.get("SEALSTREAM_RAY_EXAMPLES", "2"))
WINDOWS = {
    "tumbling": 'kind = "tumbling"\nsize_ms = 2000\nallowed_lateness_ms = 500',
    "sliding": 'kind = "sliding"\nsize_ms = 3000\nslide_ms = 1000\nallowed_lateness_ms = 0',
    "session": 'kind = "session"\ngap_ms = 1500\nallowed_lateness_ms = 200',
}
STORY = {"events": 1500, "every_events": 300, "batch_size": 100}


def _run_workers(case: Case, workers: int, directory: Path) -> Output:
    from sealstream.cli import main

    spec = write_case(case, directory)
    rc = main(["run", str(spec), "--quiet", "--workers", str(workers)])
    assert rc == 0, f"sealstream run --workers {workers} exited {rc}"
    return Output(read_jsonl_dir(directory / "out"), read_jsonl_dir(directory / "late"))


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_two_and_three_workers_give_the_single_process_output(
        ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory, case: Case) -> None:
    single = run_engine(case)
    for n in (2, 3):
        got = _run_workers(case, n, tmp_path_factory.mktemp(f"w{n}"))
        assert_same_output(single, got, case)


def _story_spec(d: Path, kind: str) -> Path:
    names = make_input(d, events=STORY["events"])
    return write_spec(d, names, window=WINDOWS[kind], every_events=STORY["every_events"],
                      batch_size=STORY["batch_size"])


def _job(spec: Path, workers: int | None, **kw: Any) -> Any:
    from sealstream import Job, load_spec
    from sealstream.distributed import DistributedJob

    pipeline = load_spec(spec)
    if workers is None:
        return Job(pipeline, **kw)
    return DistributedJob(pipeline, workers=workers, **kw)


class KillAt:
    """A progress hook that SIGKILLs one worker process after a randomly drawn step."""

    def __init__(self, rng: random.Random, steps: int) -> None:
        self.rng = rng
        self.at = rng.randrange(1, steps)
        self.step = 0
        self.killed: list[int] = []

    def __call__(self, job: Any) -> None:
        self.step += 1
        if self.step == self.at and not self.killed:
            pid = self.rng.choice(job.worker_pids)
            os.kill(pid, signal.SIGKILL)
            self.killed.append(pid)


@pytest.mark.parametrize("seed", range(max(1, EXAMPLES // 2)))
def test_sigkill_of_a_worker_restarts_every_worker_from_the_newest_checkpoint(
        ray_cluster: Any, tmp_path: Path, reference: Any, seed: int) -> None:
    rng = random.Random(seed)
    kind = rng.choice(sorted(WINDOWS))
    ref = reference(window=WINDOWS[kind], **STORY)
    d = tmp_path / "dist"
    spec = _story_spec(d, kind)
    kill = KillAt(rng, steps=STORY["events"] // STORY["batch_size"])
    job = _job(spec, 2 + seed % 2, progress=kill)
    job.run()
    assert kill.killed and job.restarts == 1
    assert_same_dirs(d, ref)


def test_lost_worker_then_damaged_parts_then_resume_with_other_count(
        ray_cluster: Any, tmp_path: Path, reference: Any) -> None:
    """Run with 2 workers, kill one with no restart left (the run fails), damage one
    worker's part of the newest checkpoint and delete one of the checkpoint before,
    resume with 3 workers: both are rejected, it falls back, and the output is exact."""
    from sealstream.distributed import WorkerLostError

    ref = reference(window=WINDOWS["session"], **STORY)
    d = tmp_path / "dist"
    spec = _story_spec(d, "session")
    kill = KillAt(random.Random(5), steps=STORY["events"] // STORY["batch_size"])
    kill.at = max(kill.at, 8)  # three checkpoints are kept by then
    with pytest.raises(WorkerLostError):
        _job(spec, 2, progress=kill, max_restarts=0).run()
    newest, older = sorted((d / "ckpt").glob("cp-*"))[-1:-3:-1]
    assert sorted(p.name for p in newest.glob("state.part-*")) == [
        "state.part-0000.arrow", "state.part-0001.arrow"]
    part = newest / "state.part-0001.arrow"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    (older / "state.part-0000.arrow").unlink()
    job = _job(spec, 3)
    job.run()
    assert [(r["verdict"], r["reason"]) for r in job.rejected] == [
        ("INCONSISTENT_STATE", "HASH_MISMATCH"), ("PARTIAL_CHECKPOINT_REJECT", "FILE_MISSING")]
    assert_same_dirs(d, ref)


def test_checkpoint_commands_show_the_parts(ray_cluster: Any, tmp_path: Path) -> None:
    from sealstream.cli import main

    d = tmp_path / "dist"
    spec = _story_spec(d, "tumbling")
    job = _job(spec, 3)
    job.run()
    assert job.merger is not None  # partitions were read on the workers
    # the workers read their partitions and exchanged the rows (the data plane)
    assert type(job.merger).__name__ == "StepPlanner" and job.merger.step_bytes
    out = subprocess.run(
        [sys.executable, "-m", "sealstream", "checkpoints", "list", str(d / "ckpt"), "--json"],
        capture_output=True, text=True, check=True, timeout=60)
    newest = json.loads(out.stdout)["checkpoints"][-1]
    assert sum(f.endswith(("state.part-0000.arrow", "state.part-0001.arrow",
                           "state.part-0002.arrow")) for f in newest["files"]) == 3
    assert main(["checkpoints", "verify", str(d / "ckpt")]) == 0
    shown = subprocess.run(
        [sys.executable, "-m", "sealstream", "checkpoints", "inspect", str(d / "ckpt"), "--json"],
        capture_output=True, text=True, check=True, timeout=60)
    doc = json.loads(shown.stdout)
    assert doc["distributed"]["workers"] == 3
    assert [p["worker"] for p in doc["distributed"]["parts"]] == [0, 1, 2]


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie nobody reaped yet does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def test_a_node_removed_mid_run(ray_cluster: Any, tmp_path: Path, reference: Any) -> None:
    from _ray_nodes import GENEROUS_S, NODE, pool_with_a_worker_on

    ref = reference(window=WINDOWS["sliding"], **STORY)
    d = tmp_path / "dist"
    spec = _story_spec(d, "sliding")
    from sealstream.distributed._shard import drain_pool

    node = ray_cluster.add_node(**{**NODE, "num_cpus": 1})
    ray_cluster.wait_for_nodes()
    drain_pool()
    pool_with_a_worker_on(node, 3)  # the job takes these workers
    removed: list[int] = []

    def remove(job: Any) -> None:
        if not removed and job.counters.events >= 600:
            pids = list(job.worker_pids)
            ray_cluster.remove_node(node)
            removed.append(job.counters.events)
            # the node's worker processes end once its raylet is gone: wait for that
            # event (on a loaded machine it can come after the job's last step)
            deadline = time.monotonic() + GENEROUS_S
            while all(_alive(p) for p in pids):
                assert time.monotonic() < deadline, "no worker was on the removed node"
                time.sleep(0.01)

    job = _job(spec, 3, progress=remove)
    job.run()
    assert removed and job.restarts == 1
    assert_same_dirs(d, ref)


def test_rescale_1_2_3_1_across_restarts(ray_cluster: Any, tmp_path: Path, reference: Any) -> None:
    """One job, five runs, each but the last stopping after a checkpoint: 1 process,
    2 workers, 3 workers, 1 process, 1 process to the end. Incremental checkpoints are
    on: a single process resuming from a checkpoint in parts starts a new full base."""
    ref = reference(window=WINDOWS["tumbling"], **STORY)
    d = tmp_path / "dist"
    spec = _story_spec(d, "tumbling")
    text = spec.read_text().replace("[checkpoint]\n", "[checkpoint]\nincremental = true\n")
    spec.write_text(text)
    for workers in (None, 2, 3, None):
        job = _job(spec, workers, stop_when=lambda j: True)
        job.run()
        assert job.stopped_early
    _job(spec, None).run()
    assert_same_dirs(d, ref)


def test_a_run_without_workers_does_not_import_ray(tmp_path: Path) -> None:
    d = tmp_path / "plain"
    spec = _story_spec(d, "tumbling")
    code = ("import sys\nfrom sealstream.cli import main\n"
            f"assert main(['run', {str(spec)!r}, '--quiet']) == 0\n"
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120, env=dict(os.environ))
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_sigkill_of_the_coordinator_then_resume_with_other_count(
        ray_cluster: Any, tmp_path: Path, reference: Any) -> None:
    """``sealstream run --workers 2 --ray ADDRESS`` in a subprocess, SIGKILLed once a
    randomly drawn checkpoint is published (never a fixed timer), resumed with 3."""
    import time

    ref = reference(window=WINDOWS["sliding"], **STORY)
    d = tmp_path / "dist"
    spec = _story_spec(d, "sliding")
    target = random.Random(11).randint(1, 3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sealstream", "run", str(spec), "--quiet", "--workers", "2",
         "--ray", ray_cluster.address, "--batch-size", "20"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        while proc.poll() is None:
            if len(list((d / "ckpt").glob("cp-*/MANIFEST.json"))) >= target:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.01)  # polling for the event (a published manifest), not a timer
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, f"the run ended before the kill: {err}"
    job = _job(spec, 3)
    job.run()
    assert job.resumed_from is not None
    assert_same_dirs(d, ref)


def test_usage_errors(tmp_path: Path) -> None:
    from sealstream.cli import main

    spec = _story_spec(tmp_path, "tumbling")
    assert main(["run", str(spec), "--ray", "127.0.0.1:1"]) == 2
    assert main(["run", str(spec), "--workers", "0"]) == 2
    spec.write_text(spec.read_text().replace('name = "story"', 'name = "story"\nworkers = 0'))
    assert main(["run", str(spec)]) == 2


def test_workers_setting_is_not_fingerprinted(tmp_path: Path) -> None:
    from sealstream import load_spec
    from sealstream.distributed import __all__ as names

    spec = _story_spec(tmp_path, "tumbling")
    plain = load_spec(spec)
    spec.write_text(spec.read_text().replace('name = "story"', 'name = "story"\nworkers = 2'))
    scaled = load_spec(spec)
    assert (plain.workers, scaled.workers) == (None, 2)
    assert plain.fingerprint() == scaled.fingerprint()
    assert sorted(names) == names


def test_a_partition_changed_since_the_checkpoint_is_reported_by_its_worker(
        ray_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sealstream.cli import main

    spec = _story_spec(tmp_path, "tumbling")
    job = _job(spec, 2, stop_when=lambda j: True)
    job.run()
    p0 = tmp_path / "in" / "p0.jsonl"
    p0.write_text("\n".join(p0.read_text().splitlines()[:5]) + "\n")  # shrunk
    capsys.readouterr()
    assert main(["run", str(spec), "--quiet", "--workers", "2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "in/p0.jsonl" in err[0], err


def test_a_followed_source_runs_on_workers_and_resumes_with_another_count(
        ray_cluster: Any, tmp_path: Path) -> None:
    """A live source (files followed as they grow, stop = "end") is read by the
    coordinator's recorded steps and its state sharded: with 2 workers, then (after
    lines are appended and a new file appears) resumed with 3, the output is that of
    one process doing the same."""
    from scenarios._live_story import files_spec
    from sealstream.cli import main

    def lines(first: int, n: int, part: int) -> str:
        return "".join(json.dumps({"user": f"u{(i * 7 + part) % 13}", "ts": 100 * i + part,
                                   "amount": i % 5}) + "\n" for i in range(first, first + n))

    outputs = []
    for workers in (None, 2):
        d = tmp_path / f"w{workers}"
        (d / "in").mkdir(parents=True)
        (d / "spec.toml").write_text(files_spec("end"))
        for part in range(2):
            (d / "in" / f"p{part}.jsonl").write_text(lines(0, 200, part))
        cwd = os.getcwd()
        os.chdir(d)
        try:
            extra = [] if workers is None else ["--workers", str(workers)]
            assert main(["run", "spec.toml", "--quiet", *extra]) == 0
            for part in range(2):
                with (d / "in" / f"p{part}.jsonl").open("a") as f:
                    f.write(lines(200, 150, part))
            (d / "in" / "p2.jsonl").write_text(lines(300, 100, 2))
            extra = [] if workers is None else ["--workers", str(workers + 1)]
            assert main(["run", "spec.toml", "--quiet", *extra]) == 0
        finally:
            os.chdir(cwd)
        outputs.append([sorted(json.dumps(r, sort_keys=True) for r in read_jsonl_dir(d / sub))
                        for sub in ("out", "late")])
    assert outputs[0][0] and outputs[0] == outputs[1]


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_without_ray_address_a_run_starts_its_own_ray_beside_another_one(
        ray_cluster: Any, tmp_path: Path, reference: Any) -> None:
    """``--workers 2`` without ``--ray`` while another Ray runs on the machine (this
    test session's cluster): the run starts a local Ray of its own (it neither joins
    nor trips over the other one, as Ray's default address lookup would), gives the
    single-process output, and leaves none of the processes it started behind."""
    ref = reference(window=WINDOWS["tumbling"], **STORY)
    d = tmp_path / "dist"
    spec = _story_spec(d, "tumbling")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sealstream", "run", str(spec), "--quiet", "--workers", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    started: set[int] = set()
    try:
        while proc.poll() is None:  # the processes its local Ray starts, as they come
            started |= _descendants(proc.pid)
            time.sleep(0.05)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert started, "the run started no process of its own"
    assert_same_dirs(d, ref)
    deadline = time.monotonic() + 120  # a generous bound for Ray's shutdown to finish
    while any(_running(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {p for p in started if _running(p)}
    assert not left, f"processes of the run's Ray left running: {sorted(left)}"


def test_kafka_outputs_with_workers_and_a_lost_worker(
        ray_cluster: Any, kafka: Any, tmp_path: Path, reference: Any) -> None:
    """Results, late events and bad records into Kafka topics (the sinks stay on the
    coordinator) from 2 workers, one of them SIGKILLed after a randomly drawn step:
    the job restarts every worker from the newest checkpoint, the sinks recover from
    what the topics hold, and each topic read ``read_committed`` equals the
    single-process run's output exactly once. Then a rerun with 3 workers produces
    nothing more."""
    scenarios = str(Path(__file__).resolve().parents[1] / "scenarios")
    if scenarios not in sys.path:  # _kafka_story imports _story as its neighbour
        sys.path.append(scenarios)
    from _kafka_story import assert_topics_match, kafka_spec

    ref = reference(window=WINDOWS["tumbling"], errors=True, bad_every=97,
                  **STORY)
    d = tmp_path / "dist"
    names = make_input(d, events=STORY["events"], bad_every=97)
    spec = write_spec(d, names, window=WINDOWS["tumbling"], errors=True,
                      every_events=STORY["every_events"], batch_size=STORY["batch_size"])
    topics = kafka_spec(spec, kafka.bootstrap)
    rng = random.Random(5)
    kill = KillAt(rng, steps=STORY["events"] // STORY["batch_size"])
    job = _job(spec, 2, progress=kill)
    job.run()
    assert kill.killed and job.restarts == 1
    assert_topics_match(kafka.bootstrap, topics, ref)
    _job(spec, 3).run()
    assert_topics_match(kafka.bootstrap, topics, ref)
