"""A worker's part of a checkpoint is taken at the step boundary and encoded and
written on the worker's checkpoint thread, beside the next steps (as one process
encodes and writes its checkpoint on a writer thread): the checkpoint does not wait
behind the work already queued on the worker (the next step's reads), and the
manifest, published last, names only parts that are durable.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from test_scale_out import STORY, WINDOWS, _job, _story_spec

from scenarios._story import assert_same_output as assert_same_dirs

#: a bound for what must happen (never reached when it does): the machine is shared
GENEROUS_S = 300


def test_a_checkpoint_part_does_not_wait_behind_the_queued_steps(
        ray_cluster: Any, tmp_path: Path) -> None:
    """The worker's data-plane thread is held by a call that waits for a gate (as the
    next step's read, queued before the checkpoint, holds it): the part is still taken,
    encoded and handed over, on the checkpoint thread; the held call finishes after."""
    import ray

    from sealstream import load_spec
    from sealstream.distributed._shard import acquire, on_ckpt, release
    from sealstream.distributed._worker import to_ipc
    from sealstream.state.codec import decode_table
    from sealstream.windows.operator import WindowOperator

    def gate_task(path: str) -> list[Any]:  # (local: Ray ships it by value)
        """Returns once ``path`` exists (the test creates it when it is done)."""
        while not os.path.exists(path):
            time.sleep(0.02)
        return []

    spec = _story_spec(tmp_path, "tumbling")
    pipeline = load_spec(spec)
    [worker] = acquire(1)
    try:
        ray.get(worker.load.remote(pipeline, 0, to_ipc(WindowOperator(pipeline).snapshot())),
                timeout=GENEROUS_S)
        gate = tmp_path / "gate"
        held = worker.build_records_receipt.remote(
            [ray.remote(num_cpus=0)(gate_task).remote(str(gate))], None)
        rows, open_windows = ray.get(on_ckpt(worker.stage_part).remote({"k": "v"}),
                                     timeout=GENEROUS_S)
        data = ray.get(on_ckpt(worker.take_part).remote(), timeout=GENEROUS_S)
        ready, _ = ray.wait([held], timeout=0)
        assert not ready, "the held call finished before the gate opened"
        assert (rows, open_windows) == (0, 0)
        frame, meta = decode_table(data)
        assert frame.height == 0 and meta == {"k": "v"}
        gate.touch()
        assert ray.get(held, timeout=GENEROUS_S)["count"] == 0
    finally:
        (tmp_path / "gate").touch()
        release([worker], healthy=False)


def test_a_worker_sigkilled_while_the_parts_are_written(
        ray_cluster: Any, tmp_path: Path, reference: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker 1 is SIGKILLed right after the second checkpoint's parts were asked for
    (its part being written on its checkpoint thread, or not yet): no manifest names a
    part that is not there and intact, the run restarts every worker once, and the
    output is exactly the single process's."""
    from sealstream.cli import main
    from sealstream.distributed._shard import ShardedOperator, on_ckpt

    ref = reference(window=WINDOWS["tumbling"], **STORY)
    d = tmp_path / "dist"
    spec = _story_spec(d, "tumbling")
    original = ShardedOperator.write_parts
    calls: list[int] = []
    killed: list[int] = []

    def write_parts(self: ShardedOperator, cid: int, fence: Any, key: bytes | None
                    ) -> list[tuple[str, str, int]]:
        calls.append(cid)
        if len(calls) != 2:
            return original(self, cid, fence, key)
        refs = [on_ckpt(a.write_part).remote(cid, fence, key) for a in self.actors]
        os.kill(self.pids[1], signal.SIGKILL)
        killed.append(self.pids[1])
        return [tuple(r) for r in self._get(refs, "checkpoint part")]

    monkeypatch.setattr(ShardedOperator, "write_parts", write_parts)
    job = _job(spec, 2)
    job.run()
    assert killed and job.restarts == 1
    assert_same_dirs(d, ref)
    manifests = sorted((d / "ckpt").glob("cp-*/MANIFEST.json"))
    assert manifests
    for manifest in manifests:
        doc = json.loads(manifest.read_text())
        parts = {role: e for role, e in doc["files"].items() if role.startswith("part:")}
        assert sorted(parts) == ["part:0", "part:1"]
        for e in parts.values():
            assert (d / "ckpt" / e["path"]).is_file(), e
    assert main(["checkpoints", "verify", str(d / "ckpt")]) == 0
