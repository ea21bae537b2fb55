"""``[[enrich]]``: the settings of one reference table joined to each event as of
its event time (docs/enrich.md). Plain settings: nothing here reads a table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sealstream.errors import SpecError

TableKind = Literal["csv", "parquet", "jsonl", "sqlite", "postgresql", "kafka"]
OnMissing = Literal["null", "error", "drop"]
FILE_KINDS = ("csv", "parquet", "jsonl")
QUERY_KINDS = ("sqlite", "postgresql")
KINDS: tuple[str, ...] = (*FILE_KINDS, *QUERY_KINDS, "kafka")
ON_MISSING = ("null", "error", "drop")
SETTINGS = frozenset({"name", "kind", "path", "url", "query", "bootstrap", "topic", "on",
                      "valid_from", "columns", "on_missing", "fail_after_ms"})


@dataclass(frozen=True)
class Enrich:
    """One reference table: ``on`` names the event fields (and the table columns of
    the same names) that pick a row; the row valid at the event's time is the one
    with the greatest ``valid_from`` not after it (without ``valid_from`` the table
    has one version, valid from the beginning of time). ``columns`` (default: every
    other column of the table) are added to the event.

    >>> Enrich(name="users", kind="csv", path="users.csv", on=("user",)).on_missing
    'null'
    """

    name: str
    kind: TableKind
    on: tuple[str, ...]
    path: str | None = None
    base_dir: Path = Path(".")
    url: str | None = None
    query: str | None = None
    bootstrap: str | None = None
    topic: str | None = None
    valid_from: str | None = None
    columns: tuple[str, ...] | None = None
    on_missing: OnMissing = "null"
    #: a database or broker that cannot be reached is retried this long at start
    fail_after_ms: int = 30_000

    def __post_init__(self) -> None:
        where = f"enrich.{self.name}"
        if not isinstance(self.name, str) or not self.name.replace("_", "").replace(
                "-", "").isalnum():
            raise SpecError(f"enrich.name: {self.name!r} is not a valid name")
        if self.kind not in KINDS:
            raise SpecError(f"{where}.kind: {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.on_missing not in ON_MISSING:
            raise SpecError(f"{where}.on_missing: {self.on_missing!r} is not one of "
                            "null, error, drop")
        if (not isinstance(self.on, tuple) or not self.on
                or not all(isinstance(f, str) and f for f in self.on)):
            raise SpecError(f"{where}.on: expected a field name or a list of field names, "
                            f"got {self.on!r}")
        need = {"csv": ("path",), "parquet": ("path",), "jsonl": ("path",),
                "sqlite": ("url", "query"), "postgresql": ("url", "query"),
                "kafka": ("bootstrap", "topic")}[self.kind]
        for setting in ("path", "url", "query", "bootstrap", "topic"):
            value = getattr(self, setting)
            if setting in need and not (isinstance(value, str) and value):
                raise SpecError(f"{where}.{setting}: required for kind = {self.kind!r}")
            if setting not in need and value is not None:
                raise SpecError(f"{where}.{setting}: not a setting of kind = {self.kind!r}")
        if self.kind == "kafka":
            if len(self.on) != 1:
                raise SpecError(f"{where}.on: a changelog topic is keyed by the message key: "
                                "name one field")
            if self.valid_from is not None:
                raise SpecError(f"{where}.valid_from: a changelog topic is versioned by its "
                                "records' timestamps; remove the setting")
        if self.columns is not None and (
                not isinstance(self.columns, tuple)
                or not all(isinstance(c, str) and c for c in self.columns)):
            raise SpecError(f"{where}.columns: expected a list of column names")
        for c in (*self.on, *(self.columns or ())):
            if c.startswith("_"):
                raise SpecError(f"{where}: {c!r}: names starting with _ are reserved")
        if isinstance(self.fail_after_ms, bool) or not isinstance(self.fail_after_ms, int) \
                or self.fail_after_ms < 0:
            raise SpecError(f"{where}.fail_after_ms: expected a non-negative integer")

    @property
    def resolved(self) -> Path:
        """A file table's path (relative paths are relative to the spec file)."""
        assert self.path is not None
        return self.base_dir / self.path

    def describe(self) -> dict[str, Any]:
        """What the pipeline's fingerprint records (the table's address, not its
        content: the content's version is bound per checkpoint)."""
        out: dict[str, Any] = {"kind": self.kind, "on": list(self.on),
                               "on_missing": self.on_missing}
        for setting in ("path", "url", "query", "topic", "valid_from"):
            value = getattr(self, setting)
            if value is not None:
                out[setting] = value
        if self.columns is not None:
            out["columns"] = list(self.columns)
        return out


def _names(where: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise SpecError(f"{where}: expected a name or a list of names, got {value!r}")


def enrich_from_dict(raw: object, base_dir: Path = Path(".")) -> tuple[Enrich, ...]:
    """``[[enrich]]`` tables of a spec -> settings, in order; SpecError on the first
    problem."""
    if not isinstance(raw, list):
        raise SpecError("enrich: expected [[enrich]] tables (an array of tables)")
    out: list[Enrich] = []
    for n, table in enumerate(raw):
        if not isinstance(table, Mapping):
            raise SpecError(f"enrich[{n}]: expected a table")
        name = table.get("name", f"enrich{n}")
        for key in table:
            if key not in SETTINGS:
                raise SpecError(f"enrich.{name}.{key}: unknown setting; [[enrich]] takes "
                                f"{', '.join(sorted(SETTINGS))}")
        for key in ("name", "kind", "path", "url", "query", "bootstrap", "topic",
                    "valid_from", "on_missing"):
            if key in table and not isinstance(table[key], str):
                raise SpecError(f"enrich.{name}.{key}: expected a string, got {table[key]!r}")
        if "kind" not in table:
            raise SpecError(f"enrich.{name}.kind: required setting is missing")
        if "on" not in table:
            raise SpecError(f"enrich.{name}.on: required setting is missing")
        out.append(Enrich(
            name=name, kind=table["kind"], on=_names(f"enrich.{name}.on", table["on"]),
            path=table.get("path"), base_dir=base_dir, url=table.get("url"),
            query=table.get("query"), bootstrap=table.get("bootstrap"),
            topic=table.get("topic"), valid_from=table.get("valid_from"),
            columns=(_names(f"enrich.{name}.columns", table["columns"])
                     if "columns" in table else None),
            on_missing=table.get("on_missing", "null"),
            fail_after_ms=table.get("fail_after_ms", 30_000),
        ))
    names = [e.name for e in out]
    for e in out:
        if names.count(e.name) > 1:
            raise SpecError(f"enrich.name: {e.name!r} names two [[enrich]] tables")
    return tuple(out)
