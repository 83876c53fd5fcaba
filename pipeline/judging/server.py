"""The judging page and its JSON API, served on 127.0.0.1 by aiohttp's server (the one module of
:mod:`pipeline.judging` that imports aiohttp).

``GET /`` is the page (``page.html`` with the session embedded as JSON, under a Content-Security-Policy
that allows its own script and style, by hash, and requests to this server alone). The API:

* ``GET /api/session``: who judges what, where to start, the progress;
* ``GET /api/records/{index}``: one record (:func:`pipeline.judging.views.record_data`);
* ``POST /api/judge`` ``{"record", "item", "verdict"}``, ``POST /api/missing`` ``{"record", "field",
  "text"}``, ``POST /api/undo``: each answers with the record changed, the progress, and whether the
  judgments are in the table or in the journal (a run holds the database).

Each change is saved before it is answered (:class:`~pipeline.judging.journal.JudgmentWriter`, in a
worker thread, one at a time) and only then applied to the session, so the page never shows a judgment
that is not on disk. The server only answers requests made to 127.0.0.1 or localhost, and changes only
JSON ones from its own page: another site open in the browser cannot judge in the judge's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import importlib.resources
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import structlog
from aiohttp import web

from pipeline.defaults import DEFAULT_JUDGING_PORT
from pipeline.errors import ConfigError, FatalRunError
from pipeline.job.spec import JobSpec
from pipeline.judging.journal import JudgmentWriter, Saved
from pipeline.judging.session import JudgingSession, SessionOptions, load_session
from pipeline.judging.state import Action
from pipeline.judging.views import progress_data, record_data, session_data
from pipeline.quality.judgments import Judgment, JudgmentVerdict
from pipeline.reports.html_page import content_security_policy, embed_json

log = structlog.get_logger("pipeline.judging.server")

HOST = "127.0.0.1"
#: How often a journal left by a busy database is tried again when no judgment comes to write it.
FLUSH_EVERY_S = 30.0
TEMPLATE = importlib.resources.files("pipeline.judging").joinpath("page.html")
CSP_MARKER = "__CONTENT_SECURITY_POLICY__"
DATA_MARKER = "__JUDGING_DATA__"
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost"})
_NO_STORE = {"Cache-Control": "no-store"}  # every answer is the state of the moment
MESSAGES = {
    Saved.WRITTEN: "saved",
    Saved.JOURNALED: "saved; a run holds the database: written when it ends",
}

_SESSION: web.AppKey[JudgingSession] = web.AppKey("session", JudgingSession)
_WRITER: web.AppKey[JudgmentWriter] = web.AppKey("writer", JudgmentWriter)
_LOCK: web.AppKey[asyncio.Lock] = web.AppKey("lock", asyncio.Lock)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def serve_judging(
    spec: JobSpec,
    options: SessionOptions,
    on_ready: Callable[[JudgingSession, str], None],
    *,
    port: int = DEFAULT_JUDGING_PORT,
) -> None:
    """Write what the journal holds (if the database is free), read the session, and serve its page on
    127.0.0.1 until SIGINT or SIGTERM; ``on_ready`` gets the session and the page's URL once listening.
    Raises :class:`ConfigError` (no results, a bad sample, the port in use) before serving."""
    writer = JudgmentWriter(spec)
    await asyncio.to_thread(writer.flush)
    pending = await asyncio.to_thread(writer.pending)
    session = await asyncio.to_thread(load_session, spec, options, pending.added, pending.undone)
    app = build_app(session, writer)
    await serve(app, port, functools.partial(on_ready, session))


def build_app(
    session: JudgingSession, writer: JudgmentWriter, flush_every_s: float = FLUSH_EVERY_S
) -> web.Application:
    app = web.Application(middlewares=[_local_only], client_max_size=256 * 1024)
    app[_SESSION] = session
    app[_WRITER] = writer
    app[_LOCK] = asyncio.Lock()
    app.router.add_get("/", _page)
    app.router.add_get("/api/session", _session)
    app.router.add_get("/api/records/{index}", _record)
    app.router.add_post("/api/judge", _judge)
    app.router.add_post("/api/missing", _missing)
    app.router.add_post("/api/undo", _undo)
    app.cleanup_ctx.append(functools.partial(_flushing, flush_every_s=flush_every_s))
    return app


async def serve(app: web.Application, port: int, on_ready: Callable[[str], None]) -> None:
    """Serve ``app`` on 127.0.0.1:``port`` (0: a free one) until SIGINT or SIGTERM; requests in flight
    finish first, so a judgment being written is written."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, HOST, port).start()
        except OSError as error:
            raise ConfigError(_listen_error(error, port)) from error
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        on_ready(f"http://{HOST}:{runner.addresses[0][1]}/")
        await stop.wait()
    finally:
        await runner.cleanup()


def _listen_error(error: OSError, port: int) -> str:
    if error.errno == errno.EADDRINUSE:
        return f"port {port} is in use: give another with --port"
    return f"--port {port}: cannot listen on {HOST} ({(error.strerror or str(error)).lower()})"


# --- the page and what it reads -----------------------------------------------------------------------


@functools.cache
def _template() -> tuple[str, str]:
    """The page template and its policy: its own script and style, and requests to this server."""
    template = TEMPLATE.read_text(encoding="utf-8")
    for marker in (CSP_MARKER, DATA_MARKER):
        if template.count(marker) != 1:
            raise RuntimeError(f"{TEMPLATE.name}: expected {marker} once, found it {template.count(marker)}")
    policy = content_security_policy(template, TEMPLATE.name) + "; connect-src 'self'"
    return template.replace(CSP_MARKER, policy, 1), policy


async def _page(request: web.Request) -> web.Response:
    session, writer = request.app[_SESSION], request.app[_WRITER]
    pending = len(await asyncio.to_thread(writer.pending))
    template, policy = _template()
    document = template.replace(DATA_MARKER, embed_json(session_data(session, pending)), 1)
    headers = {
        "Content-Security-Policy": policy,
        "Cache-Control": "no-store",
        "Referrer-Policy": "no-referrer",
    }
    return web.Response(text=document, content_type="text/html", headers=headers)


async def _session(request: web.Request) -> web.Response:
    session, writer = request.app[_SESSION], request.app[_WRITER]
    pending = len(await asyncio.to_thread(writer.pending))
    return _json(session_data(session, pending))


async def _record(request: web.Request) -> web.Response:
    session = request.app[_SESSION]
    index = _index(request.match_info["index"], session)
    return _json(record_data(session, index))


# --- changes: saved first, then applied -----------------------------------------------------------------


async def _judge(request: web.Request) -> web.Response:
    body = await _body(request)
    session = request.app[_SESSION]
    verdict = _verdict(body.get("verdict"))
    index = _index(body.get("record"), session)
    action = _made(lambda: session.judge(index, _integer(body.get("item"), "item"), verdict))
    return await _save(request, action, index)


async def _missing(request: web.Request) -> web.Response:
    body = await _body(request)
    session = request.app[_SESSION]
    index = _index(body.get("record"), session)
    field, text = body.get("field"), body.get("text")
    if not isinstance(field, str) or not isinstance(text, str):
        raise _bad_request("give the field and the text selected")
    action = _made(lambda: session.mark_missing(index, field, text))
    return await _save(request, action, index)


async def _undo(request: web.Request) -> web.Response:
    await _body(request)
    session, writer = request.app[_SESSION], request.app[_WRITER]
    async with request.app[_LOCK]:
        action = session.last_action()
        if action is None:
            return _json({"undone": False, "message": "nothing to undo"})
        saved = await _written(writer.undo, writer, action)
        session.taken_back(action)
    index, item = session.where(action)
    focus = {"item": item, "field": action.field}
    return _json(_changed(session, index, saved, focus=focus, undone=True))


async def _save(request: web.Request, action: Action, index: int) -> web.Response:
    session, writer = request.app[_SESSION], request.app[_WRITER]
    async with request.app[_LOCK]:
        saved = await _written(writer.save, writer, action)
        session.saved(action)
    return _json(_changed(session, index, saved))


async def _written(
    write: Callable[[list[Judgment]], Saved], writer: JudgmentWriter, action: Action
) -> tuple[Saved, int]:
    """How ``action`` was saved, and how many judgments (and undos) wait in the journal."""
    try:
        saved = await asyncio.to_thread(write, list(action.judgments))
        waiting = 0 if saved is Saved.WRITTEN else len(await asyncio.to_thread(writer.pending))
    except (FatalRunError, OSError) as error:
        log.error("judgment not saved", error=str(error))
        raise web.HTTPInternalServerError(
            text=orjson.dumps({"error": f"NOT saved: {error}"}).decode(), content_type="application/json"
        ) from error
    return saved, waiting


def _changed(session: JudgingSession, index: int, saved: tuple[Saved, int], **more: Any) -> dict[str, Any]:
    how, waiting = saved
    return {
        "record": record_data(session, index),
        "progress": progress_data(session.progress()),
        "saved": str(how),
        "message": MESSAGES[how],
        "pending": waiting,
        **more,
    }


async def _flushing(app: web.Application, *, flush_every_s: float) -> AsyncIterator[None]:
    """While serving: write a journal a busy database left, once it is free, even if no judgment comes."""

    async def flush_now_and_then() -> None:
        while True:
            await asyncio.sleep(flush_every_s)
            writer = app[_WRITER]
            if not writer.journal.path.exists():
                continue
            async with app[_LOCK]:
                try:
                    await asyncio.to_thread(writer.flush)
                except (FatalRunError, OSError) as error:  # the next judgment, or the next try, says so
                    log.warning("journal not written yet", error=str(error))

    task = asyncio.create_task(flush_now_and_then())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


# --- requests -----------------------------------------------------------------------------------------


@web.middleware
async def _local_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Requests to this machine's own names only (no DNS rebinding), and changes as JSON from this
    server's page only (a form or a script of another site cannot send them)."""
    if (request.url.host or "").lower() not in LOCAL_HOSTS:
        raise web.HTTPForbidden(text="the judging page answers on 127.0.0.1 only")
    if request.method == "POST":
        origin = request.headers.get("Origin")
        if request.content_type != "application/json" or (
            origin is not None and origin != f"{request.scheme}://{request.host}"
        ):
            raise web.HTTPForbidden(text="changes come as JSON from the judging page")
    return await handler(request)


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError as error:
        raise _bad_request(f"not JSON ({error.msg})") from error
    if not isinstance(body, dict):
        raise _bad_request("expected a JSON object")
    return body


def _index(value: object, session: JudgingSession) -> int:
    index = _integer(value, "record")
    if not 0 <= index < len(session.records):
        raise _bad_request(f"no record number {index} (the session has {len(session.records)})")
    return index


def _integer(value: object, what: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise _bad_request(f"{what} must be a number")


def _verdict(value: object) -> JudgmentVerdict:
    if value not in (JudgmentVerdict.CORRECT, JudgmentVerdict.WRONG):
        raise _bad_request("verdict must be 'correct' or 'wrong'")
    return JudgmentVerdict(str(value))


def _made(make: Callable[[], Action]) -> Action:
    try:
        return make()
    except ValueError as error:
        raise _bad_request(str(error)) from error


def _bad_request(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=orjson.dumps({"error": message}).decode(), content_type="application/json")


def _json(data: dict[str, Any]) -> web.Response:
    return web.Response(
        body=orjson.dumps(data), content_type="application/json", headers={"Cache-Control": "no-store"}
    )
