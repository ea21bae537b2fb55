"""What the broker sources' spec sections share (kind = "kafka", kind = "nats")."""

from __future__ import annotations

from pathlib import Path

from sealstream.errors import SpecError


class LiveSourceSpec:
    """A live source's spec: read live, never from files; stops by ``stop``."""

    kind: str
    stop: str | None
    poll_ms: int
    fail_after_ms: int | None
    key: object

    @property
    def live(self) -> bool:
        return True

    @property
    def stop_mode(self) -> str:
        return self.stop or "never"

    @property
    def key_fields(self) -> tuple[str, ...] | None:
        return None

    def _what(self) -> str:
        raise NotImplementedError

    def _check_common(self) -> None:
        if self.stop not in (None, "end", "never"):
            raise SpecError(f"source.stop: expected \"end\" or \"never\", got {self.stop!r}")
        if self.poll_ms < 0:
            raise SpecError(f"source.poll_ms: expected an integer >= 0, got {self.poll_ms}")
        if self.fail_after_ms is not None and self.fail_after_ms <= 0:
            raise SpecError(
                f"source.fail_after_ms: expected an integer > 0, got {self.fail_after_ms}")
        if not isinstance(self.key, str):
            raise SpecError(f"source.key: a {self.kind} source takes one key field (or "
                            "\"@key\"); derive a compound key with [transform] fields")

    def partitions(self, allow_empty: bool = False) -> list[tuple[str, Path]]:
        """No files: ``[]`` for a live run (``allow_empty``), else a SpecError."""
        if allow_empty:
            return []
        raise SpecError(f"source: {self._what()} has no files; it is read live")
