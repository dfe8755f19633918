"""The capacity history (history.py keeps it in the store): the `/history`
page (the fleet's and each label value's charts over the last hour, day or
week), a series' charts as an HTML fragment (`/dashboard/history`, what
history.js puts in place every 30 s), the same series as JSON
(`/dashboard/history.json`), and `history_html` for the pages that embed
a chart (the overview, a host's page). Only what the caller may see: the
fleet and label values for who may list every host, a host for who may see it."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote, urlencode

from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from hvfleet.model.errors import Forbidden, InvalidInput
from hvfleet.server.dashboard import charts, history
from hvfleet.server.dashboard.pages.common import (
    ctx_of,
    error_page,
    html,
    json_feed,
    page,
    refused,
    signed_in,
    state_of,
)
from hvfleet.server.dashboard.pages.feeds import may_follow
from hvfleet.server.identity import Identity


def history_document(request: Request, series: str, range_name: str) -> dict[str, Any]:
    keeper: history.HistoryKeeper = request.app.state.history
    tier = keeper.settings.tier_for(history.RANGES[range_name])
    now = int(time.time())
    points = history.read_points(ctx_of(request).store, series, tier, since=now - history.RANGES[range_name])
    return history.chart_document(series, range_name, tier, points, now)


def history_html(request: Request, series: str, heading: str, range_name: str, path: str,
                 prefix: str = "hist", level: int = 3) -> str:
    """One series' history charts (charts.py), with links to its other ranges on `path`."""
    if range_name not in history.RANGES:
        range_name = "hour"
    doc = history_document(request, series, range_name)
    query = {k: v for k, v in request.query_params.items() if k not in ("range", "notice")}

    def link(key: str) -> str:
        return f"{path}?{urlencode({**query, 'range': key})}#{prefix}-h"

    return charts.render(doc, heading, link, prefix, level)


def _heading(series: str) -> str:
    return "The fleet" if series == history.FLEET else f"Hosts with {series.removeprefix('label:')}"


def _args(request: Request) -> tuple[str, str | None, str]:
    """(series, its host if a host's, range) of the query; InvalidInput naming the argument."""
    q = request.query_params
    host = q.get("host")
    series = q.get("series") or (history.host_series(host) if host else history.FLEET)
    range_name = q.get("range", "hour")
    _, host = history.parse_series(series)
    if range_name not in history.RANGES:
        raise InvalidInput(f"{range_name!r}: expected one of {', '.join(history.RANGES)}", field="range")
    return series, host, range_name


def _followed(request: Request, who: Identity) -> tuple[str, str | None, str]:
    """`_args`, once the caller may follow the series' host (the fleet's: every host)."""
    series, host, range_name = _args(request)
    may_follow(ctx_of(request), who, host)
    return series, host, range_name


@signed_in
async def history_json(request: Request, who: Identity) -> Response:
    def document() -> dict[str, Any]:
        series, _host, range_name = _followed(request, who)
        return history_document(request, series, range_name)

    return await json_feed(document)


@signed_in
async def history_fragment(request: Request, who: Identity) -> Response:
    try:
        series, host, range_name = _followed(request, who)
        heading = f"Hypervisor {host}" if host else _heading(series)
        path = f"/hosts/{quote(host)}" if host else "/history"
        out = await run_in_threadpool(history_html, request, series, heading, range_name, path)
    except (InvalidInput, Forbidden) as exc:
        return refused(exc)
    return html(out)


@signed_in
async def history_page(request: Request, who: Identity) -> Response:
    try:
        series, host, range_name = _args(request)
        if host is not None:
            return RedirectResponse(f"/hosts/{quote(host)}?{urlencode({'range': range_name})}",
                                    status_code=303)
        may_follow(ctx_of(request), who, None)
    except (InvalidInput, Forbidden) as exc:
        return error_page(who, request, exc)
    groups = await run_in_threadpool(history.group_figures, state_of(request))
    choices = [(s, _heading(s), f"/history?{urlencode({'series': s, 'range': range_name})}")
               for s in sorted(groups, key=lambda s: (s != history.FLEET, s))]
    out = await run_in_threadpool(history_html, request, series, _heading(series), range_name, "/history",
                                  "hist", 2)
    return page(request, "history.html", who, title="History", scripts=["history.js"], current="history",
                choices=choices, series=series, charts=Markup(out))  # rendered (escaped) by charts.render
