"""The two-phase sink contract.

Every output (results, late events, bad records) goes through a :class:`Sink`
that stages rows per *epoch* and publishes them only when told to. The
coordinator drives the phases in this order (see
``sealstream._runtime.coordinator``):

1. ``write(epoch, frame)`` any number of times: rows are staged under a name
   that readers ignore (it starts with ``.`` or ``_``).
2. ``prepare(epoch)``: staged data is flushed and fsynced; returns the commit
   tokens (names of what will be published) that the checkpoint records.
3. the checkpoint manifest is published.
4. ``commit(epoch, tokens)``: staged data becomes visible in one atomic step per
   file (rename, then fsync of the directory). Idempotent: committing what is
   already committed does nothing.

On restart, ``recover(tokens)`` commits what the restored checkpoint prepared
and aborts (deletes) every other staged file: no checkpoint refers to it, so
its rows will be produced again by the replay.

Where an output is may change between runs (a new directory in the spec). The
checkpoint records :meth:`Sink.location` next to the tokens of its epoch, and a
restart calls :meth:`Sink.recover_at` with it: the prepared epoch is committed
where it was staged, and new output goes to the new location.

Frames handed to sinks carry a ``__json`` column (the output line as JSON text,
already typed per row) plus identity columns: for results ``key``, ``__kint``,
``window_start``, ``window_end``; for record outputs (late events, bad records)
``_partition`` and ``_offset``. Results also carry one typed column per
aggregate for columnar formats.

With a compound key (``key = ["tenant", "user"]``) ``key`` holds the fields' JSON
after their names (``"tenant":"acme","user":7``) and ``__kint`` is False; a sink
given the fields (its ``key_fields``) writes each under its own name, splitting that
text (:func:`sealstream.sinks._files.split_compound_key`), and rebuilds it exactly
when it reads its identities back.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import polars as pl

SinkRole = Literal["results", "records"]

JSON_LINE = "__json"
RESULT_ID_COLUMNS = ("key", "__kint", "window_start", "window_end")
RECORD_ID_COLUMNS = ("_partition", "_offset")


def id_columns(role: SinkRole) -> tuple[str, ...]:
    return RESULT_ID_COLUMNS if role == "results" else RECORD_ID_COLUMNS


@dataclass(frozen=True)
class CommittedFile:
    """One published unit of output."""

    epoch: int
    token: str
    #: the directory holding it when that is not the sink's own (an earlier path of
    #: the output, see :meth:`Sink.recover_at`); None for the sink's own location
    location: str | None = None


def _nothing() -> None:
    return None


class Sink(ABC):
    """A two-phase, per-epoch output.

    Subclasses must make ``commit`` idempotent and atomic per token, never show
    staged rows to readers, and be able to read back the identities of what
    they committed (used to suppress re-emission after falling back to an
    older checkpoint).
    """

    role: SinkRole

    @abstractmethod
    def write(self, epoch: int, frame: pl.DataFrame) -> None:
        """Stage ``frame``'s rows for ``epoch``."""

    @abstractmethod
    def prepare(self, epoch: int) -> list[str]:
        """Make the epoch's staged rows durable; return its commit tokens (maybe empty)."""

    def prepare_deferred(self, epoch: int) -> tuple[list[str], Callable[[], None]]:
        """:meth:`prepare` in two steps: the tokens now (the epoch takes no more rows),
        and a callable that makes the staged rows durable, which the caller runs
        (on any thread, once) before anything refers to the tokens. Raises like
        :meth:`prepare`, now or from the callable.

        The default prepares everything now; a sink whose durability is a slow
        fsync can defer it, so that a checkpoint's writer thread waits for the
        disk instead of the processing thread.
        """
        return self.prepare(epoch), _nothing

    @abstractmethod
    def commit(self, epoch: int, tokens: list[str]) -> None:
        """Publish the prepared tokens of ``epoch`` atomically; idempotent."""

    @abstractmethod
    def recover(self, prepared: dict[int, list[str]]) -> None:
        """Commit ``prepared`` (epoch -> tokens) if still staged; abort all other staging."""

    def location(self) -> str | None:
        """Where this sink stages and publishes, as the checkpoint records it (an
        absolute directory path for directory sinks), or None when there is nothing
        to record (the default)."""
        return None

    def recover_at(self, staged_at: object, prepared: dict[int, list[str]]) -> None:
        """:meth:`recover`, for tokens that were staged at ``staged_at`` (what
        :meth:`location` returned when the checkpoint was taken; None when the
        checkpoint did not record it). A sink whose location can change commits
        them where they are and then also lists, in :meth:`committed`, what is
        committed there. The default ignores ``staged_at``.
        """
        self.recover(prepared)

    @abstractmethod
    def committed(self) -> list[CommittedFile]:
        """Every committed unit, ordered by epoch then token."""

    @abstractmethod
    def read_ids(self, files: list[CommittedFile]) -> pl.DataFrame:
        """The identity columns (see :func:`id_columns`) of the rows in ``files``."""

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release resources; staged data stays for ``recover``."""
