"""``sealstream archive list|verify SPEC [--json]``: a job's raw-event archive
(:mod:`sealstream.archive._survey` says what each verdict means).

``verify`` exits 0 when every segment a kept step plan names is present and hashes as
recorded, 1 otherwise, 2 for a spec without ``[archive]`` or ``[checkpoint]``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from sealstream.errors import SealstreamError, SpecError


def _survey(spec: Path, verify: bool) -> dict[str, Any]:
    from sealstream.archive._survey import survey
    from sealstream.checkpoint.manifest import checkpoint_key
    from sealstream.pipeline.spec import load_spec

    p = load_spec(spec)
    if p.archive is None:
        raise SpecError(f"{spec}: the spec has no [archive] section")
    if p.checkpoint is None:
        raise SpecError(f"{spec}: the spec has no [checkpoint] section (the step plans "
                        "there bind the archive's segments)")
    return survey(p.archive, p.checkpoint.open_store(p.name), checkpoint_key(), verify=verify)


def _show(data: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(f"archive {data['archive']}: {len(data['segments'])} segment(s)")
    for r in data["segments"]:
        size = f"{r['bytes']} bytes" if "bytes" in r else ""
        click.echo(f"  {r['verdict']:<8} step {r['step']}  {r['name']}  {size}".rstrip())
    for b in data["rejected_plans"]:
        click.echo(f"  step plan {b['step']} does not verify ({b['reason']})")


@click.group("archive")
def archive() -> None:
    """The raw-event archive of a job ([archive]; docs/object-storage.md)."""


@archive.command("list")
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_cmd(spec: Path, as_json: bool) -> None:
    """The archive's segments, the step that binds each (no contents read)."""
    from sealstream.cli import _Exit

    try:
        _show(_survey(spec, verify=False), as_json)
    except SealstreamError as err:
        click.echo(f"sealstream: error: {err}", err=True)
        raise _Exit(err.exit_code) from None


@archive.command("verify")
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def verify_cmd(spec: Path, as_json: bool) -> None:
    """Hash every bound segment against its step plan; exit 1 when one is damaged or
    missing."""
    from sealstream.cli import _Exit

    try:
        data = _survey(spec, verify=True)
    except SealstreamError as err:
        click.echo(f"sealstream: error: {err}", err=True)
        raise _Exit(err.exit_code) from None
    _show(data, as_json)
    if not data["ok"]:
        raise _Exit(1)
