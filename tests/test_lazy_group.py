"""The CLI's lazy command group: a command whose module fails to import fails the
same way on every look-up, never turning into "No such command" the second time."""

from __future__ import annotations

import sys

import click
import pytest
from click.testing import CliRunner

from sealstream.cli._lazy import LazyGroup


def test_a_failed_import_fails_the_same_way_twice(tmp_path, monkeypatch) -> None:
    mod = tmp_path / "lazy_cmd_probe.py"
    mod.write_text("raise ImportError('the probe cannot load')\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    @click.group(cls=LazyGroup)
    def cli() -> None: ...

    assert isinstance(cli, LazyGroup)
    cli.add_lazy("probe", "lazy_cmd_probe:probe")
    for _ in range(2):
        with pytest.raises(ImportError, match="the probe cannot load"):
            cli.get_command(click.Context(cli), "probe")
        sys.modules.pop("lazy_cmd_probe", None)
    # once the module loads, the command is there and registered once
    mod.write_text("import click\n\n@click.command()\ndef probe() -> None:\n    click.echo('ok')\n")
    result = CliRunner().invoke(cli, ["probe"])
    assert result.exit_code == 0 and result.output == "ok\n"
    assert "probe" not in cli.lazy and cli.list_commands(click.Context(cli)) == ["probe"]
