"""The raw-event archive on a real nats-server (JetStream): a job killed after steps
it has not checkpointed yet; while it is stopped the stream is purged below every
sequence it read; the resume reads those from the archive, then the stream, and the
output is exactly the files' output."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from _archive_story import (
    files_source,
    highest_read,
    newest_checkpoint_step,
    outcome,
    recorded_steps,
    run,
    write_spec,
)

from sealstream.testing.datagen import generate

pytest.importorskip("nats")


def _js(url: str, fn: Any) -> Any:
    import nats

    async def go() -> Any:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=5)
        try:
            return await fn(nc.jetstream(timeout=10))
        finally:
            await nc.close()

    return asyncio.run(go())


def test_resume_reads_purged_sequences_from_the_archive(nats_server: Any,
                                                          tmp_path: Path) -> None:
    from nats.js.api import StreamConfig

    url = str(nats_server.url)  # type: ignore[attr-defined]
    stream = f"A{uuid.uuid4().hex[:10]}"
    subjects = [f"{stream.lower()}.p{i}" for i in range(2)]
    files = generate(tmp_path / "data", events=120, keys=4, partitions=2, seed=3,
                     late_fraction=0.05, bad_fraction=0.05)

    line_of: dict[tuple[int, int], int] = {}  # (partition, stream sequence) -> file offset

    async def setup(js: Any) -> None:
        await js.add_stream(StreamConfig(name=stream, subjects=subjects))
        lines = [[(k, ln) for k, ln in enumerate(f.read_bytes().split(b"\n")) if ln]
                 for f in files]
        for i in range(max(map(len, lines))):  # the subjects interleaved in the stream
            for p, (s, ls) in enumerate(zip(subjects, lines, strict=True)):
                if i < len(ls):
                    ack = await js.publish(s, ls[i][1])
                    line_of[(p, int(ack.seq))] = ls[i][0]

    _js(url, setup)
    d = tmp_path / "job"
    source = (f'kind = "nats"\nservers = "{url}"\nstream = "{stream}"\n'
              f'subjects = {json.dumps(subjects)}\nstop = "end"')
    spec = write_spec(d, source, every=40)
    r = run(spec, crash_at="batch:9")
    assert r.returncode == -9, r.stderr
    assert recorded_steps(d / "ckpt")[-1] > newest_checkpoint_step(d / "ckpt")
    below = min(highest_read(d / "ckpt").values())

    async def purge(js: Any) -> int:
        await js.purge_stream(stream, seq=below)
        return int((await js.stream_info(stream)).state.first_seq)

    assert _js(url, purge) == below  # every sequence below it is gone
    bare = tmp_path / "bare"  # without the archive, the resume is refused
    shutil.copytree(d, bare)
    write_spec(bare, source, every=40, archive=None)
    refused = run(bare / "spec.toml")
    assert refused.returncode == 1 and "no longer" in refused.stderr, refused.stderr
    r = run(spec)
    assert r.returncode == 0, r.stderr
    ref = tmp_path / "files"
    assert run(write_spec(ref, files_source(files), archive=None)).returncode == 0
    got, want = outcome(d), outcome(ref)
    assert got["results"] == want["results"]
    for role in ("late", "errors"):  # positions are stream sequences here, lines there
        assert sorted((p, line_of[(p, seq)]) for p, seq in got[role]) == want[role], role
