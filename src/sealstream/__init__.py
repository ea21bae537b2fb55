"""sealstream: event-time windowed stream processing with verifiable, exactly-once checkpoints.

>>> import sealstream
>>> sorted(sealstream.__all__)[:3]
['BadRecordError', 'CheckpointError', 'Checkpoints']
"""

from __future__ import annotations

from os import PathLike, fspath

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


def run(pipeline: Pipeline | str | PathLike[str], *, start_over: bool = False) -> RunSummary:
    """Run ``pipeline`` (a :class:`Pipeline`, or the path of a TOML spec) to the end
    of its input, resuming from its checkpoints.

    Raises a :class:`SealstreamError` subclass on failure; committed output and
    checkpoints are never lost.
    """
    if isinstance(pipeline, str | PathLike):
        pipeline = load_spec(fspath(pipeline))
    if not isinstance(pipeline, Pipeline):
        raise SpecError(f"run: expected a Pipeline or a spec path, got "
                        f"{type(pipeline).__name__}")
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
