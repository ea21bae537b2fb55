"""One exception tree for sealstream.

::

    SealstreamError                 base; never raised directly
    ├── SpecError                   the pipeline definition is wrong (exit 2)
    ├── SourceError                 the input cannot be read as promised (exit 1)
    │   ├── BadRecordError          a record is bad and there is no [errors] output
    │   ├── SourceChangedError      a partition no longer matches its checkpoint
    │   ├── SourceExpiredError      a position to read was deleted by the broker's retention
    │   └── SourceUnavailableError  the broker cannot be reached within the retry deadline
    ├── SinkError                   an output cannot be written or committed (exit 1)
    └── CheckpointError             checkpoints cannot be written, read or trusted (exit 1)
        ├── NoValidCheckpointError  checkpoints exist but none verifies
        └── LockHeldError           another run holds the checkpoint directory

Every error carries a one-line message that names what is wrong (the setting and
its bad value, or the file and line at fault) and, where it helps, what to do.
The command line prints ``str(error)`` and exits with ``error.exit_code``.
"""

from __future__ import annotations


class SealstreamError(Exception):
    """Base of every error sealstream raises on purpose."""

    exit_code = 1


class SpecError(SealstreamError):
    """The pipeline definition is invalid: fix the named setting. Exit code 2."""

    exit_code = 2


class SourceError(SealstreamError):
    """The input cannot be read: a file vanished, is unreadable, or is malformed."""


class BadRecordError(SourceError):
    """A record cannot be used and the pipeline has no ``[errors]`` output.

    The message names the file and the 1-based line (or row). Add an ``[errors]``
    output to divert bad records instead of stopping.
    """


class SourceChangedError(SourceError):
    """A source partition no longer holds the data a checkpoint refers to.

    The file shrank, was replaced or rotated. Replay from an earlier position
    into an isolated destination instead of resuming.
    """


class SourceExpiredError(SourceError):
    """Records a run must read were deleted before it read them (retention).

    Raised at start/resume when a saved position is below the earliest position
    the broker still retains, and mid-run when records disappear before they are
    read. The message names the partition, the saved (or next) position and the
    earliest available one, and the ways forward: replay from the earliest
    position into a new destination (``sealstream replay --from``), or
    ``--start-over``. Nothing is ever skipped silently. Exit code 1.
    """


class SourceUnavailableError(SourceError):
    """The broker (or file system) behind a source cannot be reached.

    Raised at start after a bounded retry, and mid-run once ``[source]
    fail_after_ms`` has passed without reaching it; the message names the
    address. What was committed before stays committed. Exit code 1.
    """


class SinkError(SealstreamError):
    """An output could not be written, prepared or committed."""


class CheckpointError(SealstreamError):
    """A checkpoint could not be written or read."""


class NoValidCheckpointError(CheckpointError):
    """Checkpoints exist but none is ``ATOMIC_CHECKPOINT``; nothing was deleted.

    Inspect them with ``sealstream checkpoints verify DIR``; start over explicitly
    with ``sealstream run SPEC --start-over`` (old checkpoints are moved aside).
    """


class LockHeldError(CheckpointError):
    """Another run holds the checkpoint directory's lock."""
