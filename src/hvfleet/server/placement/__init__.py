"""The OpenStack Placement API served by `hvfleet serve` under /placement
(docs/placement.md): routes from Placement's URL map to thin handlers
(hvfleet.server.placement.handlers) over the core (hvfleet.placement)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from hvfleet.server.placement import handlers as h
from hvfleet.server.placement.edge import MethodNotAllowed, endpoint

# path -> method -> (policy rule, handler, takes a JSON body, answers JSON)
Table = dict[str, dict[str, tuple[str, Callable[..., Any], bool, bool]]]
ROUTES: Table = {
    "/": {"GET": ("open", h.root, False, True)},
    "/resource_providers": {
        "GET": ("read", h.list_providers, False, True),
        "POST": ("providers", h.create_provider, True, True)},
    "/resource_providers/{uuid}": {
        "GET": ("read", h.get_provider, False, True),
        "PUT": ("providers", h.update_provider, True, True),
        "DELETE": ("providers", h.delete_provider, False, False)},
    "/resource_providers/{uuid}/inventories": {
        "GET": ("read", h.get_inventories, False, True),
        "POST": ("inventories", h.post_inventory, True, True),
        "PUT": ("inventories", h.put_inventories, True, True),
        "DELETE": ("inventories", h.delete_inventories, False, False)},
    "/resource_providers/{uuid}/inventories/{rc}": {
        "GET": ("read", h.get_inventory, False, True),
        "PUT": ("inventories", h.put_inventory, True, True),
        "DELETE": ("inventories", h.delete_inventory, False, False)},
    "/resource_providers/{uuid}/usages": {"GET": ("read", h.provider_usages, False, True)},
    "/resource_providers/{uuid}/aggregates": {
        "GET": ("read", h.get_aggregates, False, True),
        "PUT": ("aggregates", h.put_aggregates, True, True)},
    "/resource_providers/{uuid}/allocations": {"GET": ("read", h.provider_allocations, False, True)},
    "/resource_providers/{uuid}/traits": {
        "GET": ("read", h.get_provider_traits, False, True),
        "PUT": ("traits", h.put_provider_traits, True, True),
        "DELETE": ("traits", h.delete_provider_traits, False, False)},
    "/resource_classes": {
        "GET": ("names", h.list_resource_classes, False, True),
        "POST": ("resource_classes", h.create_resource_class, True, True)},
    "/resource_classes/{name}": {
        "GET": ("names", h.get_resource_class, False, True),
        "PUT": ("resource_classes", h.put_resource_class, False, True),
        "DELETE": ("resource_classes", h.delete_resource_class, False, False)},
    "/traits": {"GET": ("names", h.list_traits, False, True)},
    "/traits/{name}": {
        "GET": ("names", h.get_trait, False, False),
        "PUT": ("trait_names", h.put_trait, False, False),
        "DELETE": ("trait_names", h.delete_trait, False, False)},
    "/allocations": {"POST": ("allocations", h.post_allocations, True, True)},
    "/allocations/{consumer}": {
        "GET": ("read", h.get_allocations, False, True),
        "PUT": ("allocations", h.put_allocations, True, True),
        "DELETE": ("allocations", h.delete_allocations, False, False)},
    "/usages": {"GET": ("read", h.usages, False, True)},
}


def _dispatch(methods: dict[str, Callable[[Request], Awaitable[Response]]]) -> Callable[
        [Request], Awaitable[Response]]:
    allowed = sorted(methods)

    async def run(request: Request) -> Response:
        fn = methods.get(request.method)
        if fn is None:
            async def refuse(call: Any, _: Any) -> None:
                raise MethodNotAllowed(
                    f"The method specified is not allowed for this resource. Method "
                    f"{request.method} not allowed. Allowed: {', '.join(allowed)}", allowed)
            return await endpoint("open", _raise_405(request.method, allowed), sends_json=False)(request)
        return await fn(request)

    return run


def _raise_405(method: str, allowed: list[str]) -> Callable[..., Any]:
    def refuse(call: Any, _: Any) -> None:
        raise MethodNotAllowed("The method specified is not allowed for this resource.", allowed)
    return refuse


def mount() -> Mount:
    routes = []
    for path, methods in ROUTES.items():
        wrapped = {m: endpoint(rule, fn, body=body, sends_json=sends)
                   for m, (rule, fn, body, sends) in methods.items()}
        routes.append(Route(path, _dispatch(wrapped), methods=[
            "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]))
    return Mount("/placement", routes=routes)
