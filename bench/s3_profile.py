"""Where a run's S3 requests go: every request of one ``sealstream run`` with its
checkpoints in S3 (a local SeaweedFS), counted and timed by operation, by thread
(the engine's processing thread vs the checkpoint writer) and by the sealstream
function that asked for it.

    python -m bench.s3_profile [--events N] [--keys N]

The run is in this process (``sealstream.cli.main``), with botocore's
``_make_api_call`` wrapped; nothing else changes. The requests are counted on
botocore, so the run sends them through botocore (``SEALSTREAM_S3_CLIENT=botocore``,
set for the run and put back after): with the credentials in the environment they
would otherwise go through obstore, which this profile does not see. What the
processing thread spends in S3 is what stands between the engine and the directory
store's speed: the checkpoint writer's requests overlap the next epoch.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "work" / "s3_profile"

_SKIP = ("_call", "_make_api_call", "_api_call", "create", "get", "keys", "head", "delete",
         "replace", "read_versioned", "_multipart", "_raw", "_bounded", "_keys", "copy",
         "_create", "_upload_part", "_part", "run", "_worker")


def _caller() -> str:
    """The innermost sealstream function that is not plumbing of the object layer."""
    names = [f.name for f in traceback.extract_stack()
             if "sealstream" in f.filename and "/bench/" not in f.filename]
    picked = [n for n in names if n not in _SKIP]
    return ">".join(picked[-2:]) if picked else "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.s3_profile",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=400_000)
    ap.add_argument("--keys", type=int, default=10_000)
    args = ap.parse_args(argv)

    import botocore.client

    from sealstream.cli import main as cli_main
    from sealstream.testing.brokers import SeaweedServer
    from sealstream.testing.datagen import generate
    from sealstream.testing.specs import files_source, spec_text

    data = WORK.parent.parent / "data" / f"stores-{args.events}ev-{args.keys}k"
    files = [data / f"p{i}.jsonl" for i in range(3)]
    if not all(f.is_file() for f in files):
        generate(data, events=args.events, keys=args.keys, partitions=3, disorder_ms=2000,
                 seed=7)
    from sealstream._objects.s3 import S3Objects

    calls: list[tuple[str, str, str, float]] = []
    lock = threading.Lock()
    original = botocore.client.BaseClient._make_api_call
    built: list[tuple[str, float, float]] = []  # the S3 clients: thread, wall, CPU (s)
    make_client = S3Objects._make_client

    def timed_make(self: Any) -> Any:
        fresh = self._client is None
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return make_client(self)
        finally:
            if fresh:
                built.append((threading.current_thread().name.split("_")[0],
                              time.perf_counter() - t0, time.thread_time() - c0))

    def timed(self: Any, operation: str, params: Any) -> Any:
        who, thread = _caller(), threading.current_thread().name
        t0 = time.perf_counter()
        try:
            return original(self, operation, params)
        finally:
            with lock:
                calls.append((operation, thread.split("_")[0], who, time.perf_counter() - t0))

    with SeaweedServer() as server:
        os.environ.update(server.env())
        before = os.environ.get("SEALSTREAM_S3_CLIENT")
        os.environ["SEALSTREAM_S3_CLIENT"] = "botocore"  # the client counted here
        wd = WORK / uuid.uuid4().hex[:6]
        wd.mkdir(parents=True)
        url = f"s3://{server.bucket}/profile-{uuid.uuid4().hex[:8]}"
        (wd / "spec.toml").write_text(spec_text(
            "bench_s3_profile", files_source(files), batch_size=100000, max_delay_ms=2000,
            sink='kind = "jsonl"\npath = "out"', checkpoint=f"url = {json.dumps(url)}",
            every_ms=1000, keep=3))
        botocore.client.BaseClient._make_api_call = timed
        S3Objects._make_client = timed_make
        t0 = time.perf_counter()
        try:
            code = cli_main(["run", str(wd / "spec.toml"), "--quiet", "--summary-json",
                             str(wd / "summary.json")])
        finally:
            botocore.client.BaseClient._make_api_call = original
            S3Objects._make_client = make_client
            if before is None:
                os.environ.pop("SEALSTREAM_S3_CLIENT", None)
            else:
                os.environ["SEALSTREAM_S3_CLIENT"] = before
        wall = time.perf_counter() - t0
    summary = json.loads((wd / "summary.json").read_text())
    count = summary.get("checkpoints", {}).get("count") or 0
    print(f"exit {code}; {wall:.2f} s; {count} checkpoints; {len(calls)} requests, "
          f"{sum(c[3] for c in calls):.2f} s (load average {os.getloadavg()[0]:.1f})")
    for thread, wall_s, cpu_s in built:
        print(f"S3 client built on {thread}: {wall_s:.3f} s, {cpu_s:.3f} s of CPU (botocore "
              "imported before the run: its import is not counted here)")
    by: dict[tuple[str, str, str], list[float]] = collections.defaultdict(list)
    for op, thread, who, dt in calls:
        by[(thread, op, who)].append(dt)
    print("| thread | request | asked by | n | total (s) | mean (ms) |")
    print("|---|---|---|---:|---:|---:|")
    for (thread, op, who), dts in sorted(by.items(), key=lambda kv: -sum(kv[1])):
        print(f"| {thread} | {op} | {who} | {len(dts)} | {sum(dts):.3f} | "
              f"{1000 * sum(dts) / len(dts):.1f} |")
    per_thread: dict[str, float] = collections.defaultdict(float)
    for _, thread, _, dt in calls:
        per_thread[thread] += dt
    print("per thread (s):", {k: round(v, 3) for k, v in per_thread.items()})
    return code


if __name__ == "__main__":
    sys.exit(main())
