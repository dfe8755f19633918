"""The fleet overview (`/`) and the feeds it draws from: one page of hosts with
the totals of every host the selector matches and per label value
(`/dashboard/overview.json`, also embedded in the page for its first paint),
and the heat map of every matching host (`/dashboard/heat.json`)."""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Callable
from typing import Any

from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from hvfleet import views
from hvfleet.model.errors import Forbidden, InvalidInput
from hvfleet.model.selectors import parse_selector
from hvfleet.server import bodies
from hvfleet.server.dashboard import history
from hvfleet.server.dashboard.feed import HostRow, totals_document, totals_of
from hvfleet.server.dashboard.live import FleetState
from hvfleet.server.dashboard.pages.common import (
    Visible,
    ctx_of,
    error_page,
    json_feed,
    only,
    page,
    signed_in,
    state_of,
    visible_hosts,
)
from hvfleet.server.dashboard.pages.history import history_html
from hvfleet.server.dashboard.view import PAGE_SIZES, STATE_LABELS, STATES, View
from hvfleet.server.dashboard.view import state_of as view_state
from hvfleet.server.identity import Identity

# A label with more values than this (e.g. a serial per host) is no grouping.
MAX_GROUP_VALUES = 50


def overview_document(state: FleetState, view: View, visible: Visible = None,
                      since: int | None = None) -> dict[str, Any]:
    """One page of the overview: the hosts on it (feed rows), the totals of every
    host the view's selector matches, and totals per label value; of the hosts
    the caller may see (`visible`, None: every host). With `since` (a version
    the page drew), only the rows on the page changed after it, and `order`,
    the names on the page, so the page can tell a change in place from one
    that moves rows.

    For the whole fleet (no selector, every host visible) the label values,
    their totals and the resources come from the state's running sums: no
    pass over 10,000 hosts per request beyond the view's own."""
    selector = view.selector
    rows = only(state.select(selector), visible)
    ordered = view.rows(rows)
    pages = max(1, math.ceil(len(ordered) / view.per_page))
    page_no = min(max(1, view.page), pages)
    shown = state.current(ordered[(page_no - 1) * view.per_page: page_no * view.per_page])
    groups: dict[str, dict[str, Any]] = {}
    if visible is None and not selector.requirements:
        for k, vs in state.label_values(MAX_GROUP_VALUES).items():
            groups[k] = {v: state.totals_for(selector, [], (k, v)) for v in vs}
        resources = [str(r) for r in state.resource_names()]
    else:
        values: dict[str, dict[str, list[Any]]] = {}
        for x in rows:
            for k, v in x.labels.items():
                values.setdefault(k, {}).setdefault(v, []).append(x)
        for k, by_value in sorted(values.items()):
            if len(by_value) > MAX_GROUP_VALUES:
                continue
            groups[k] = {v: _group_totals(state, view.selector_text, k, v, members) if visible is None
                         else totals_document(totals_of(members)) for v, members in sorted(by_value.items())}
        resources = _resource_names(rows)
    doc: dict[str, Any] = {
        "version": state.version,
        "selector": str(selector),
        "view": view.params(),
        "sort": view.sort, "order": "desc" if view.descending else "asc",
        "resources": resources,
        "count": len(ordered), "matching": len(rows),
        "page": page_no, "pages": pages, "perPage": view.per_page,
        "total": (state.totals_for(selector, rows) if visible is None
                  else totals_document(totals_of(rows))),
        "groups": groups,
    }
    if since is None:
        doc["hosts"] = [x.doc for x in shown]
    else:
        changed = state.changed_since(since)
        doc.update(delta=True, order=[x.name for x in shown],
                   hosts=[x.doc for x in shown if x.name in changed])
    return doc


def _resource_names(rows: list[HostRow]) -> list[str]:
    return [str(r) for r in views.resource_names(x.capacity for x in rows)]


def _group_totals(state: FleetState, selector_text: str, key: str, value: str,
                  members: list[Any]) -> dict[str, Any]:
    return state.totals_for(parse_selector(selector_text), members, (key, value))


# The heat map's states as small numbers (its compact form).
HEAT_STATES = ("Ready", "NotReady", "Stale", "Unknown", "Maintenance")


def _heat_entry(x: HostRow, rs: list[str]) -> list[int]:
    """A host's tile: its state's index in HEAT_STATES, then per resource the
    share of effective capacity in use in tenths of a percent (-1: none)."""
    state = view_state(x)
    out = [HEAT_STATES.index(state) if state in HEAT_STATES else 3]
    for r in rs:
        use = (x.doc["resources"].get(r) or {}).get("use")
        out.append(-1 if use is None else round(use * 1000))
    return out


def heat_document(state: FleetState, view: View, visible: Visible = None,
                  since: int | None = None, layout: str = "") -> dict[str, Any]:
    """Every host the view selects, as compact arrays: `names`, `tiles` (one
    `_heat_entry` per host) and `groups` ([label value, first index, count],
    hosts grouped by the view's `group` label, in the view's order within a
    group). `layout` is a digest of the grouping, resources and names in order; when the
    caller's (with `since`) is still current, only the tiles changed after
    `since` are sent, as [index, *tile]."""
    rows = view.rows(only(state.select(view.selector), visible))
    if view.group:
        by: dict[str, list[HostRow]] = {}
        for x in rows:
            by.setdefault(x.labels.get(view.group, ""), []).append(x)
        keys = sorted(by, key=lambda v: (v == "", v))  # hosts without the label last
        rows = [x for k in keys for x in by[k]]
        starts, at = [], 0
        for k in keys:
            starts.append([k, at, len(by[k])])
            at += len(by[k])
    else:
        starts = [["", 0, len(rows)]] if rows else []
    rs = _resource_names(rows)
    names = [x.name for x in rows]
    groups = [f"{v}\t{start}\t{count}" for v, start, count in starts]
    digest = format(zlib.crc32("\n".join([view.group, *groups, "", *rs, "", *names]).encode()), "08x")
    doc: dict[str, Any] = {"version": state.version, "layout": digest}
    if since is not None and layout == digest:
        changed = state.changed_since(since)
        doc.update(delta=True, changed=[[i, *_heat_entry(x, rs)] for i, x in enumerate(rows)
                                        if x.name in changed])
        return doc
    doc.update(resources=rs, states=list(HEAT_STATES), group=view.group, groups=starts, names=names,
               tiles=[_heat_entry(x, rs) for x in rows])
    return doc


def _ints(request: Request) -> Callable[[str, int, int], int]:
    def read(name: str, default: int, high: int) -> int:
        value = bodies.query_int(request, name, low=1, high=high)
        return default if value is None else value
    return read


def _view(request: Request) -> View:
    return View.of(request.query_params, _ints(request))


def _since(request: Request) -> int | None:
    return bodies.query_int(request, "since", low=0)


@signed_in
async def overview(request: Request, who: Identity) -> Response:
    state = state_of(request)
    try:
        visible = visible_hosts(ctx_of(request), who)
    except Forbidden as exc:
        return error_page(who, request, exc)
    errors: dict[str, str] = {}
    try:
        view = _view(request)
    except InvalidInput as exc:
        errors[exc.field if exc.field in ("q", "state", "sort", "order", "group") else "selector"] = str(exc)
        view = View()
    doc = await run_in_threadpool(overview_document, state, view, visible)
    q = request.query_params
    sorts = [("name", "name"), ("state", "state (needs a look first)"), ("instances", "instances")] + [
        (f"{how}:{r}", f"{how} {r}") for r in doc["resources"] for how in ("free", "used")]
    charts = await run_in_threadpool(history_html, request, history.FLEET, "The fleet", "hour", "/history") \
        if visible is None else ""
    return page(request, "overview.html", who, title="Fleet overview", scripts=["dashboard.js", "history.js"],
                current="overview", history=Markup(charts), doc=doc, view=view, errors=errors, sorts=sorts,
                typed={k: q.get(k, "") for k in ("selector", "q")},
                states=[(s, STATE_LABELS.get(s, s)) for s in STATES],
                page_sizes=sorted({*PAGE_SIZES, view.per_page}),
                group_keys=sorted(doc["groups"]))


FleetDocument = Callable[[FleetState, View, Visible, int | None], dict[str, Any]]


async def _fleet_feed(request: Request, who: Identity, document: FleetDocument) -> Response:
    """overview.json and heat.json: `document` of the hosts the caller may see,
    in the view the query asks for (a query naming no field: its selector)."""
    def answer() -> dict[str, Any]:
        visible = visible_hosts(ctx_of(request), who)
        return document(state_of(request), _view(request), visible, _since(request))

    return await json_feed(answer, field="selector")


@signed_in
async def overview_json(request: Request, who: Identity) -> Response:
    return await _fleet_feed(request, who, overview_document)


@signed_in
async def heat_json(request: Request, who: Identity) -> Response:
    layout = request.query_params.get("layout", "")
    return await _fleet_feed(request, who, functools.partial(heat_document, layout=layout))
