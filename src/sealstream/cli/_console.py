"""``sealstream console STORE... [--host] [--port] [--job URL] [--endpoint-url URL]``
(see docs/console.md)."""

from __future__ import annotations

import os

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
@click.option("--endpoint-url", default=None, metavar="URL",
              help="The S3 endpoint of s3:// stores (else AWS_ENDPOINT_URL); credentials "
                   "come from the standard AWS environment.")
def console_cmd(stores: tuple[str, ...], host: str, port: int, job: str | None,
                endpoint_url: str | None) -> None:
    """Serve a read-only web console over checkpoint STORES (directories, sqlite:///FILE,
    postgresql://HOST/DB, s3://BUCKET/PREFIX, agent stores): pipelines, checkpoint
    history and verdicts, charts, checkpoint detail and diff, window lookup, agent
    threads, a running job. Needs the console extra: pip install 'sealstream[console]'."""
    from sealstream.console._serve import serve

    before = os.environ.get("AWS_ENDPOINT_URL")
    if endpoint_url:
        os.environ["AWS_ENDPOINT_URL"] = endpoint_url  # what every S3 store here reads
    try:
        serve(list(stores), host=host, port=port, job=job)
    finally:  # as it was, for a caller that goes on in this process
        if before is None:
            os.environ.pop("AWS_ENDPOINT_URL", None)
        else:
            os.environ["AWS_ENDPOINT_URL"] = before
