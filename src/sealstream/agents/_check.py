"""Argument checks at the agent layer's public entry points.

A wrong argument is a :class:`~sealstream.errors.SpecError` naming the argument
and what it got, raised before anything is written; never a ``KeyError`` or
``TypeError`` from deep inside, and never silently accepted (``decide(id, "no")``
must not record an approval).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sealstream.errors import SpecError


def _got(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def text(name: str, value: Any, *, empty_ok: bool = False) -> str:
    if not isinstance(value, str) or (not value and not empty_ok):
        want = "a string" if empty_ok else "a non-empty string"
        raise SpecError(f"{name}: expected {want}, got {_got(value)}")
    return value


def step(name: str, value: Any) -> str | int:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise SpecError(f"{name}: expected a string or an integer, got {_got(value)}")
    return value


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise SpecError(f"{name}: expected True or False, got {_got(value)}")
    return value


def mapping(name: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(f"{name}: expected a mapping (dict), got {_got(value)}")
    return value


def mappings(name: str, value: Any) -> Sequence[Mapping[str, Any]]:
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise SpecError(f"{name}: expected a list of mappings, got {_got(value)}")
    for i, item in enumerate(value):
        mapping(f"{name}[{i}]", item)
    return value


def count(name: str, value: Any, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(f"{name}: expected an integer >= {minimum}, got {_got(value)}")
    return value


def key(name: str, value: Any) -> bytes | None:
    """A key given as bytes, or as text (UTF-8, as the environment variable is)."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise SpecError(f"{name}: expected bytes, a string or None, got {_got(value)}")
