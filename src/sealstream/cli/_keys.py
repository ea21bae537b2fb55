"""``sealstream keys generate DIR`` and the ``--public-key FILE`` option of every
verifying command (see :mod:`sealstream.checkpoint.signing`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import click

from sealstream.checkpoint import signing
from sealstream.errors import SealstreamError

F = TypeVar("F", bound=Callable[..., Any])


def _trust(ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> None:
    if not value:
        return
    try:
        token = signing.trust_files(value)
    except SealstreamError as err:
        raise click.BadParameter(str(err)) from None
    ctx.call_on_close(lambda: signing.untrust(token))


def public_key_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--public-key FILE`` (repeatable): trust the public keys in FILE for this command;
    with any public key trusted, only Ed25519 signatures by trusted keys verify."""
    return click.option(
        "--public-key", "public_keys", multiple=True, expose_value=False, is_eager=True,
        callback=_trust, type=click.Path(dir_okay=False), metavar="FILE",
        help="Trust the Ed25519 public keys in FILE (PEM, or 'KEY_ID BASE64' lines); then "
             "only signatures by trusted keys verify (also SEALSTREAM_VERIFY_KEYS).")(f)


@click.group()
def keys() -> None:
    """Ed25519 key pairs: sign checkpoints with the private key, verify with the public."""


@keys.command("generate")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def generate_cmd(directory: Path) -> None:
    """Write a new key pair into DIRECTORY: signing-key.pem (mode 0600: point
    SEALSTREAM_SIGNING_KEY_FILE at it) and public-key.pem (give it to verifiers:
    SEALSTREAM_VERIFY_KEYS or --public-key). Prints the public key's id."""
    kid = signing.generate(directory)
    click.echo(kid)


def with_public_key(option: Callable[[F], F]) -> Callable[[F], F]:
    """``option`` and :func:`public_key_option` together (one decorator)."""
    def both(f: F) -> F:
        return cast(F, public_key_option(option(f)))
    return both
