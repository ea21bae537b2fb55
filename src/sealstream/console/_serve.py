"""Running the console: bind, decide on a token, serve with uvicorn until stopped."""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
import sys
from typing import Any

from sealstream.errors import SpecError

LOOPBACK_NAMES = ("localhost",)
#: how long a page waits for an unreachable PostgreSQL (``SEALSTREAM_PG_RETRY_S`` wins)
PG_RETRY_S = 3.0
#: how long a page waits for an unreachable S3 endpoint (``SEALSTREAM_S3_RETRY_S`` wins)
S3_RETRY_S = 3.0


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def create_app(stores: list[str], *, job: str | None = None, token: str | None = None,
               allowed_hosts: list[str] | None = None) -> Any:
    """See :func:`sealstream.console._app.create_app`."""
    from sealstream.console._app import create_app as make

    return make(stores, job=job, token=token, allowed_hosts=allowed_hosts)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise SpecError(f"--host {host} --port {port}: cannot listen there "
                        f"({exc.strerror or exc})") from None
    sock.listen(128)
    return sock


def serve(stores: list[str], *, host: str = "127.0.0.1", port: int = 8080,
          job: str | None = None) -> int:
    """Serve the console until SIGINT/SIGTERM. Off loopback a token is generated and
    printed once (in the URL to open); every request must then carry it."""
    try:
        import jinja2  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise SpecError("the console needs its extra: pip install 'sealstream[console]'"
                        ) from None
    # a page waits for a store: an unreachable PostgreSQL is retried for 3 s, not 30
    # (the user's own setting wins). Only while serving: a caller that goes on in this
    # process (a test, a notebook) gets its environment back as it was.
    shorter = {k: v for k, v in (("SEALSTREAM_PG_RETRY_S", str(PG_RETRY_S)),
                                 ("SEALSTREAM_S3_RETRY_S", str(S3_RETRY_S)))
               if k not in os.environ}
    os.environ.update(shorter)
    try:
        return _serve(stores, host=host, port=port, job=job)
    finally:
        for k in shorter:
            os.environ.pop(k, None)


def _serve(stores: list[str], *, host: str, port: int, job: str | None) -> int:
    import uvicorn

    token = None if is_loopback(host) else secrets.token_urlsafe(24)
    # on loopback, only loopback names: a page elsewhere cannot reach it by DNS rebinding
    hosts = None if token is not None else ["127.0.0.1", "localhost", "[::1]", "::1",
                                             host.strip("[]")]
    app = create_app(stores, job=job, token=token, allowed_hosts=hosts)
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    url = f"http://{shown}:{bound}/"
    if token is not None:
        print(f"sealstream console: serving {url} (not loopback: every request needs the "
              f"token)\nsealstream console: open {url}?token={token} (the token is printed "
              "only this once)", file=sys.stderr, flush=True)
    else:
        print(f"sealstream console: serving {url} (read-only; Ctrl-C to stop)",
              file=sys.stderr, flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0
