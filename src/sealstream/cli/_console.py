"""``sealstream console STORE... [--host] [--port] [--job URL]`` (see docs/console.md)."""

from __future__ import annotations

import click


@click.command("console")
@click.argument("stores", nargs=-1, required=True, type=str)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; any non-loopback address requires a token "
                   "(generated and printed once).")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(min=0, max=65535),
              help="Port to listen on (0: pick a free one and print it).")
@click.option("--job", "job", default=None, metavar="URL",
              help="The metrics endpoint of a running job (sealstream run --metrics-port), "
                   "shown live.")
def console_cmd(stores: tuple[str, ...], host: str, port: int, job: str | None) -> None:
    """Serve a read-only web console over checkpoint STORES (directories, sqlite:///FILE,
    postgresql://HOST/DB, agent stores): pipelines, checkpoint history and verdicts,
    charts, checkpoint detail and diff, window lookup, agent threads, a running job.
    Needs the console extra: pip install 'sealstream[console]'."""
    from sealstream.console._serve import serve

    serve(list(stores), host=host, port=port, job=job)
