"""``sealstream console``: a read-only web console over checkpoint stores, a running
job's metrics and agent stores (the ``sealstream[console]`` extra: Starlette, uvicorn,
Jinja2). Nothing in the package imports it; it reads through :mod:`sealstream.inspect`,
the guard and the stores. See ``docs/console.md``.
"""

from __future__ import annotations

__all__ = ["create_app", "serve"]


def __getattr__(name: str) -> object:
    if name in __all__:
        from sealstream.console import _serve

        return getattr(_serve, name)
    raise AttributeError(name)
