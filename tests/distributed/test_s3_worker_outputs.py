"""`--workers` with results, late events and bad records under ``s3://`` prefixes:
each worker stages its own part object per epoch (``.part-<epoch>-<run>w<i>.jsonl
.inprogress``), the manifest names them, each worker publishes its own after the
manifest; a coordinator SIGKILLed between the workers' commits is recovered exactly
once and no staging object is left.

The workers reach the store with the credentials of their own node's standard AWS
chain, never sent through Ray: this module's Ray cluster is started after its S3
server, with the server's ``AWS_*`` variables in the cluster's environment (its own
cluster: the session one started without them). The test process (coordinator) gets
them per test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _ray_nodes import NODE

from scenarios._story import assert_same_output as assert_same_dirs
from scenarios._story import make_input, run, write_spec

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
if str(SCENARIOS) not in sys.path:  # _kafka_story imports _story as its neighbour
    sys.path.append(str(SCENARIOS))

from _kafka_story import kafka_source_spec, produce_input  # noqa: E402

WINDOW = 'kind = "tumbling"\nsize_ms = 2000\nallowed_lateness_ms = 500'
STORY = {"events": 900, "every_events": 300, "batch_size": 100, "bad_every": 97,
         "errors": True}
SUBS = ("out", "late", "errors")


@pytest.fixture(scope="module")
def s3_ray() -> Iterator[tuple[Any, Any]]:
    """(a SeaweedFS server, a Ray cluster whose processes have its ``AWS_*``)."""
    pytest.importorskip("boto3", reason="the S3 tests need boto3")
    import ray
    from ray.cluster_utils import Cluster

    from sealstream.distributed._shard import drain_pool
    from sealstream.testing.brokers import SeaweedServer

    earlier = ray.get_runtime_context().gcs_address if ray.is_initialized() else None
    # each step is undone whatever fails after it (a cluster that does not start at a
    # high load, say): no server or cluster outlives the module
    with contextlib.ExitStack() as undo:
        server = undo.enter_context(SeaweedServer())
        if earlier is not None:
            drain_pool()  # idle worker actors of the session cluster: not reusable here
            ray.shutdown()  # this process leaves the session cluster (it keeps running)
            undo.callback(ray.init, address=earlier, log_to_driver=False,
                          configure_logging=False)
        saved = {k: os.environ.get(k) for k in server.env()}
        os.environ.update(server.env())  # inherited by the cluster's raylet and workers
        try:
            cluster = Cluster(initialize_head=True, head_node_args=dict(NODE))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        undo.callback(cluster.shutdown)
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        undo.callback(ray.shutdown)
        undo.callback(drain_pool)  # this cluster's idle workers: gone with it
        yield server, cluster


def _story(d: Path, server: Any, kafka: tuple[str, str] | None = None) -> tuple[Path, str]:
    """The story's spec in ``d`` with its outputs under a fresh ``s3://`` prefix;
    ``kafka``: (bootstrap, topic) to read instead of the files."""
    names = make_input(d, events=STORY["events"], bad_every=STORY["bad_every"])
    spec = write_spec(d, names, window=WINDOW, every_events=STORY["every_events"],
                      batch_size=STORY["batch_size"], errors=True)
    if kafka is not None:
        kafka_source_spec(spec, *kafka)
    prefix = f"wparts-{uuid.uuid4().hex[:12]}"
    text = spec.read_text()
    for sub in SUBS:
        assert f'path = "{sub}"' in text, sub
        text = text.replace(f'path = "{sub}"', f'path = "s3://{server.bucket}/{prefix}/{sub}"')
    spec.write_text(text)
    return spec, prefix


def _objects(server: Any, prefix: str, sub: str) -> Any:
    from sealstream._objects.s3 import S3Objects

    return S3Objects(server.bucket, f"{prefix}/{sub}", server.endpoint)


def _download(server: Any, prefix: str, into: Path) -> None:
    """Every object of the outputs into ``into/<sub>/``: no staging object is left."""
    for sub in SUBS:
        objects = _objects(server, prefix, sub)
        keys = objects.keys()
        assert not [k for k in keys if k.startswith(".part-")], f"{sub}: staging left {keys}"
        (into / sub).mkdir(parents=True)
        for key in keys:
            data = objects.get(key)
            assert data is not None
            (into / sub / key).write_bytes(data)


def _env(monkeypatch: pytest.MonkeyPatch, server: Any) -> None:
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)


def test_worker_nodes_without_credentials_fail_in_one_line(
        ray_cluster: Any, s3_server: Any, tmp_path: Path) -> None:
    """The session Ray cluster was started without the server's ``AWS_*``: the
    coordinator has them, its workers do not, and none are sent through Ray. The run
    stops with exit 1 and one line naming the output, no secret in it. (First in this
    file: the session cluster is connected before this module's own.)"""
    spec, _ = _story(tmp_path, s3_server)
    env = dict(os.environ, **s3_server.env())
    proc = subprocess.run(
        [sys.executable, "-m", "sealstream", "run", str(spec), "--quiet", "--workers", "2",
         "--ray", ray_cluster.address],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, timeout=600)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "no AWS credentials found" in lines[0] and f"s3://{s3_server.bucket}/" in lines[0]
    assert s3_server.secret_key not in proc.stderr


def test_two_workers_stage_their_own_part_objects(
        s3_ray: tuple[Any, Any], tmp_path: Path, reference: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Results, late events and bad records in S3 with 2 workers: every committed
    object is a worker's own (``...w0``/``...w1``; the coordinator staged none) and
    the outputs equal one process's."""
    from sealstream import load_spec
    from sealstream.distributed import DistributedJob

    server, _ = s3_ray
    _env(monkeypatch, server)
    ref = reference(window=WINDOW, **STORY)
    d = tmp_path / "dist"
    spec, prefix = _story(d, server)
    DistributedJob(load_spec(spec), workers=2).run()
    _download(server, prefix, d / "got")
    for sub in SUBS:
        names = sorted(p.name for p in (d / "got" / sub).glob("part-*"))
        assert names, sub
        runs = {n.rsplit(".", 1)[0].rsplit("-", 1)[1] for n in names}
        assert all(r[-2:] in ("w0", "w1") for r in runs), (sub, runs)
    assert any(n.endswith("w0.jsonl") for n in os.listdir(d / "got" / "out"))
    assert any(n.endswith("w1.jsonl") for n in os.listdir(d / "got" / "out"))
    assert_same_dirs(d / "got", ref)


def test_coordinator_killed_between_worker_commits(
        s3_ray: tuple[Any, Any], tmp_path: Path, reference: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``run --workers 2`` SIGKILLs itself after worker 0 published its part object of
    an epoch, before worker 1 did (the manifest naming it is published): worker 1's
    object is still staged. The resume commits it, deletes every other staging
    object, and every row is there exactly once."""
    from sealstream import load_spec
    from sealstream.distributed import DistributedJob

    server, cluster = s3_ray
    _env(monkeypatch, server)
    ref = reference(window=WINDOW, **STORY)
    d = tmp_path / "dist"
    spec, prefix = _story(d, server)
    env = dict(os.environ, SEALSTREAM_CRASH_AT="after_commit_worker_part:3")
    proc = subprocess.run(
        [sys.executable, "-m", "sealstream", "run", str(spec), "--quiet", "--workers", "2",
         "--ray", cluster.address],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    staged = [k for k in _objects(server, prefix, "out").keys(".part-")
              if k.endswith("w1.jsonl.inprogress")]
    assert staged, "worker 1's part object of the epoch should still be staged"
    job = DistributedJob(load_spec(spec), workers=2)
    job.run()
    assert job.resumed_from is not None
    _download(server, prefix, d / "got")
    final = staged[0][1:-len(".inprogress")]
    assert final in os.listdir(d / "got" / "out")
    assert_same_dirs(d / "got", ref)


def test_kafka_source_two_workers_stage_their_own_part_objects(
        s3_ray: tuple[Any, Any], kafka: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 3-partition Kafka topic read by 2 workers (the live path): results, late
    events and bad records in S3 are staged by the workers and equal one process's
    (outputs in local directories)."""
    from sealstream import load_spec
    from sealstream.distributed import DistributedJob

    server, _ = s3_ray
    ref = tmp_path / "ref"
    names = make_input(ref, events=STORY["events"], bad_every=STORY["bad_every"])
    topic = produce_input(kafka.bootstrap, ref, names)
    spec = write_spec(ref, names, window=WINDOW, every_events=STORY["every_events"],
                      batch_size=STORY["batch_size"], errors=True)
    kafka_source_spec(spec, kafka.bootstrap, topic)
    res = run(spec)
    assert res.returncode == 0, res.stderr
    _env(monkeypatch, server)
    d = tmp_path / "dist"
    spec, prefix = _story(d, server, (kafka.bootstrap, topic))
    job = DistributedJob(load_spec(spec), workers=2)
    job.run()
    assert job.counters.late_events > 0 and job.counters.bad_records > 0
    assert sum(job.merger.output_bytes) == 0  # no output row crossed the coordinator
    _download(server, prefix, d / "got")
    for sub in SUBS:
        for i in range(2):
            assert list((d / "got" / sub).glob(f"part-*w{i}.jsonl")), (sub, i)
    assert_same_dirs(d / "got", ref)
