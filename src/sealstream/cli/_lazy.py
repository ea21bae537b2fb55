"""A click group whose sub-commands are imported when they are used.

``sealstream run`` does not need the modules of ``agents``, ``keys``, ``console``,
``compare``, ``archive`` or ``receipts consistency|export`` (SQLite, the key tools,
the guard's window views): they are registered by name and imported on first look
up (the command itself, its ``--help``, or the group's ``--help``, which lists them
in the same order as before).
"""

from __future__ import annotations

from importlib import import_module

import click


class LazyGroup(click.Group):
    """A :class:`click.Group` with commands given as ``"module:attribute"``."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy: dict[str, str] = {}

    def add_lazy(self, name: str, target: str) -> None:
        """Register the command ``name``, found at ``target`` (``"module:attr"``)."""
        self.lazy[name] = target

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.lazy.get(cmd_name)
        if target is not None:
            module, _, attr = target.partition(":")
            cmd = getattr(import_module(module), attr)
            assert isinstance(cmd, click.Command) and cmd.name == cmd_name, target
            self.add_command(cmd)
            # dropped only once imported: a failed import fails the same way next time
            del self.lazy[cmd_name]
        return super().get_command(ctx, cmd_name)
