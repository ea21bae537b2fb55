"""The console's web application (Starlette, Jinja2 templates, SVG charts).

Routes (all GET; the console never writes to a store):

* ``/``: the pipelines of every store, with the newest verdict, watermark, lag and age
* ``/s/{s}/{p}/history?verdict=&page=``: the checkpoint history, moved-aside ones included
* ``/s/{s}/{p}/charts``: watermarks, positions, size, interval and results per epoch
* ``/s/{s}/{p}/cp/{id}?against=ID`` (``/s/{s}/{p}/aside/{n}/{id}``): one checkpoint
* ``/s/{s}/{p}/window?key=&start=&end=&id=`` and ``.../window/proof``: a window's state,
  receipt and its proof as a download
* ``/job`` and ``/api/job``: the running job of ``--job URL``, polled live
* ``/agents/{s}``: an agent store's threads

Security: with a token (required off loopback), every request must carry it as
``Authorization: Bearer TOKEN`` or the ``sealstream_console`` cookie; ``/?token=TOKEN``
sets the cookie once and redirects. Every text rendered goes through
:func:`sealstream.checkpoint.stores.redact` (Jinja's ``finalize``), so URL credentials
and ``password=`` parameters never reach a page. A store that cannot be read, or a
damaged checkpoint, is shown on the page with its reason, never as a server error.
"""

from __future__ import annotations

import hmac
import json
import sys
import traceback
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from sealstream.checkpoint.stores import redact
from sealstream.console import _charts, _model
from sealstream.console._job import JobReader
from sealstream.console._stores import READ_ERRORS, Pipeline, Source, discover
from sealstream.inspect import wm_iso

COOKIE = "sealstream_console"
_HERE = Path(str(resources.files("sealstream.console")))


def _finalize(value: Any) -> Any:
    if value is None:
        return "-"
    if isinstance(value, str) and not isinstance(value, Markup):
        return redact_text(value)
    return value


def redact_text(text: str) -> str:
    """``text`` with credentials in any URL it holds hidden (``user:***@``, ``password=***``)."""
    import re

    text = re.sub(r"([A-Za-z][A-Za-z0-9+.-]*://[^/@:\s]*):[^/@\s]*@", r"\1:***@", text)
    return re.sub(r"(?i)(password=)[^&#\s]*", r"\1***", text)


def _age(ms: Any) -> str:
    if not isinstance(ms, int):
        return "-"
    s = abs(ms) // 1000
    d, s = divmod(s, 86_400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    text = f"{d}d {h}h" if d else f"{h}h {m}m" if h else f"{m}m {s}s" if m else f"{s}s"
    return text + (" in the future" if ms < 0 else "")


def _bytes(n: Any) -> str:
    if not isinstance(n, int):
        return "-"
    if n < 1024:
        return f"{n} B"
    v = n / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if v < 1024 or unit == "GiB":
            break
        v /= 1024
    return f"{v:.1f} {unit}"


class TokenGate:
    """ASGI middleware: every request must carry ``token`` (bearer header or cookie)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self.token = app, token

    def _ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        auth = request.headers.get("authorization", "")
        bearer = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        if self._ok(bearer) or self._ok(request.cookies.get(COOKIE)):
            await self.app(scope, receive, send)
            return
        if self._ok(request.query_params.get("token")):
            response: Response = RedirectResponse(request.url.path, status_code=303)
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
        else:
            response = HTMLResponse(
                "<!doctype html><title>sealstream console: token required</title>"
                "<h1>401: a token is required</h1><p>This console listens beyond 127.0.0.1: "
                "open the URL it printed when it started (it carries the token), or send "
                "<code>Authorization: Bearer TOKEN</code>.</p>", status_code=401,
                headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)


class Console:
    """The application's state: the stores (rediscovered on each pipelines page), the job."""

    def __init__(self, stores: list[str], job: str | None) -> None:
        self.stores = list(stores)
        self.sources: list[Source] = discover(self.stores)
        self.job = JobReader(job) if job else None
        self.env = Environment(loader=FileSystemLoader(str(_HERE / "templates")),
                               autoescape=select_autoescape(default=True),
                               finalize=_finalize)
        self.env.filters.update(age=_age, size=_bytes, iso=wm_iso, q=lambda s: quote(str(s)))
        self.env.globals.update(verdicts=_model.VERDICTS)

    def render(self, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        ctx.setdefault("job_url", self.job.shown if self.job else None)
        return HTMLResponse(self.env.get_template(name).render(**ctx), status_code=status)

    def pipeline(self, request: Request) -> Pipeline:
        s, p = int(request.path_params["s"]), int(request.path_params["p"])
        if not 0 <= s < len(self.sources):
            raise LookupError(f"no store {s}")
        src = self.sources[s]
        if not 0 <= p < len(src.pipelines):
            raise LookupError(f"no pipeline {p} in {src.shown}")
        return src.pipelines[p]


def _page(fn: Callable[[Console, Request], Response]) -> Callable[..., Any]:
    """An endpoint whose read failures become a page saying what could not be read."""

    def endpoint(request: Request) -> Response:
        console: Console = request.app.state.console
        try:
            return fn(console, request)
        except LookupError as exc:
            return console.render("error.html", 404, title="not found",
                                  message=str(exc).strip("'\""))
        except ValueError as exc:
            return console.render("error.html", 400, title="bad request", message=str(exc))
        except READ_ERRORS as exc:
            return console.render("error.html", 200, title="cannot read the store",
                                  message=str(exc) or type(exc).__name__)
        except Exception as exc:  # a store we failed to understand: say so, never a 500
            traceback.print_exc(file=sys.stderr)
            return console.render("error.html", 200, title="cannot show this page",
                                  message=f"{type(exc).__name__}: {exc}")

    return endpoint


def _int_arg(request: Request, name: str, default: int | None = None) -> int | None:
    text = request.query_params.get(name, "").strip()
    if not text:
        return default
    if text.startswith("cp-"):
        text = text[3:]
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}: {text!r} is not an integer") from None


@_page
def pipelines_page(c: Console, request: Request) -> Response:
    c.sources = discover(c.stores)
    rows = [(src, [_model.overview(p) for p in src.pipelines]) for src in c.sources
            if src.kind != "agents"]
    agents = [src for src in c.sources if src.kind == "agents"]
    return c.render("pipelines.html", sources=rows, agents=agents)


@_page
def history_page(c: Console, request: Request) -> Response:
    p = c.pipeline(request)
    verdict = request.query_params.get("verdict") or None
    data = _model.history(p, verdict, _int_arg(request, "page", 1) or 1)
    return c.render("history.html", p=p, h=data)


def _fmt_ms_time(v: int) -> str:
    iso = wm_iso(v) or str(v)
    return iso[5:19].replace("T", " ") if len(iso) >= 19 else iso


@_page
def charts_page(c: Console, request: Request) -> Response:
    p = c.pipeline(request)
    sr = _model.series(p)
    x = sr["ids"]
    parts = sr["partitions"]
    charts = [
        _charts.line_chart("global watermark", x, [("global", sr["global_wm"])],
                           _fmt_ms_time, "chart-watermark"),
        _charts.line_chart("partition watermarks", x,
                           [(n, _align(x, e["x"], e["wm"])) for n, e in parts.items()],
                           _fmt_ms_time, "chart-partition-watermarks"),
        _charts.line_chart("partition positions (next offset)", x,
                           [(n, _align(x, e["x"], e["position"])) for n, e in parts.items()],
                           str, "chart-positions"),
        _charts.line_chart("checkpoint size (bytes)", x, [("size", sr["bytes"])], _bytes,
                           "chart-size"),
        _charts.line_chart("interval since the parent checkpoint (ms)", x,
                           [("interval", sr["interval_ms"])], str, "chart-interval"),
        _charts.line_chart("results per epoch", x, [("results", sr["results"])], str,
                           "chart-results"),
        _charts.line_chart("broker lag per partition (records)", x,
                           [(n, _align(x, e["x"], e["lag"])) for n, e in parts.items()],
                           str, "chart-lag"),
    ]
    return c.render("charts.html", p=p, charts=[Markup(s) for s in charts], n=len(x))


def _align(x: list[int], xs: list[int], ys: list[Any]) -> list[Any]:
    by = dict(zip(xs, ys, strict=False))
    return [by.get(i) for i in x]


@_page
def detail_page(c: Console, request: Request) -> Response:
    p = c.pipeline(request)
    cid = int(request.path_params["cid"])
    n = request.path_params.get("n")
    data = _model.detail(p, cid, None if n is None else int(n))
    against = _int_arg(request, "against")
    if against is None and n is None and isinstance(data.get("parent"), int):
        against = int(data["parent"])
    d = _model.diff(p, against, cid) if against is not None and n is None else None
    return c.render("detail.html", p=p, d=data, diff=d, against=against,
                    raw=json.dumps(data.get("receipt_roots") or {}, indent=1))


def _window_args(request: Request) -> tuple[str, int, int, int | None] | None:
    key = request.query_params.get("key")
    if key is None or not request.query_params.get("start"):
        return None
    start, end = _int_arg(request, "start"), _int_arg(request, "end")
    if start is None or end is None:
        raise ValueError("start and end (ms) are both needed")
    return key, start, end, _int_arg(request, "id")


@_page
def window_page(c: Console, request: Request) -> Response:
    p = c.pipeline(request)
    args = _window_args(request)
    data = None if args is None else _model.window(p, *args)
    return c.render("window.html", p=p, w=data, args=args,
                    query=str(request.url.query))


@_page
def proof_download(c: Console, request: Request) -> Response:
    p = c.pipeline(request)
    args = _window_args(request)
    if args is None:
        raise ValueError("key, start and end are needed")
    data = _model.window(p, *args)
    receipt = None if "error" in data else data["checkpoint"]["output_emission_receipt"]
    if not receipt:
        return c.render("error.html", 404, title="no proof",
                        message=data.get("error") or "this window has no emission receipt "
                        "(it is open, or was never emitted)")
    body = json.dumps(receipt, separators=(",", ":")).encode() + b"\n"
    name = f"proof-{args[1]}-{args[2]}.json"
    return Response(body, media_type="application/json",
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})


@_page
def job_page(c: Console, request: Request) -> Response:
    if c.job is None:
        raise LookupError("no running job: start the console with --job URL")
    return c.render("job.html", job=c.job.read())


def job_api(request: Request) -> Response:
    c: Console = request.app.state.console
    if c.job is None:
        return JSONResponse({"ok": False, "error": "no --job URL given"}, status_code=404)
    return JSONResponse(c.job.read())


@_page
def agents_page(c: Console, request: Request) -> Response:
    s = int(request.path_params["s"])
    if not 0 <= s < len(c.sources) or c.sources[s].kind != "agents":
        raise LookupError(f"no agent store {s}")
    from sealstream.console._agents import threads

    return c.render("agents.html", src=c.sources[s], data=threads(c.sources[s].where))


def create_app(stores: list[str], *, job: str | None = None, token: str | None = None,
               allowed_hosts: list[str] | None = None) -> ASGIApp:
    """The console as an ASGI application; ``token``: required on every request;
    ``allowed_hosts``: the only ``Host`` headers served (a loopback console refuses
    others, so a web page cannot reach it by DNS rebinding)."""
    console = Console(stores, job)
    base = "/s/{s:int}/{p:int}"
    app = Starlette(routes=[
        Route("/", pipelines_page),
        Route(f"{base}/history", history_page),
        Route(f"{base}/charts", charts_page),
        Route(f"{base}/cp/{{cid:int}}", detail_page),
        Route(f"{base}/aside/{{n:int}}/{{cid:int}}", detail_page),
        Route(f"{base}/window", window_page),
        Route(f"{base}/window/proof", proof_download),
        Route("/job", job_page),
        Route("/api/job", job_api),
        Route("/agents/{s:int}", agents_page),
        Mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static"),
    ])
    app.state.console = console
    gated: ASGIApp = TokenGate(app, token) if token else app
    if allowed_hosts:
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        gated = TrustedHostMiddleware(gated, allowed_hosts=allowed_hosts)
    return gated


__all__ = ["create_app", "redact", "redact_text"]
