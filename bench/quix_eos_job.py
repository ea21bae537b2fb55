"""The Quix Streams peer of ``bench.kafka_eos`` (run in its own venv, which has
quixstreams; it does not import sealstream): a tumbling one-minute window with count
and sum per key, exactly-once, from ``IN`` to ``OUT``; prints its wall time as JSON.

    python bench/quix_eos_job.py BOOTSTRAP IN OUT GROUP STATE_DIR IDLE_S
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def main() -> int:
    from quixstreams import Application
    from quixstreams.dataframe.windows import Count, Sum

    bootstrap, src, dst, group, state_dir, idle = sys.argv[1:7]
    app = Application(broker_address=bootstrap, consumer_group=group,
                      auto_offset_reset="earliest", processing_guarantee="exactly-once",
                      state_dir=state_dir, loglevel="WARNING")

    def event_time(value: Any, headers: Any, timestamp: int, kind: Any) -> int:
        return int(value["ts"])

    t_in = app.topic(src, value_deserializer="json", key_deserializer="str",
                     timestamp_extractor=event_time)
    t_out = app.topic(dst, value_serializer="json", key_serializer="str")
    sdf = app.dataframe(t_in)
    sdf = sdf.tumbling_window(duration_ms=60_000, grace_ms=5_000).agg(
        n=Count(), total=Sum("amount")).final()
    sdf.to_topic(t_out)
    t0 = time.perf_counter()
    app.run(timeout=float(idle))
    print(json.dumps({"seconds": time.perf_counter() - t0}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
