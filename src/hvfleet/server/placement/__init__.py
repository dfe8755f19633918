"""The OpenStack Placement API served by `hvfleet serve` under /placement,
and at the root of a listener of its own with `--placement-listen`
(docs/placement.md): routes from Placement's URL map to thin handlers
(hvfleet.server.placement.handlers) over the core (hvfleet.placement)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from hvfleet.placement.errors import PlacementNotFound
from hvfleet.server.guard import Guard
from hvfleet.server.placement import handlers as h
from hvfleet.server.placement.edge import MethodNotAllowed, endpoint

ALL_METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]


@dataclass(frozen=True)
class Op:
    """One method of one path: its policy rule, handler, whether it takes a
    JSON body (or from which versions), and the microversions it exists in
    (outside them Placement answers 404, or `masked` 405)."""

    rule: str
    handler: Callable[..., Any]
    body: bool | Callable[[tuple[int, int]], bool] = False
    since: tuple[int, int] = (1, 0)
    until: tuple[int, int] | None = None
    masked: str = "404"
    # An answer had at once, on the event loop, or None: then `handler` (edge.endpoint).
    at_once: Callable[..., Any] | None = None


ROUTES: dict[str, dict[str, Op]] = {
    # First: the router tries each path in turn, and the scheduler asks this
    # one before every boot (no other path matches it).
    "/allocation_candidates": {"GET": Op("candidates", h.allocation_candidates, since=(1, 10),
                                         at_once=h.kept_allocation_candidates)},
    "/": {"GET": Op("open", h.root)},
    "/resource_providers": {
        "GET": Op("read", h.list_providers),
        "POST": Op("providers", h.create_provider, True)},
    "/resource_providers/{uuid}": {
        "GET": Op("read", h.get_provider),
        "PUT": Op("providers", h.update_provider, True),
        "DELETE": Op("providers", h.delete_provider)},
    "/resource_providers/{uuid}/inventories": {
        "GET": Op("read", h.get_inventories),
        "POST": Op("inventories", h.post_inventory, True),
        "PUT": Op("inventories", h.put_inventories, True),
        "DELETE": Op("inventories", h.delete_inventories, since=(1, 5), masked="405")},
    "/resource_providers/{uuid}/inventories/{rc}": {
        "GET": Op("read", h.get_inventory),
        "PUT": Op("inventories", h.put_inventory, True),
        "DELETE": Op("inventories", h.delete_inventory)},
    "/resource_providers/{uuid}/usages": {"GET": Op("read", h.provider_usages)},
    "/resource_providers/{uuid}/aggregates": {
        "GET": Op("read", h.get_aggregates, since=(1, 1)),
        "PUT": Op("aggregates", h.put_aggregates, True, since=(1, 1))},
    "/resource_providers/{uuid}/allocations": {"GET": Op("read", h.provider_allocations)},
    "/resource_providers/{uuid}/traits": {
        "GET": Op("read", h.get_provider_traits, since=(1, 6)),
        "PUT": Op("traits", h.put_provider_traits, True, since=(1, 6)),
        "DELETE": Op("traits", h.delete_provider_traits, since=(1, 6))},
    "/resource_classes": {
        "GET": Op("names", h.list_resource_classes, since=(1, 2)),
        "POST": Op("resource_classes", h.create_resource_class, True, since=(1, 2))},
    "/resource_classes/{name}": {
        "GET": Op("names", h.get_resource_class, since=(1, 2)),
        # Before 1.7 a PUT renames a custom class (a body); since, it creates one (none).
        "PUT": Op("resource_classes", h.put_resource_class, lambda v: v < (1, 7), since=(1, 2)),
        "DELETE": Op("resource_classes", h.delete_resource_class, since=(1, 2))},
    "/traits": {"GET": Op("names", h.list_traits, since=(1, 6))},
    "/traits/{name}": {
        "GET": Op("names", h.get_trait, since=(1, 6)),
        "PUT": Op("trait_names", h.put_trait, since=(1, 6)),
        "DELETE": Op("trait_names", h.delete_trait, since=(1, 6))},
    "/allocations": {"POST": Op("allocations", h.post_allocations, True, since=(1, 13))},
    "/allocations/{consumer}": {
        "GET": Op("read", h.get_allocations),
        "PUT": Op("allocations", h.put_allocations, True),
        "DELETE": Op("allocations", h.delete_allocations)},
    "/usages": {"GET": Op("usages", h.usages, since=(1, 9))},
    "/reshaper": {"POST": Op("reshaper", h.reshape, True, since=(1, 30))},
}


def _dispatch(methods: dict[str, Callable[[Request], Awaitable[Response]]]) -> Callable[
        [Request], Awaitable[Response]]:
    allowed = sorted(methods)

    async def run(request: Request) -> Response:
        fn = methods.get(request.method)
        if fn is None:
            return await endpoint("authenticated", _refuse(MethodNotAllowed(request.method, allowed)),
                                  sends_json=False)(request)
        return await fn(request)

    return run


def _refuse(exc: Exception) -> Callable[[Any, Any], None]:
    def refuse(call: Any, _: Any) -> None:
        raise exc
    return refuse


async def _not_found(request: Request) -> Response:
    """Any other path under /placement: Placement's 404 (after authentication, as Placement)."""
    return await endpoint("authenticated", _refuse(PlacementNotFound("The resource could not be found.")),
                          sends_json=False)(request)


def _wrapped(methods: dict[str, Op]) -> dict[str, Callable[[Request], Awaitable[Response]]]:
    return {m: endpoint(op.rule, op.handler, body=op.body, sends_json=m == "GET",
                        versions=(op.since, op.until), masked=op.masked, at_once=op.at_once)
            for m, op in methods.items()}


def _routes() -> list[Route]:
    routes: list[Route] = []
    for path, methods in ROUTES.items():
        routes.append(Route(path, _dispatch(_wrapped(methods)), methods=ALL_METHODS))
    routes.append(Route("/{rest:path}", _not_found, methods=ALL_METHODS))
    return routes


MOUNT = "/placement"
# The GETs answered before the app's middleware and router (`Direct`): the
# one a scheduler asks before every boot.
DIRECT = ("/allocation_candidates",)


def mount() -> Mount:
    return Mount(MOUNT, routes=_routes())


class Direct:
    """The Placement GETs of `DIRECT`, answered by their endpoint straight
    from the server's ASGI entry, with the guard around it: what Starlette's
    middleware, router and mount would add to them is a search through some
    50 routes, three middleware layers and a scope per layer, per request
    (`bench/placement_edge.py`). The endpoint is the one the router reaches
    (`edge.endpoint`: microversion, token, policy, Placement's errors, the
    headers), and the scope is what the mount would make of it (`root_path`
    the mount, no path parameters). Any other method, or a server under a
    root path of its own, goes through the router as before."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._runs = {prefix + path: Guard(self._answer(_wrapped(ROUTES[path])["GET"]))
                      for path in DIRECT}

    def find(self, scope: Scope) -> ASGIApp | None:
        """The app answering `scope` directly, or None (then the router)."""
        if scope["type"] != "http" or scope["method"] != "GET" or scope.get("root_path"):
            return None
        return self._runs.get(scope["path"])

    def _answer(self, run: Callable[[Request], Awaitable[Response]]) -> ASGIApp:
        async def answer(scope: Scope, receive: Receive, send: Send) -> None:
            scope["root_path"] = self.prefix
            scope["path_params"] = {}
            response = await run(Request(scope, receive, send))
            await response(scope, receive, send)

        return answer


class PlacementApp(Starlette):
    """A Starlette app that answers the Placement GETs of `DIRECT` under
    `prefix` before its middleware and router (`Direct`)."""

    def __init__(self, prefix: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.direct = Direct(prefix)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        run = self.direct.find(scope)
        if run is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        await run(scope, receive, send)


def root_app(main: Starlette) -> Starlette:
    """The Placement API at `/`, as Placement's own endpoint is usually
    reached (port 8778), over `main`'s state: the same store, tokens, policy
    and provider snapshot."""
    app = PlacementApp("", routes=_routes())
    app.state = main.state
    return app


class ByListener:
    """One ASGI app for the server's listeners: an HTTP request that came in
    on `placement_port` goes to the Placement API at its root; everything
    else (the main listener, the lifespan) to `main`."""

    def __init__(self, main: Starlette, placement_port: int) -> None:
        self.main = main
        self.placement = root_app(main)
        self.placement_port = placement_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        if scope["type"] == "http" and server is not None and server[1] == self.placement_port:
            await self.placement(scope, receive, send)
        else:
            await self.main(scope, receive, send)
