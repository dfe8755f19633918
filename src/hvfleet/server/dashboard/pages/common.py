"""What every dashboard page and feed shares: who the caller is (the session
cookie, session.py) and which hosts they may see (the API's Authorizer), the
fleet's live state, reading a form, and the answers every page may give
(an HTML page under the dashboard's security headers, the login redirect,
an error page, a feed's refusal)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from hvfleet.model.errors import (
    Conflict,
    Forbidden,
    HvfleetError,
    InvalidInput,
    NotFound,
    TooLarge,
    Unauthorized,
)
from hvfleet.model.selectors import parse_selector
from hvfleet.server import bodies
from hvfleet.server.context import ApiContext
from hvfleet.server.dashboard.feed import HostRow
from hvfleet.server.dashboard.html import render
from hvfleet.server.dashboard.live import FleetState
from hvfleet.server.dashboard.session import clear_session, csrf_for, identify, session_ended, session_token
from hvfleet.server.errors import http_status_of
from hvfleet.server.identity import Action, Identity

# The login and logout forms are read before anyone is known: a token and a
# path fit in far less.
ANONYMOUS_FORM_MAX = 16 * 1024
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                               "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def ctx_of(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.ctx
    return ctx


def state_of(request: Request) -> FleetState:
    state: FleetState = request.app.state.dashboard
    return state


def html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)


def page(request: Request, template: str, who: Identity | None, status: int = 200,
         **values: Any) -> HTMLResponse:
    """A page from `template` (which extends base.html) for `who`."""
    values.setdefault("scripts", [])
    values.setdefault("current", "")
    return html(render(template, who=who, csrf=csrf_of(request), **values), status)


async def loaded(request: Request) -> Response | None:
    """None once the dashboard's picture of the fleet is loaded; else (after a
    short wait) a 503 that says so."""
    state = state_of(request)
    if state.loaded.is_set() or await run_in_threadpool(state.loaded.wait, 30.0):
        return None
    return page(request, "loading.html", None, 503, title="Loading")


async def read_form(request: Request, max_body: int | None = None) -> dict[str, str]:
    """The form's fields; its body is read at most `max_body` bytes far (the
    API's limit by default; the forms sent before a login, smaller)."""
    media = request.headers.get("content-type", "").split(";")[0].strip()
    if media != "application/x-www-form-urlencoded":
        raise InvalidInput(f"a form must be sent as application/x-www-form-urlencoded, not {media!r}")
    raw = await bodies.read_body(request, max_body or ctx_of(request).limits.max_body)
    return dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))


# The hosts a caller may see on the dashboard; None: every host.
Visible = frozenset[str] | None


def visible_hosts(ctx: ApiContext, who: Identity) -> Visible:
    """What the caller may list, asked of the API's own authorizer: every host
    (a list of hypervisors), else, for a caller bound to one hypervisor (an
    agent), that host alone (a list narrowed to its name, as the API's
    `fieldSelector=metadata.name=` list is); Forbidden for anyone else."""
    try:
        ctx.authorize(who, Action("list", "hypervisors"))
        return None
    except Forbidden:
        if who.hypervisor is None:
            raise
    ctx.authorize(who, Action("list", "hypervisors", name=who.hypervisor))
    return frozenset({who.hypervisor})


def only(rows: list[HostRow], visible: Visible) -> list[HostRow]:
    return rows if visible is None else [x for x in rows if x.name in visible]


async def json_feed(document: Callable[[], dict[str, Any]], field: str | None = None) -> Response:
    """A feed's JSON answer, never cached: `document()`, run in the thread
    pool; bad input a 422 naming its field (`field` where it names none), a
    refusal as `refused` answers it."""
    try:
        doc = await run_in_threadpool(document)
    except InvalidInput as exc:
        return JSONResponse({"message": str(exc), "field": exc.field or field}, status_code=422)
    except Forbidden as exc:
        return refused(exc)
    return JSONResponse(doc, headers={"Cache-Control": "no-store"})


def refused(exc: HvfleetError) -> JSONResponse:
    """A feed's refusal as JSON (its pages' scripts read `message`)."""
    code = http_status_of(exc)[0]
    code = code if code in (403, 404, 429) else 400
    return JSONResponse({"message": str(exc)}, status_code=code, headers={"Cache-Control": "no-store"})


async def who_is(request: Request) -> Identity | Response:
    """The caller, or the response that sends them to the login form (or says
    the fleet is still loading)."""
    try:
        who = await identify(ctx_of(request), request)
        waiting = await loaded(request)
        return waiting if waiting is not None else who
    except Unauthorized:
        ended = session_ended(request)
        if request.url.path.startswith("/dashboard/"):
            message = "your session has ended: log in again" if ended else "not logged in"
            return JSONResponse({"message": message}, status_code=401)
        target = await _return_to(request)
        query = {"next": target, **({"ended": "1"} if ended else {})}
        response = RedirectResponse(f"/login?{urlencode(query)}", status_code=303)
        if session_token(request) is not None:
            clear_session(response, request, ended=True)
        return response


Handler = Callable[[Request], Awaitable[Response]]


def signed_in(handler: Callable[[Request, Identity], Awaitable[Response]]) -> Handler:
    """The route of a page or feed for a signed-in caller, who `handler` is
    given; anyone else gets what `who_is` answers (the login form, a feed's
    401, the page that says the fleet is still loading)."""

    @functools.wraps(handler)
    async def route(request: Request) -> Response:
        who = await who_is(request)
        if isinstance(who, Response):
            return who
        return await handler(request, who)

    return route


# The most of a form carried back through the login (in the URL) after a session ended.
_RESUME_MAX = 2048


async def _return_to(request: Request) -> str:
    """Where to go back to after logging in: the page itself for a GET; for a
    form sent after its session ended, the page the form was on (its Referer,
    if this server's), with a host action's fields to fill the form again
    (`resume`; never sent again by itself)."""
    if request.method == "GET":
        return request.url.path + (f"?{request.url.query}" if request.url.query else "")
    referer = urlsplit(request.headers.get("referer", ""))
    own = referer.netloc == request.headers.get("host") and referer.path.startswith("/")
    back = referer.path if own else "/"
    host_page = request.url.path.removesuffix("/actions")
    if request.url.path.endswith("/actions") and back == host_page:
        try:
            # Read before anyone is known (the session ended): as small as a login's.
            form = await read_form(request, ANONYMOUS_FORM_MAX)
        except HvfleetError:
            return back
        fields = {k: v for k, v in form.items() if k not in ("csrf", "force", "confirm")}
        query = urlencode({"resume": "1", **fields})
        if len(query) <= _RESUME_MAX:
            return f"{back}?{query}"
    return back


def csrf_of(request: Request) -> str:
    return csrf_for(request)


def error_page(who: Identity | None, request: Request, exc: Exception) -> HTMLResponse:
    status = 403 if isinstance(exc, Forbidden) else 404 if isinstance(exc, NotFound) else \
        409 if isinstance(exc, Conflict) else 413 if isinstance(exc, TooLarge) else \
        422 if isinstance(exc, InvalidInput) else 500
    title = {403: "Forbidden", 404: "Not found", 409: "Conflict", 413: "Too large",
             422: "Invalid input"}.get(status, "Error")
    return page(request, "error.html", who, status, title=title, heading=title, message=str(exc))


def field_of(exc: HvfleetError, fields: dict[str, str]) -> str:
    """The form field a core error is about, from the field it names (never its
    text); `_form` when it names none of this form's."""
    where = exc.field or ""
    if where.startswith("resources."):
        r = where.removeprefix("resources.")
        return r if r in ("cpu", "memory") else "resources"
    return fields.get(where, "_form")


async def selector_error(ctx: ApiContext, text: str, must_match: bool) -> str | None:
    """Why a label selector typed into a form is unusable (None: it is fine)."""
    try:
        selector = parse_selector(text)
    except InvalidInput as exc:
        return str(exc)
    if must_match and not await run_in_threadpool(ctx.store.list_hypervisors, selector):
        return f"{text!r}: no hypervisor matches"
    return None
