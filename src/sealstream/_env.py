"""Settings read from the environment, checked once in one place."""

from __future__ import annotations

import math
import os

from sealstream.errors import SpecError


def seconds(name: str, default: float) -> float:
    """Seconds (a number >= 0) from environment variable ``name``; ``default`` when it
    is unset or empty. Anything else raises :class:`SpecError` naming the variable."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise SpecError(f"{name}: {text!r} is not a number of seconds >= 0")
    return value
