"""Scale-out determinism beyond tests/distributed/: session windows with late events
and bad records, three partitions (a weighted key routing on 2 workers, plain on 3),
one checkpoint chain run by 2 workers, then 3, then 1 process, then to the end by one
process: the output (results, late events, bad records) is one process's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scenarios._story import assert_same_output, make_input, write_spec

SESSION = 'kind = "session"\ngap_ms = 1500\nallowed_lateness_ms = 200'
STORY: dict[str, Any] = {"events": 1500, "every_events": 300, "batch_size": 100,
                         "errors": True, "bad_every": 97}


def test_sessions_late_and_bad_records_across_2_3_1(ray_cluster: Any, tmp_path: Path,
                                                     reference: Any) -> None:
    from sealstream import Job, load_spec
    from sealstream.distributed import DistributedJob

    ref = reference(window=SESSION, **STORY)
    d = tmp_path / "dist"
    names = make_input(d, events=STORY["events"], bad_every=STORY["bad_every"])
    spec = write_spec(d, names, window=SESSION, every_events=STORY["every_events"],
                      batch_size=STORY["batch_size"], errors=True)
    for workers in (2, 3, None):
        pipeline = load_spec(spec)
        job = (Job(pipeline, stop_when=lambda j: True) if workers is None
               else DistributedJob(pipeline, workers=workers, stop_when=lambda j: True))
        job.run()
        assert job.stopped_early
    Job(load_spec(spec)).run()
    assert_same_output(d, ref)
