"""sealstream: event-time windowed stream processing with verifiable, exactly-once checkpoints.

>>> import sealstream
>>> sorted(sealstream.__all__)[:3]
['BadRecordError', 'CheckpointError', 'Checkpoints']

The engine's names (``Pipeline``, ``Job``, ``load_spec``, ...) are imported on
first use (module ``__getattr__``): ``import sealstream`` and the command line's
``--help``/``--version`` do not load Polars, PyArrow or NumPy.
"""

from __future__ import annotations

from importlib import import_module
from os import PathLike, fspath
from typing import TYPE_CHECKING, Any

from sealstream.errors import (
    BadRecordError,
    CheckpointError,
    LockHeldError,
    NoValidCheckpointError,
    SealstreamError,
    SinkError,
    SourceChangedError,
    SourceError,
    SourceExpiredError,
    SourceUnavailableError,
    SpecError,
)

if TYPE_CHECKING:
    from sealstream._runtime.engine import Job, RunSummary
    from sealstream.enrich import Enrich
    from sealstream.pipeline import (
        Checkpoints,
        FileSource,
        Join,
        KafkaSourceSpec,
        NatsSourceSpec,
        Output,
        Pipeline,
        Session,
        Sliding,
        Sources,
        SourceTransform,
        Tumbling,
        Watermark,
        load_spec,
    )

__version__ = "0.1.0"

#: re-exported name -> the module that defines it, imported on first access
_LAZY = {
    "Checkpoints": "sealstream.pipeline",
    "Enrich": "sealstream.enrich",
    "FileSource": "sealstream.pipeline",
    "Job": "sealstream._runtime.engine",
    "Join": "sealstream.pipeline",
    "KafkaSourceSpec": "sealstream.pipeline",
    "NatsSourceSpec": "sealstream.pipeline",
    "Output": "sealstream.pipeline",
    "Pipeline": "sealstream.pipeline",
    "RunSummary": "sealstream._runtime.engine",
    "Session": "sealstream.pipeline",
    "Sliding": "sealstream.pipeline",
    "Sources": "sealstream.pipeline",
    "SourceTransform": "sealstream.pipeline",
    "Tumbling": "sealstream.pipeline",
    "Watermark": "sealstream.pipeline",
    "load_spec": "sealstream.pipeline",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sealstream' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def run(pipeline: Pipeline | str | PathLike[str], *, start_over: bool = False) -> RunSummary:
    """Run ``pipeline`` (a :class:`Pipeline`, or the path of a TOML spec) to the end
    of its input, resuming from its checkpoints.

    Raises a :class:`SealstreamError` subclass on failure; committed output and
    checkpoints are never lost.
    """
    from sealstream._runtime.engine import Job
    from sealstream.pipeline import Pipeline, load_spec

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
    "Enrich",
    "FileSource",
    "Job",
    "Join",
    "KafkaSourceSpec",
    "LockHeldError",
    "NatsSourceSpec",
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
    "SourceExpiredError",
    "SourceTransform",
    "SourceUnavailableError",
    "Sources",
    "SpecError",
    "Tumbling",
    "Watermark",
    "__version__",
    "load_spec",
    "run",
]
