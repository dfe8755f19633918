"""The fleet overview (`/`) and the feeds it draws from: one page of hosts with
the totals of every host the selector matches and per label value
(`/dashboard/overview.json`, also embedded in the page for its first paint),
and the heat map of every matching host (`/dashboard/heat.json`)."""

from __future__ import annotations

import math
from typing import Any

from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hvfleet.model.errors import Forbidden, InvalidInput
from hvfleet.model.selectors import parse_selector
from hvfleet.server import bodies
from hvfleet.server.dashboard import history
from hvfleet.server.dashboard.feed import resource_names, sort_rows, totals
from hvfleet.server.dashboard.live import FleetState
from hvfleet.server.dashboard.pages.common import (
    Visible,
    ctx_of,
    error_page,
    only,
    page,
    refused,
    state_of,
    visible_hosts,
    who_is,
)
from hvfleet.server.dashboard.pages.history import history_html

PER_PAGE = 100
MAX_PER_PAGE = 1000


def overview_document(state: FleetState, selector_text: str, sort: str, page_no: int,
                      per_page: int, visible: Visible = None) -> dict[str, Any]:
    """One page of the overview: the hosts on it (feed rows), the totals of every
    host the selector matches, and totals per label value; of the hosts the
    caller may see (`visible`, None: every host)."""
    selector = parse_selector(selector_text)
    rows = only(state.select(selector), visible)
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
    rows = only(state.select(parse_selector(selector_text)), visible)
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
    who = await who_is(request)
    if isinstance(who, Response):
        return who
    state = state_of(request)
    try:
        visible = visible_hosts(ctx_of(request), who)
    except Forbidden as exc:
        return error_page(who, request, exc)
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
    charts = await run_in_threadpool(history_html, request, history.FLEET, "The fleet", "hour", "/history") \
        if visible is None else ""
    return page(request, "overview.html", who, title="Fleet overview",
                scripts=["dashboard.js", "history.js"], current="overview", history=Markup(charts),
                doc=doc, selector=selector_text, sort=sort, sorts=sorts,
                per_page=per_page, error=error)


async def overview_json(request: Request) -> Response:
    who = await who_is(request)
    if isinstance(who, Response):
        return who
    try:
        visible = visible_hosts(ctx_of(request), who)
        selector_text, sort, page_no, per_page = _overview_args(request)
        doc = await run_in_threadpool(overview_document, state_of(request), selector_text, sort,
                                      page_no, per_page, visible)
    except InvalidInput as exc:
        return JSONResponse({"message": str(exc), "field": exc.field or "selector"}, status_code=422)
    except Forbidden as exc:
        return refused(exc)
    return JSONResponse(doc, headers={"Cache-Control": "no-store"})


async def heat_json(request: Request) -> Response:
    who = await who_is(request)
    if isinstance(who, Response):
        return who
    q = request.query_params
    try:
        visible = visible_hosts(ctx_of(request), who)
        doc = await run_in_threadpool(heat_document, state_of(request), q.get("selector", ""),
                                      q.get("sort", "name"), visible)
    except InvalidInput as exc:
        return JSONResponse({"message": str(exc)}, status_code=422)
    except Forbidden as exc:
        return refused(exc)
    return JSONResponse(doc, headers={"Cache-Control": "no-store"})
