"""The user-facing pipeline definition and the TOML spec loader.

A package: :mod:`.model` (the frozen definition, aggregates, fingerprint and its
diff), :mod:`.source` (where events come from), :mod:`.validate` (checks naming
the first bad setting), :mod:`.spec` (the TOML loader) and :mod:`.join` (several
sources and their windowed join, docs/joins.md).

A :class:`Pipeline` is a frozen description: source -> watermark -> window ->
aggregates -> sink, with optional late and error outputs and checkpoints. The
TOML spec (``sealstream run SPEC.toml``) loads into exactly these objects.

Example::

    >>> from sealstream import Pipeline, FileSource, Tumbling, Output
    >>> p = Pipeline(
    ...     name="payments",
    ...     source=FileSource(kind="jsonl", paths=("in/p0.jsonl",), key="user", time="ts"),
    ...     window=Tumbling(size_ms=60_000),
    ...     aggregates={"n": "count", "total": "sum(amount)"},
    ...     sink=Output(kind="jsonl", path="out"),
    ... )
    >>> p.window.kind
    'tumbling'
"""

from sealstream.pipeline.join import Join
from sealstream.pipeline.kafka import KafkaSourceSpec
from sealstream.pipeline.model import (
    ABSENT,
    AGGREGATE_FUNCTIONS,
    DEFAULT_BATCH_SIZE,
    NUMERIC_FUNCTIONS,
    RESERVED_OUTPUT_NAMES,
    STATE_FORMAT_VERSION,
    WARN_BAD_RATIO,
    Aggregate,
    Checkpoints,
    Output,
    Pipeline,
    Session,
    Sliding,
    Tumbling,
    Watermark,
    Window,
    WindowKind,
    definition_changes,
    definition_diff,
    parse_aggregate,
)
from sealstream.pipeline.nats import NatsSourceSpec
from sealstream.pipeline.source import FileSource, SourceKind, Sources, SourceTransform
from sealstream.pipeline.spec import (
    load_spec,
    pipeline_from_dict,
    with_batch_size,
    with_max_age,
    with_require_receipts,
    with_workers,
)
from sealstream.pipeline.validate import (
    MAX_SETTING,
    check_bad_ratio,
    check_max_age,
    validate,
)

__all__ = [
    "ABSENT",
    "AGGREGATE_FUNCTIONS",
    "Aggregate",
    "Checkpoints",
    "DEFAULT_BATCH_SIZE",
    "FileSource",
    "Join",
    "KafkaSourceSpec",
    "MAX_SETTING",
    "NUMERIC_FUNCTIONS",
    "NatsSourceSpec",
    "Output",
    "Pipeline",
    "RESERVED_OUTPUT_NAMES",
    "STATE_FORMAT_VERSION",
    "Session",
    "Sliding",
    "SourceKind",
    "SourceTransform",
    "Sources",
    "Tumbling",
    "WARN_BAD_RATIO",
    "Watermark",
    "Window",
    "WindowKind",
    "check_bad_ratio",
    "check_max_age",
    "definition_changes",
    "definition_diff",
    "load_spec",
    "parse_aggregate",
    "pipeline_from_dict",
    "validate",
    "with_batch_size",
    "with_max_age",
    "with_require_receipts",
    "with_workers",
]
