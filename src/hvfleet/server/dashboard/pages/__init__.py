"""The dashboard's pages and feeds on `hvfleet serve` (docs/dashboard.md), one
module per page: login and logout (`login`), the fleet overview with its JSON
feed and heat map (`overview`), history and the event stream (`feeds`), a
host's page with the operator's actions (`host`), the capacity history
(`history`), fit (`fit`), guests
(`guests`) and the static files (`static`). Each handler identifies the
caller from the session cookie (`common`, session.py), asks the server's
Authorizer, calls the same core functions as the CLI and the API, and renders
a Jinja2 template from `templates/` (autoescaped, html.py)."""

from __future__ import annotations

from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.routing import Route

from hvfleet.server.dashboard.metrics import metrics
from hvfleet.server.dashboard.pages.feeds import events
from hvfleet.server.dashboard.pages.fit import fit_page
from hvfleet.server.dashboard.pages.guests import guest_check, guests_page
from hvfleet.server.dashboard.pages.history import history_fragment, history_json, history_page
from hvfleet.server.dashboard.pages.host import host, host_action
from hvfleet.server.dashboard.pages.login import login, logout
from hvfleet.server.dashboard.pages.overview import heat_json, overview, overview_json
from hvfleet.server.dashboard.pages.static import static

# Pages, feeds and static files are sent gzip-compressed to a browser that
# accepts it (the heat map of 10,000 hosts: about 10x smaller). The event
# stream is not wrapped: a compressor would hold its events back.
_GZIP = [Middleware(GZipMiddleware, minimum_size=500, compresslevel=6)]


def routes() -> list[Route]:
    return [
        Route("/", overview, middleware=_GZIP),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/dashboard/overview.json", overview_json, middleware=_GZIP),
        Route("/dashboard/heat.json", heat_json, middleware=_GZIP),
        Route("/dashboard/history.json", history_json, middleware=_GZIP),
        Route("/dashboard/history", history_fragment, middleware=_GZIP),
        Route("/history", history_page),
        Route("/dashboard/events", events),
        Route("/hosts/{name}", host, middleware=_GZIP),
        Route("/hosts/{name}/actions", host_action, methods=["POST"]),
        Route("/fit", fit_page, middleware=_GZIP),
        Route("/guests", guests_page, middleware=_GZIP),
        Route("/guests/check", guest_check, methods=["POST"]),
        Route("/static/{name}", static, middleware=_GZIP),
        Route("/metrics", metrics),
    ]
