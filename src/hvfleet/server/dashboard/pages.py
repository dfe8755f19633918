"""The dashboard's pages and feeds on `hvfleet serve` (docs/dashboard.md): login
and logout, the fleet overview (its JSON feed, heat map, history and event
stream), a host's page with the operator's actions, fit, and guests. Each
handler identifies the caller from the session cookie (session.py), asks the
server's Authorizer, and calls the same core functions as the CLI and the API
(`server.actions` for fit and guests, `operate` for writes, `feed` and
`model.views` for every figure).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from datetime import UTC, datetime
from importlib.resources import files
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from hvfleet.model import views
from hvfleet.model.errors import (
    Conflict,
    Forbidden,
    HvfleetError,
    InvalidInput,
    NotFound,
    TooLarge,
    TooManyRequests,
    Unauthorized,
)
from hvfleet.model.hypervisor import Hypervisor, Reservation
from hvfleet.model.selectors import parse_selector
from hvfleet.server import actions, bodies
from hvfleet.server.context import ApiContext
from hvfleet.server.dashboard import charts, history, operate
from hvfleet.server.dashboard.feed import HostRow, resource_names, sort_rows, totals
from hvfleet.server.dashboard.html import bar, csrf_field, esc, field, page, script_json, table
from hvfleet.server.dashboard.live import FleetState
from hvfleet.server.dashboard.metrics import metrics
from hvfleet.server.dashboard.session import (
    check_csrf,
    check_origin,
    clear_session,
    csrf_for,
    identify,
    session_token,
    set_session,
)
from hvfleet.server.identity import Action, Identity
from hvfleet.store.base import OwnershipConflict
from hvfleet.store.ownership import leaves

PER_PAGE = 100
# The login and logout forms are read before anyone is known: a token and a
# path fit in far less.
ANONYMOUS_FORM_MAX = 16 * 1024
MAX_PER_PAGE = 1000
# Seconds between comments that keep an idle event stream's connection open.
_KEEPALIVE_S = 15.0
_STATIC = {"dashboard.js": "text/javascript", "dashboard.css": "text/css", "host.js": "text/javascript",
           "guests.js": "text/javascript", "history.js": "text/javascript"}
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                               "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _ctx(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.ctx
    return ctx


def _state(request: Request) -> FleetState:
    state: FleetState = request.app.state.dashboard
    return state


async def _loaded(request: Request) -> Response | None:
    """None once the dashboard's picture of the fleet is loaded; else (after a
    short wait) a 503 that says so."""
    state = _state(request)
    if state.loaded.is_set() or await run_in_threadpool(state.loaded.wait, 30.0):
        return None
    return _html(page("Loading", "<h1>Loading the fleet</h1><p>The server is still reading the fleet; "
                      "reload in a moment.</p>"), 503)


def _html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=_SECURITY_HEADERS)


async def _form(request: Request, max_body: int | None = None) -> dict[str, str]:
    """The form's fields; its body is read at most `max_body` bytes far (the
    API's limit by default; the forms sent before a login, smaller)."""
    media = request.headers.get("content-type", "").split(";")[0].strip()
    if media != "application/x-www-form-urlencoded":
        raise InvalidInput(f"a form must be sent as application/x-www-form-urlencoded, not {media!r}")
    raw = await bodies.read_body(request, max_body or _ctx(request).limits.max_body)
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


def _only(rows: list[HostRow], visible: Visible) -> list[HostRow]:
    return rows if visible is None else [x for x in rows if x.name in visible]


def _refused(exc: HvfleetError) -> JSONResponse:
    """A feed's refusal as JSON (its pages' scripts read `message`)."""
    code = exc.http_status if exc.http_status in (403, 404, 429) else 400
    return JSONResponse({"message": str(exc)}, status_code=code, headers={"Cache-Control": "no-store"})


async def _who(request: Request) -> Identity | Response:
    """The caller, or the response that sends them to the login form (or says
    the fleet is still loading)."""
    try:
        who = await identify(_ctx(request), request)
        waiting = await _loaded(request)
        return waiting if waiting is not None else who
    except Unauthorized:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        if request.url.path.startswith("/dashboard/"):
            return JSONResponse({"message": "not logged in"}, status_code=401)
        return RedirectResponse(f"/login?next={quote(target)}", status_code=303)


def _csrf(request: Request) -> str:
    return csrf_for(request)


def _error_page(who: Identity | None, request: Request, exc: Exception) -> HTMLResponse:
    status = 403 if isinstance(exc, Forbidden) else 404 if isinstance(exc, NotFound) else \
        409 if isinstance(exc, Conflict) else 413 if isinstance(exc, TooLarge) else \
        422 if isinstance(exc, InvalidInput) else 500
    title = {403: "Forbidden", 404: "Not found", 409: "Conflict", 413: "Too large",
             422: "Invalid input"}.get(status, "Error")
    body = (f'<h1>{title}</h1><p class="error" role="alert">{esc(exc)}</p>'
            '<p><a href="/">Back to the overview</a></p>')
    return _html(page(title, body, who, _csrf(request)), status)


# -- login --------------------------------------------------------------------------------------

def _login_page(message: str = "", next_: str = "/") -> str:
    errors = {"token": message} if message else {}
    body = ('<h1>Log in</h1><p>Paste an hvfleet token (<code>hvfleet token create</code>). '
            'It is kept in an HttpOnly cookie of this browser session.</p>'
            f'<form method="post" action="/login" class="login">'
            f'<input type="hidden" name="next" value="{esc(next_)}">'
            + field("token", "Token", "", errors, kind="password", required=True)
            + '<button type="submit">Log in</button></form>')
    return page("Log in", body)


def _safe_next(value: str) -> str:
    return value if value.startswith("/") and not value.startswith("//") else "/"


async def login(request: Request) -> Response:
    if request.method == "GET":
        return _html(_login_page(next_=_safe_next(request.query_params.get("next", "/"))))
    try:
        check_origin(request)
        form = await _form(request, ANONYMOUS_FORM_MAX)
    except HvfleetError as exc:
        return _error_page(None, request, exc)
    token = form.get("token", "").strip()
    next_ = _safe_next(form.get("next", "/"))
    if not token:
        return _html(_login_page("required: paste your token", next_), 422)
    try:
        await run_in_threadpool(_ctx(request).authenticator.authenticate, f"Bearer {token}")
    except Unauthorized:
        return _html(_login_page("this token is unknown, expired or revoked", next_), 401)
    response = RedirectResponse(next_, status_code=303)
    set_session(response, request, token)
    return response


async def logout(request: Request) -> Response:
    try:
        check_csrf(request, await _form(request, ANONYMOUS_FORM_MAX))
    except HvfleetError as exc:
        return _error_page(None, request, exc)
    response = RedirectResponse("/login", status_code=303)
    clear_session(response, request)
    return response


# -- the overview ----------------------------------------------------------------------------------

def overview_document(state: FleetState, selector_text: str, sort: str, page_no: int,
                      per_page: int, visible: Visible = None) -> dict[str, Any]:
    """One page of the overview: the hosts on it (feed rows), the totals of every
    host the selector matches, and totals per label value; of the hosts the
    caller may see (`visible`, None: every host)."""
    selector = parse_selector(selector_text)
    rows = _only(state.select(selector), visible)
    ordered = sort_rows(rows, sort) if sort and sort != "name" else rows
    pages = max(1, math.ceil(len(ordered) / per_page))
    page_no = min(max(1, page_no), pages)
    shown = ordered[(page_no - 1) * per_page: page_no * per_page]
    groups: dict[str, dict[str, Any]] = {}
    values: dict[str, dict[str, list[Any]]] = {}
    for x in rows:
        for k, v in x.labels.items():
            values.setdefault(k, {}).setdefault(v, []).append(x)
    for k, by_value in sorted(values.items()):
        if len(by_value) > 50:  # a label with a value per host (e.g. a serial) is no grouping
            continue
        groups[k] = {v: _group_totals(state, selector_text, k, v, members) if visible is None
                     else totals(members) for v, members in sorted(by_value.items())}
    return {
        "version": state.version,
        "selector": str(selector),
        "sort": sort or "name",
        "resources": resource_names(rows),
        "count": len(rows),
        "page": page_no, "pages": pages, "perPage": per_page,
        "total": state.totals_for(selector, rows) if visible is None else totals(rows),
        "groups": groups,
        "hosts": [x.doc for x in shown],
    }


def _group_totals(state: FleetState, selector_text: str, key: str, value: str,
                  members: list[Any]) -> dict[str, Any]:
    return state.totals_for(parse_selector(selector_text), members, (key, value))


def heat_document(state: FleetState, selector_text: str, sort: str,
                  visible: Visible = None) -> dict[str, Any]:
    rows = _only(state.select(parse_selector(selector_text)), visible)
    ordered = sort_rows(rows, sort) if sort and sort != "name" else rows
    rs = resource_names(rows)
    return {
        "version": state.version, "resources": rs,
        "names": [x.name for x in ordered],
        "states": [x.doc["readiness"]["state"] for x in ordered],
        "use": [[(x.doc["resources"].get(r) or {}).get("use") for r in rs] for x in ordered],
    }


def _ints(request: Request, name: str, default: int, high: int) -> int:
    value = bodies.query_int(request, name, low=1, high=high)
    return default if value is None else value


def _overview_args(request: Request) -> tuple[str, str, int, int]:
    q = request.query_params
    return (q.get("selector", ""), q.get("sort", "name"), _ints(request, "page", 1, 10**9),
            _ints(request, "perPage", PER_PAGE, MAX_PER_PAGE))


async def overview(request: Request) -> Response:
    who = await _who(request)
    if isinstance(who, Response):
        return who
    state = _state(request)
    try:
        visible = visible_hosts(_ctx(request), who)
    except Forbidden as exc:
        return _error_page(who, request, exc)
    try:
        selector_text, sort, page_no, per_page = _overview_args(request)
        doc = await run_in_threadpool(overview_document, state, selector_text, sort, page_no, per_page,
                                      visible)
        error = ""
    except InvalidInput as exc:
        selector_text, sort, page_no, per_page = request.query_params.get("selector", ""), "name", 1, PER_PAGE
        doc = await run_in_threadpool(overview_document, state, "", "name", 1, PER_PAGE, visible)
        error = str(exc)
    sorts = [("name", "name")] + [(f"{how}:{r}", f"{how} {r}") for r in doc["resources"]
                                  for how in ("free", "used")]
    initial = script_json(doc)
    body = (
        '<h1>Fleet overview</h1>'
        '<form id="filter" method="get" action="/" class="filter" role="search">'
        + field("selector", "Label selector", selector_text,
                {"selector": error} if error else None, hint="e.g. az=az1,role in (compute,gpu)")
        + field("sort", "Sort by", sort, kind="select", options=sorts)
        + f'<input type="hidden" name="perPage" value="{per_page}">'
        '<button type="submit">Apply</button></form>'
        '<p id="live-status" class="live" aria-live="polite">Live updates: connecting…</p>'
        '<section aria-labelledby="totals-h"><h2 id="totals-h">Totals</h2><div id="totals"></div></section>'
        '<section aria-labelledby="groups-h"><h2 id="groups-h">Totals per label value</h2>'
        '<div id="groups"></div></section>'
        '<section aria-labelledby="hosts-h"><h2 id="hosts-h">Hypervisors</h2>'
        '<p class="legend">Bars: <span class="key alloc">allocated</span> <span class="key held">held by '
        'reservations</span> <span class="key free">free</span>, ending at effective capacity; '
        '<span class="key raw">|</span> marks raw capacity (× is the overcommit ratio).</p>'
        '<div id="hosts"></div><nav id="pager" aria-label="Pages"></nav></section>'
        '<section aria-labelledby="heat-h"><h2 id="heat-h">Heat map</h2>'
        '<p class="legend">One map per resource, one tile per host (in the table\'s order), coloured '
        'by the share of effective capacity in use: <span class="key h0">0–50%</span> '
        '<span class="key h1">50–80%</span> '
        '<span class="key h2">80–95%</span> <span class="key h3">95–100%</span> '
        '<span class="key h4">over 100%</span>; not ready hosts are marked with a dark left edge. '
        'Select a cell (or use the arrow keys) to read it.</p>'
        '<div id="heat"></div><p id="heat-cell" aria-live="polite"></p></section>'
        '<section aria-labelledby="history-h" class="fleet-history"><h2 id="history-h">Fleet history</h2>'
        '<p><a href="/history">History per label value, over a day or a week</a></p>'
        + (history_html(request, history.FLEET, "The fleet", "hour", "/history") if visible is None
           else "<p>Your role sees one host: its history is on its page.</p>")
        + '</section>'
        f'<script type="application/json" id="initial">{initial}</script>'
    )
    return _html(page("Fleet overview", body, who, _csrf(request), ["dashboard.js", "history.js"],
                      "overview"))


async def overview_json(request: Request) -> Response:
    who = await _who(request)
    if isinstance(who, Response):
        return who
    try:
        visible = visible_hosts(_ctx(request), who)
        selector_text, sort, page_no, per_page = _overview_args(request)
        doc = await run_in_threadpool(overview_document, _state(request), selector_text, sort,
                                      page_no, per_page, visible)
    except InvalidInput as exc:
        return JSONResponse({"message": str(exc), "field": exc.field or "selector"}, status_code=422)
    except Forbidden as exc:
        return _refused(exc)
    return JSONResponse(doc, headers={"Cache-Control": "no-store"})


async def heat_json(request: Request) -> Response:
    who = await _who(request)
    if isinstance(who, Response):
        return who
    q = request.query_params
    try:
        visible = visible_hosts(_ctx(request), who)
        doc = await run_in_threadpool(heat_document, _state(request), q.get("selector", ""),
                                      q.get("sort", "name"), visible)
    except InvalidInput as exc:
        return JSONResponse({"message": str(exc)}, status_code=422)
    except Forbidden as exc:
        return _refused(exc)
    return JSONResponse(doc, headers={"Cache-Control": "no-store"})


def _may_follow(ctx: ApiContext, who: Identity, host: str | None) -> Visible:
    """Forbidden unless the caller may see `host` (None: the whole fleet, which
    only a caller who may list every host sees); the hosts it may see."""
    visible = visible_hosts(ctx, who)
    if visible is not None and (host is None or host not in visible):
        what = f'hypervisors.hvfleet.io "{host}"' if host else "the fleet's history"
        raise Forbidden(f'{what} is forbidden: User "{who.subject}" may see only its own '
                        f"hypervisor ({', '.join(sorted(visible))})")
    return visible


async def history_json(request: Request) -> Response:
    who = await _who(request)
    if isinstance(who, Response):
        return who
    q = request.query_params
    host = q.get("host")
    series = q.get("series") or (history.host_series(host) if host else history.FLEET)
    range_name = q.get("range", "hour")
    try:
        _, host = history.parse_series(series)
        if range_name not in history.RANGES:
            raise InvalidInput(f"{range_name!r}: expected one of {', '.join(history.RANGES)}", field="range")
        _may_follow(_ctx(request), who, host)
        doc = await run_in_threadpool(_history_document, request, series, range_name)
    except InvalidInput as exc:
        return JSONResponse({"message": str(exc), "field": exc.field}, status_code=422)
    except Forbidden as exc:
        return _refused(exc)
    return JSONResponse(doc, headers={"Cache-Control": "no-store"})


async def history_fragment(request: Request) -> Response:
    """One series' history section as HTML (what history.js puts in place every 30 s)."""
    who = await _who(request)
    if isinstance(who, Response):
        return who
    q = request.query_params
    series, range_name = q.get("series", history.FLEET), q.get("range", "hour")
    try:
        _, host = history.parse_series(series)
        _may_follow(_ctx(request), who, host)
        heading = f"Hypervisor {host}" if host else _series_heading(series)
        path = f"/hosts/{quote(host)}" if host else "/history"
        html = await run_in_threadpool(history_html, request, series, heading, range_name, path)
    except InvalidInput as exc:
        return _refused(exc)
    except Forbidden as exc:
        return _refused(exc)
    return _html(html)


def _series_heading(series: str) -> str:
    return "The fleet" if series == history.FLEET else f"Hosts with {series.removeprefix('label:')}"


async def history_page(request: Request) -> Response:
    """The fleet's and each label value's history (`?series=label:az=az1&range=day`)."""
    who = await _who(request)
    if isinstance(who, Response):
        return who
    q = request.query_params
    series = q.get("series", history.FLEET)
    try:
        _, host = history.parse_series(series)
        if host is not None:
            return RedirectResponse(f"/hosts/{quote(host)}?{urlencode({'range': q.get('range', 'hour')})}",
                                    status_code=303)
        _may_follow(_ctx(request), who, None)
    except (InvalidInput, Forbidden) as exc:
        return _error_page(who, request, exc)
    state = _state(request)
    groups = await run_in_threadpool(history.group_figures, state)
    choices = sorted(groups, key=lambda s: (s != history.FLEET, s))
    current = ' aria-current="page"'
    links = "".join(
        f'<li><a href="/history?{esc(urlencode({"series": s, "range": q.get("range", "hour")}))}"'
        f'{current if s == series else ""}>{esc(_series_heading(s))}</a></li>'
        for s in choices)
    charts_html = await run_in_threadpool(history_html, request, series, _series_heading(series),
                                          q.get("range", "hour"), "/history")
    body = ('<h1>History</h1><p>Allocated, held by reservations and effective capacity per resource, '
            'as the store keeps them (the same on every server).</p>'
            f'<nav aria-label="Series" class="series"><ul>{links}</ul></nav>{charts_html}')
    return _html(page("History", body, who, _csrf(request), ["history.js"], current="history"))


def _history_document(request: Request, series: str, range_name: str) -> dict[str, Any]:
    keeper: history.HistoryKeeper = request.app.state.history
    tier = keeper.settings.tier_for(history.RANGES[range_name])
    points = history.read_points(_ctx(request).store, series, tier)
    return history.chart_document(series, range_name, tier, points, int(time.time()))


async def events(request: Request) -> Response:
    """Server-sent events: `change` with the hosts whose row changed (an empty
    list: anything may have changed), from the dashboard's follower of the watch."""
    who = await _who(request)
    if isinstance(who, Response):
        return who
    ctx, state = _ctx(request), _state(request)
    host = request.query_params.get("host")
    try:
        visible = _may_follow(ctx, who, host) if host is not None else visible_hosts(ctx, who)
        # One pool of streams per token with the API's watches (WatchLimits.per_token).
        release = ctx.hub.acquire(who.token_id)
    except (Forbidden, TooManyRequests) as exc:
        return _refused(exc)
    authorization = f"Bearer {session_token(request)}"
    recheck = ctx.limits.token_recheck
    queue = state.listen()

    async def stream() -> Any:
        try:
            yield f"event: hello\ndata: {json.dumps({'version': state.version})}\n\n".encode()
            checked = sent = time.monotonic()
            while True:
                names: set[str] | None = None
                with contextlib.suppress(TimeoutError):
                    names = await asyncio.wait_for(queue.get(), min(recheck, _KEEPALIVE_S))
                if time.monotonic() - checked >= recheck:
                    # A revoked or expired token ends the stream (the cache keeps this cheap).
                    checked = time.monotonic()
                    try:
                        await run_in_threadpool(ctx.authenticator.authenticate, authorization)
                    except Unauthorized as exc:
                        yield f"event: ended\ndata: {json.dumps({'message': str(exc)})}\n\n".encode()
                        return
                if names is None:
                    if time.monotonic() - sent >= _KEEPALIVE_S:
                        sent = time.monotonic()
                        yield b": keepalive\n\n"
                    continue
                if visible is not None and names:
                    names &= visible
                    if not names:
                        continue  # only hosts this caller does not see changed
                if host is not None and names and host not in names:
                    continue
                data = json.dumps({"hosts": sorted(names), "version": state.version})
                sent = time.monotonic()
                yield f"event: change\ndata: {data}\n\n".encode()
        finally:
            state.unlisten(queue)
            release()

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


# -- a host ------------------------------------------------------------------------------------------

def _when(ts: datetime | None) -> str:
    return ts.isoformat(timespec="seconds") if ts else "-"


def _spec_rows(h: Hypervisor, owners: dict[str, str]) -> list[list[str]]:
    spec = h.to_dict().get("spec", {})
    rows = []
    for path, value in sorted(leaves(spec, ("spec",)).items()):
        key = ".".join(path)
        owner = owners.get(key) or next((m for p, m in owners.items() if key.startswith(p + ".")), "-")
        rows.append([key, json.dumps(value) if not isinstance(value, str) else value, owner])
    return rows


def host_live_html(state: FleetState, ctx: ApiContext, name: str) -> str:
    """The parts of a host's page that follow the watch."""
    with state.lock:
        h = state.hosts.get(name)
        row = state.rows.get(name)
        mine = [r for r in state.reservations.values() if r.spec.hypervisor == name]
        recent = list(state.recent.get(name, ()))
        policies = state.policy_list()
    if h is None or row is None:
        raise NotFound(f"hypervisor {name!r} not found")
    now = datetime.now(UTC)
    doc = row.doc
    rd = doc["readiness"]
    owners = state.owners_of(name)
    parts = [
        f'<p class="state state-{esc(rd["state"])}"><strong>{esc(rd["state"])}</strong> '
        f'({esc(rd["reason"])}): {esc(rd["message"])}</p>',
        f'<p>Synced: <strong>{esc(doc["synced"]["state"])}</strong> — {esc(doc["synced"]["message"])}</p>',
        '<h2 id="cap-h">Capacity</h2>',
        '<div class="bars">' + "".join(bar(r, x) for r, x in doc["resources"].items()) + "</div>",
        table([c.name for c in views.capacity_detail_columns()],
              views.capacity_detail_rows(h, mine, now, policies), "Capacity per resource", cls="capacity"),
        '<h2>Spec</h2>',
        table(["Field", "Value", "Owner (managedFields)"], _spec_rows(h, owners),
              "Each spec field and the manager that owns it", cls="spec") if h.spec.model_dump(
                  exclude_defaults=True) else "<p>No spec fields are set.</p>",
        '<h2>NUMA cells</h2>',
    ]
    if h.status.cells:
        from hvfleet.model import capacity as cap
        cell_bars = []
        for c in h.status.cells:
            eff = cap.cell_effective_capacity(c, h.status.capacity, h, policies)
            for r in sorted(c.capacity, key=str):
                used = c.allocation.get(r)
                e = eff.get(r)
                share = (float(used.value) / float(e.value)) if used is not None and e else 0.0
                cell_bars.append(
                    f'<div class="res"><span class="rname">cell {c.id} {esc(r)}</span>'
                    f'<span class="bar" role="img" aria-label="cell {c.id} {esc(r)}: '
                    f'{esc(views.human(r, used))} of {esc(views.human(r, e))} effective">'
                    f'<span class="seg alloc" style="width:{min(share, 1) * 100:.2f}%"></span></span>'
                    f'<span class="btext">{esc(views.human(r, used))} / '
                    f'{esc(views.human(r, e))}</span></div>')
        parts.append('<div class="bars">' + "".join(cell_bars) + "</div>")
        parts.append(table([c.name for c in views.cell_columns()], views.cell_rows(h, policies),
                           "NUMA cells"))
    else:
        parts.append("<p>The agent reported no NUMA cells.</p>")
    parts.append("<h2>Instances</h2>")
    parts.append(table(["Name", "UUID", "State", "Resources"],
                       [[i.name, i.uuid, i.state, ", ".join(f"{k}={views.human(k, v)}"
                                                           for k, v in sorted(i.resources.items()))]
                        for i in h.status.instances], f"{len(h.status.instances)} instances")
                 if h.status.instances else "<p>No instances.</p>")
    parts.append("<h2>Reservations</h2>")
    parts.append(table([c.name for c in views.reservation_columns(True)],
                       [views.reservation_row(r, h, now, True) for r in sorted(mine, key=lambda r: r.name)],
                       "Reservations on this host, with phase and expiry") if mine
                 else "<p>No reservations.</p>")
    parts.append("<h2>Conditions</h2>")
    parts.append(table(["Type", "Status", "Reason", "Message", "Last transition"],
                       [[c.type, c.status, c.reason, c.message, _when(c.last_transition_time)]
                        for c in h.status.conditions], "Conditions") if h.status.conditions
                 else "<p>No conditions reported.</p>")
    parts.append(f"<p>Last heartbeat: {esc(_when(h.status.last_heartbeat_time))}</p>")
    parts.append("<h2>Recent changes</h2>")
    parts.append(table(["At", "Event", "Object", "Revision", "Last writer", "Changed"],
                       [[c.at, c.type, f"{c.kind}/{c.name}", c.resource_version, c.manager,
                         ", ".join(c.fields)] for c in recent], "From the watch, newest first",
                       cls="recent") if recent else "<p>No changes seen since the server started.</p>")
    return "".join(parts)


def history_html(request: Request, series: str, heading: str, range_name: str, path: str,
                 prefix: str = "hist") -> str:
    """One series' history charts (charts.py), with links to the other ranges of `path`."""
    if range_name not in history.RANGES:
        range_name = "hour"
    doc = _history_document(request, series, range_name)
    query = {k: v for k, v in request.query_params.items() if k not in ("range", "notice")}

    def link(key: str) -> str:
        return f"{path}?{urlencode({**query, 'range': key})}#{prefix}-h"

    return charts.render(doc, heading, link, prefix)


def _actions_html(ctx: ApiContext, who: Identity, h: Hypervisor, csrf: str, errors: dict[str, str],
                  values: dict[str, str], form: str) -> str:
    name = h.name
    can_edit = operate.allowed(ctx, who, Action("patch", "hypervisors", name=name))
    can_reserve = operate.allowed(ctx, who, Action("create", "reservations"))
    if not (can_edit or can_reserve):
        return ""
    out = ['<section aria-labelledby="actions-h" class="actions"><h2 id="actions-h">Actions</h2>']
    act = f"/hosts/{quote(name)}/actions"

    def errs(which: str) -> dict[str, str]:
        return errors if form == which else {}

    def val(which: str, key: str, default: str = "") -> str:
        return values.get(key, default) if form == which else default

    if can_edit:
        out.append(
            f'<form method="post" action="{act}" class="action"><h3>Set an overcommit ratio</h3>'
            f'{csrf_field(csrf)}<input type="hidden" name="action" value="overcommit-set">'
            + field("resource", "Resource", val("overcommit-set", "resource", "cpu"), errs("overcommit-set"),
                    form="ocs")
            + field("ratio", "Ratio", val("overcommit-set", "ratio"), errs("overcommit-set"), form="ocs",
                    hint="a number > 0, e.g. 4 or 1.5")
            + '<button type="submit">Set ratio</button></form>')
        out.append(
            f'<form method="post" action="{act}" class="action"><h3>Unset an overcommit ratio</h3>'
            f'{csrf_field(csrf)}<input type="hidden" name="action" value="overcommit-unset">'
            + field("resource", "Resource", val("overcommit-unset", "resource"), errs("overcommit-unset"),
                    form="ocu", hint="back to ratio 1")
            + '<button type="submit">Unset ratio</button></form>')
        out.append(
            f'<form method="post" action="{act}" class="action"><h3>Maintenance</h3>'
            f'{csrf_field(csrf)}<input type="hidden" name="action" value="maintenance">'
            + field("mode", "Mode", val("maintenance", "mode", h.spec.maintenance), errs("maintenance"),
                    kind="select", form="mt",
                    options=[("", "none"), ("manual", "manual"), ("drain", "drain")])
            + field("reason", "Reason", val("maintenance", "reason", h.spec.maintenance_reason),
                    errs("maintenance"), form="mt", hint="required for manual")
            + '<button type="submit">Save maintenance</button></form>')
    if can_reserve:
        out.append(
            f'<form method="post" action="{act}" class="action"><h3>Reserve space</h3>'
            f'{csrf_field(csrf)}<input type="hidden" name="action" value="reserve">'
            + field("cpu", "CPU", val("reserve", "cpu"), errs("reserve"), form="rs")
            + field("memory", "Memory", val("reserve", "memory"), errs("reserve"), form="rs", hint="e.g. 4Gi")
            + field("consumer", "Consumer (instance UUID)", val("reserve", "consumer"), errs("reserve"),
                    form="rs")
            + field("ttl", "Expires after", val("reserve", "ttl", "10m"), errs("reserve"), form="rs",
                    hint="a duration, e.g. 10m; 0 never expires")
            + '<button type="submit">Reserve</button></form>')
    out.append("</section>")
    return "".join(out)


def _host_page(request: Request, who: Identity, name: str, notice: str = "",
               errors: dict[str, str] | None = None, values: dict[str, str] | None = None,
               form: str = "", extra: str = "") -> str:
    ctx, state = _ctx(request), _state(request)
    state.fresh()
    live = host_live_html(state, ctx, name)
    with state.lock:
        h = state.hosts[name]
    csrf = _csrf(request)
    labels = ", ".join(f"{k}={v}" for k, v in sorted(h.metadata.labels.items())) or "none"
    body = (f'<h1>Hypervisor {esc(name)}</h1><p>Labels: {esc(labels)}</p>'
            + (f'<p class="notice" role="status">{esc(notice)}</p>' if notice else "")
            + extra
            + _actions_html(ctx, who, h, csrf, errors or {}, values or {}, form)
            + f'<div id="live" data-host="{esc(name)}">{live}</div>'
            + '<h2 id="history-h">History</h2>'
            + history_html(request, history.host_series(name), f"Hypervisor {name}",
                           request.query_params.get("range", "hour"), f"/hosts/{quote(name)}"))
    return page(f"Hypervisor {name}", body, who, csrf, ["host.js", "history.js"])


async def host(request: Request) -> Response:
    who = await _who(request)
    if isinstance(who, Response):
        return who
    name = request.path_params["name"]
    try:
        await run_in_threadpool(_ctx(request).authorize, who, Action("get", "hypervisors", name=name))
        if request.query_params.get("part") == "live":
            html = await run_in_threadpool(host_live_html, _state(request), _ctx(request), name)
            return _html(html)
        notice = request.query_params.get("notice", "")
        return _html(await run_in_threadpool(_host_page, request, who, name, notice))
    except HvfleetError as exc:
        return _error_page(who, request, exc)


def _conflict_html(name: str, form: dict[str, str], exc: OwnershipConflict, csrf: str) -> str:
    owners = ", ".join(f"{f} is owned by {m}" for f, m in exc.conflicts) or str(exc)
    hidden = "".join(f'<input type="hidden" name="{esc(k)}" value="{esc(v)}">'
                     for k, v in form.items() if k not in ("csrf", "force"))
    return ('<section class="conflict" aria-labelledby="conflict-h">'
            '<h2 id="conflict-h">Ownership conflict</h2>'
            f'<p role="alert">Nothing was written: {esc(owners)}.</p>'
            f'<form method="post" action="/hosts/{quote(name)}/actions">{csrf_field(csrf)}{hidden}'
            f'<input type="hidden" name="force" value="true">'
            f'<button type="submit" class="danger">Take the field over (force)</button></form></section>')


def _run_action(ctx: ApiContext, who: Identity, name: str, form: dict[str, str]) -> str:
    kind = form.get("action", "")
    force = form.get("force") == "true"
    if kind == "overcommit-set":
        h = operate.set_overcommit(ctx, who, name, form.get("resource", ""), form.get("ratio", ""), force)
        return f"overcommit {form.get('resource', '').strip()} set to {form.get('ratio', '').strip()} " \
               f"(generation {h.metadata.generation})"
    if kind == "overcommit-unset":
        h = operate.unset_overcommit(ctx, who, name, form.get("resource", ""), force)
        return f"overcommit {form.get('resource', '').strip()} unset (generation {h.metadata.generation})"
    if kind == "maintenance":
        h = operate.set_maintenance(ctx, who, name, form.get("mode", ""), form.get("reason", ""), force)
        return f"maintenance: {h.spec.maintenance or 'none'} (generation {h.metadata.generation})"
    if kind == "reserve":
        r: Reservation = operate.reserve_on(ctx, who, name, form.get("cpu", ""), form.get("memory", ""),
                                            form.get("consumer", ""), form.get("ttl", ""))
        return f"reservation {r.name} is {r.status.phase}"
    raise InvalidInput(f"unknown action {kind!r}", field="action")


async def host_action(request: Request) -> Response:
    who = await _who(request)
    if isinstance(who, Response):
        return who
    name = request.path_params["name"]
    ctx, state = _ctx(request), _state(request)
    try:
        form = await _form(request)
        check_csrf(request, form)
    except HvfleetError as exc:
        return _error_page(who, request, exc)
    kind = form.get("action", "")
    try:
        notice = await run_in_threadpool(_run_action, ctx, who, name, form)
    except operate.FormError as exc:
        assert exc.field is not None
        html = await run_in_threadpool(_host_page, request, who, name, "", {exc.field: exc.detail},
                                       form, kind)
        return _html(html, 422)
    except OwnershipConflict as exc:
        extra = _conflict_html(name, form, exc, _csrf(request))
        html = await run_in_threadpool(_host_page, request, who, name, "", None, form, kind, extra)
        return _html(html, 409)
    except Forbidden as exc:
        return _error_page(who, request, exc)
    except InvalidInput as exc:  # refused by the core after the form checks (e.g. the spec's rules)
        field_name = {"overcommit-set": "ratio", "overcommit-unset": "resource", "maintenance": "reason",
                      "reserve": "cpu"}.get(kind, "action")
        html = await run_in_threadpool(_host_page, request, who, name, "", {field_name: str(exc)}, form, kind)
        return _html(html, 422)
    except HvfleetError as exc:  # does not fit, not found, ...
        html = await run_in_threadpool(
            _host_page, request, who, name, "", None, form, kind,
            f'<p class="error" role="alert">Nothing was written: {esc(exc)}</p>')
        return _html(html, 409 if isinstance(exc, Conflict) else 422)
    # Show the new state now, not a watch event later.
    await asyncio.sleep(0)
    state.fresh()
    return RedirectResponse(f"/hosts/{quote(name)}?{urlencode({'notice': notice})}", status_code=303)


# -- fit ---------------------------------------------------------------------------------------------

def _fit_body(q: dict[str, str]) -> tuple[actions.FitBody, dict[str, str]]:
    resources: dict[str, str | int] = {}
    errors: dict[str, str] = {}
    for key in ("cpu", "memory"):
        if q.get(key, "").strip():
            resources[key] = q[key].strip()
    for part in (p.strip() for p in q.get("resources", "").split(",")):
        if not part:
            continue
        k, sep, v = part.partition("=")
        if not sep or not k.strip() or not v.strip():
            errors["resources"] = f"{part!r}: expected RESOURCE=QUANTITY, e.g. VGPU=1"
            continue
        resources[k.strip()] = v.strip()
    count = q.get("count", "1").strip() or "1"
    if not count.isdigit() or int(count) < 1:
        errors["count"] = f"{count!r} is not a whole number of at least 1"
    weigher = q.get("weigher", "binpack")
    if weigher not in ("binpack", "spread"):
        errors["weigher"] = f"{weigher!r} is not binpack or spread"
    if not resources and not errors:
        errors["cpu"] = "give at least one resource (cpu, memory or others)"
    body = actions.FitBody(resources=resources, count=int(count) if count.isdigit() and int(count) else 1,
                           label_selector=q.get("selector", ""),
                           weigher="spread" if weigher == "spread" else "binpack", why=True)
    return body, errors


def _field_of(exc: InvalidInput, fields: dict[str, str]) -> str:
    """The form field a core error is about, from the field it names (never its
    text); `_form` when it names none of this form's."""
    where = exc.field or ""
    if where.startswith("resources."):
        r = where.removeprefix("resources.")
        return r if r in ("cpu", "memory") else "resources"
    return fields.get(where, "_form")


def _form_error(errors: dict[str, str]) -> str:
    message = errors.get("_form")
    return f'<p class="error" role="alert">Error: {esc(message)}</p>' if message else ""


async def _selector_error(ctx: ApiContext, text: str, must_match: bool) -> str | None:
    """Why a label selector typed into a form is unusable (None: it is fine)."""
    try:
        selector = parse_selector(text)
    except InvalidInput as exc:
        return str(exc)
    if must_match and not await run_in_threadpool(ctx.store.list_hypervisors, selector):
        return f"{text!r}: no hypervisor matches"
    return None


_FIT_FIELDS = {"resources": "resources", "count": "count", "weigher": "weigher"}
_GUEST_FIELDS = {k: k for k in ("os", "name", "vcpus", "memory", "disks", "firmware")}


async def fit_page(request: Request) -> Response:
    who = await _who(request)
    if isinstance(who, Response):
        return who
    ctx = _ctx(request)
    q = dict(request.query_params)
    errors: dict[str, str] = {}
    result = ""
    status = 200
    if any(q.get(k) for k in ("cpu", "memory", "resources")) or "go" in q:
        body, errors = _fit_body(q)
        wrong = await _selector_error(ctx, q.get("selector", ""), must_match=False)
        if wrong:
            errors["selector"] = wrong
        if not errors:
            try:
                doc = await run_in_threadpool(actions._fit, ctx, who, body)
                result = _fit_result_html(doc)
            except InvalidInput as exc:
                errors[_field_of(exc, _FIT_FIELDS)] = str(exc)
            except Forbidden as exc:
                return _error_page(who, request, exc)
        if errors:
            status = 422
    form = (_form_error(errors) + '<form method="get" action="/fit" class="fit">'
            '<input type="hidden" name="go" value="1">'
            + field("cpu", "CPU", q.get("cpu", ""), errors, hint="e.g. 4")
            + field("memory", "Memory", q.get("memory", ""), errors, hint="e.g. 8Gi")
            + field("resources", "Other resources", q.get("resources", ""), errors,
                    hint="comma-separated RESOURCE=QUANTITY, e.g. VGPU=1,CUSTOM_NIC_VF=2")
            + field("count", "Count", q.get("count", "1"), errors, hint="instances on one host")
            + field("selector", "Label selector", q.get("selector", ""), errors)
            + field("weigher", "Weigher", q.get("weigher", "binpack"), errors, kind="select",
                    options=[("binpack", "binpack (fullest first)"), ("spread", "spread (emptiest first)")])
            + '<button type="submit">Fit</button></form>')
    html = page("Fit", f"<h1>Where does it fit?</h1>{form}{result}", who, _csrf(request), current="fit")
    return _html(html, status)


def _fit_result_html(doc: dict[str, Any]) -> str:
    cands = doc["candidates"]
    rows = [[str(i + 1), c["name"], f'{c["score"]:.6g}',
             ", ".join(f"{k}={v}" for k, v in c["free"].items())] for i, c in enumerate(cands)]
    out = [f'<h2>Ranked hosts</h2><p id="fit-summary">{doc["fitting"]} of {doc["considered"]} hosts fit '
           f'({esc(doc["weigher"])}).</p>']
    out.append(table(["Rank", "Host", "Score", "Free"], rows, "Hosts the request fits on, best first",
                     cls="candidates") if cands else '<p role="status">No host fits.</p>')
    rejected = doc.get("rejected", {})
    if rejected:
        out.append("<h2>Hosts it does not fit</h2>")
        out.append(table(["Host", "Why not"], [[n, "; ".join(r["message"] for r in found)]
                                               for n, found in rejected.items()],
                         "Every other host and the reason", cls="rejected"))
    return "".join(out)


# -- guests ------------------------------------------------------------------------------------------

def _guest_body(q: dict[str, str]) -> tuple[actions.GuestBody | None, dict[str, str]]:
    errors: dict[str, str] = {}
    for key, label in (("os", "an osinfo short id, e.g. rhel9.1"), ("name", "a domain name"),
                       ("selector", "a label selector for the group")):
        if not q.get(key, "").strip():
            errors[key] = f"required: {label}"
    vcpus = q.get("vcpus", "").strip()
    if not vcpus.isdigit() or int(vcpus) < 1:
        errors["vcpus"] = f"{vcpus!r} is not a whole number of at least 1"
    if not q.get("memory", "").strip():
        errors["memory"] = "required, e.g. 4Gi"
    if errors:
        return None, errors
    disks = [d.strip() for d in q.get("disks", "").split(";") if d.strip()]
    return actions.GuestBody(os=q["os"].strip(), name=q["name"].strip(), vcpus=int(vcpus),
                             memory=q["memory"].strip(), disks=disks, firmware=q.get("firmware", "auto"),
                             label_selector=q["selector"].strip(), explain=True), {}


async def guests_page(request: Request) -> Response:
    who = await _who(request)
    if isinstance(who, Response):
        return who
    ctx = _ctx(request)
    q = dict(request.query_params)
    errors: dict[str, str] = {}
    result = ""
    status = 200
    if "go" in q:
        body, errors = _guest_body(q)
        if body is not None:
            try:  # before the selector is tried against the fleet, which tells what exists
                ctx.authorize(who, Action("create", "guests", name="generate"))
            except Forbidden as exc:
                return _error_page(who, request, exc)
            wrong = await _selector_error(ctx, body.label_selector, must_match=True)
            if wrong:
                errors["selector"] = wrong
                body = None
        if body is not None:
            try:
                doc = await run_in_threadpool(actions._generate, ctx, who, body)
                if q.get("download"):
                    return Response(doc["xml"], media_type="application/xml", headers={
                        "Content-Disposition": f'attachment; filename="{quote(body.name)}.xml"'})
                link = "/guests?" + urlencode({**q, "download": "1"})
                result = (f'<h2>Generated domain XML</h2><p><a href="{esc(link)}" '
                          f'download="{esc(body.name)}.xml" '
                          f'id="download">Download {esc(body.name)}.xml</a></p>'
                          f'<pre id="xml" tabindex="0" aria-label="Domain XML">{esc(doc["xml"])}</pre>'
                          '<h2>Why each decision</h2>'
                          '<pre id="explain" tabindex="0" aria-label="Explanation">'
                          f'{esc(doc["explain"])}</pre>')
            except InvalidInput as exc:
                errors[_field_of(exc, _GUEST_FIELDS)] = str(exc)
            except Forbidden as exc:
                return _error_page(who, request, exc)
        if errors:
            status = 422
    gen = (_form_error(errors) + '<form method="get" action="/guests" class="guests">'
           '<input type="hidden" name="go" value="1">'
           + field("selector", "Host group (label selector)", q.get("selector", ""), errors, form="g",
                   hint="e.g. group=intel-mixed")
           + field("os", "Guest OS", q.get("os", ""), errors, form="g",
                   hint="osinfo short id, e.g. rhel9.1, win11")
           + field("name", "Name", q.get("name", ""), errors, form="g")
           + field("vcpus", "vCPUs", q.get("vcpus", "2"), errors, form="g")
           + field("memory", "Memory", q.get("memory", "4Gi"), errors, form="g")
           + field("disks", "Disks", q.get("disks", ""), errors, form="g",
                   hint="kind=qcow2,source=PATH per disk, separated by ;")
           + field("firmware", "Firmware", q.get("firmware", "auto"), errors, kind="select", form="g",
                   options=[("auto", "auto"), ("bios", "bios"), ("efi", "efi")])
           + '<button type="submit">Generate</button></form>')
    html = page("Guests", '<h1>Guests</h1><section aria-labelledby="gen-h">'
                '<h2 id="gen-h">Generate a guest for a '
                f'group</h2>{gen}{result}</section>' + _check_form(request, {}, {}, ""),
                who, _csrf(request), ["guests.js"], current="guests")
    return _html(html, status)


def _check_form(request: Request, errors: dict[str, str], values: dict[str, str], result: str) -> str:
    return ('<section aria-labelledby="check-h"><h2 id="check-h">Check a domain XML against a group</h2>'
            + _form_error(errors)
            + '<form method="post" action="/guests/check" class="check" id="check-form">'
            + csrf_field(_csrf(request))
            + field("selector", "Host group (label selector)", values.get("selector", ""), errors, form="c")
            + '<div class="field"><label for="c-file">Domain XML file</label>'
              '<input type="file" id="c-file" accept=".xml,application/xml,text/xml" '
              'aria-describedby="c-file-hint"><span class="hint" id="c-file-hint">'
              'the file is read into the text box below</span></div>'
            + field("domain", "Domain XML", values.get("domain", ""), errors, kind="textarea", form="c")
            + f'<button type="submit">Check</button></form>{result}</section>')


async def guest_check(request: Request) -> Response:
    who = await _who(request)
    if isinstance(who, Response):
        return who
    ctx = _ctx(request)
    try:
        form = await _form(request)
        check_csrf(request, form)
    except HvfleetError as exc:
        return _error_page(who, request, exc)
    errors: dict[str, str] = {}
    if not form.get("selector", "").strip():
        errors["selector"] = "required: a label selector for the group"
    if not form.get("domain", "").strip():
        errors["domain"] = "required: choose a file or paste the XML"
    result = ""
    if not errors:
        try:  # before the selector is tried against the fleet, which tells what exists
            ctx.authorize(who, Action("create", "guests", name="check"))
        except Forbidden as exc:
            return _error_page(who, request, exc)
        wrong = await _selector_error(ctx, form["selector"].strip(), must_match=True)
        if wrong:
            errors["selector"] = wrong
    if not errors:
        try:
            doc = await run_in_threadpool(actions._check, ctx, who, actions.GuestCheckBody(
                domain=form["domain"], label_selector=form["selector"].strip()))
            rows = [[h["host"], "ok" if h["ok"] else "does not run here",
                     "; ".join(h["problems"]) or "-", "; ".join(h["warnings"]) or "-"] for h in doc["hosts"]]
            verdict = "runs on every host of the group" if doc["ok"] else "does NOT run on every host"
            result = ('<h3>Result</h3><p id="check-verdict" role="status">'
                      f'<strong>{esc(verdict)}</strong></p>'
                      + table(["Host", "Verdict", "Problems", "Warnings"], rows, "Per host", cls="verdicts"))
        except InvalidInput as exc:
            errors[_field_of(exc, {"domain": "domain"})] = str(exc)
        except Forbidden as exc:
            return _error_page(who, request, exc)
    body = ('<h1>Guests</h1><p><a href="/guests">Generate a guest</a></p>'
            + _check_form(request, errors, form, result))
    return _html(page("Guest check", body, who, _csrf(request), ["guests.js"], current="guests"),
                 422 if errors else 200)


# -- static files -------------------------------------------------------------------------------------

_CACHE: dict[str, bytes] = {}


async def static(request: Request) -> Response:
    name = request.path_params["name"]
    media = _STATIC.get(name)
    if media is None:
        return Response("not found", status_code=404, media_type="text/plain")
    data = _CACHE.get(name)
    if data is None:
        data = _CACHE[name] = files("hvfleet.server").joinpath("static", name).read_bytes()
    return Response(data, media_type=media, headers={"Cache-Control": "max-age=300",
                                                     "X-Content-Type-Options": "nosniff"})


def routes() -> list[Route]:
    return [
        Route("/", overview),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/dashboard/overview.json", overview_json),
        Route("/dashboard/heat.json", heat_json),
        Route("/dashboard/history.json", history_json),
        Route("/dashboard/history", history_fragment),
        Route("/history", history_page),
        Route("/dashboard/events", events),
        Route("/hosts/{name}", host),
        Route("/hosts/{name}/actions", host_action, methods=["POST"]),
        Route("/fit", fit_page),
        Route("/guests", guests_page),
        Route("/guests/check", guest_check, methods=["POST"]),
        Route("/static/{name}", static),
        Route("/metrics", metrics),
    ]
