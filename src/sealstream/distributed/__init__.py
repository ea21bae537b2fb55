"""Scale-out: one job over N Ray workers (``sealstream run SPEC --workers N``).

See docs/scale-out.md. Importing this package does not import Ray; running a
:class:`DistributedJob` does.
"""

from __future__ import annotations

from sealstream.distributed._cluster import ClusterError
from sealstream.distributed._shard import ROUTING, WorkerLostError
from sealstream.distributed.job import DEFAULT_MAX_RESTARTS, DistributedJob

__all__ = ["ClusterError", "DEFAULT_MAX_RESTARTS", "DistributedJob", "ROUTING", "WorkerLostError"]
