"""sealstream: event-time windowed stream processing with verifiable, exactly-once checkpoints.

>>> import sealstream
>>> sorted(sealstream.__all__)[:3]
['BadRecordError', 'CheckpointError', 'Checkpoints']
"""

from __future__ import annotations

from sealstream._runtime.engine import Job, RunSummary
from sealstream.errors import (
    BadRecordError,
    CheckpointError,
    LockHeldError,
    NoValidCheckpointError,
    SealstreamError,
    SinkError,
    SourceChangedError,
    SourceError,
    SpecError,
)
from sealstream.pipeline import (
    Checkpoints,
    FileSource,
    Output,
    Pipeline,
    Session,
    Sliding,
    Tumbling,
    Watermark,
    load_spec,
)

__version__ = "0.1.0"


def run(pipeline: Pipeline, *, start_over: bool = False) -> RunSummary:
    """Run ``pipeline`` to the end of its input, resuming from its checkpoints.

    Raises a :class:`SealstreamError` subclass on failure; committed output and
    checkpoints are never lost.
    """
    return Job(pipeline, start_over=start_over).run()


__all__ = [
    "BadRecordError",
    "CheckpointError",
    "Checkpoints",
    "FileSource",
    "Job",
    "LockHeldError",
    "NoValidCheckpointError",
    "Output",
    "Pipeline",
    "RunSummary",
    "SealstreamError",
    "Session",
    "SinkError",
    "Sliding",
    "SourceChangedError",
    "SourceError",
    "SpecError",
    "Tumbling",
    "Watermark",
    "__version__",
    "load_spec",
    "run",
]
