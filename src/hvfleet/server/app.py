"""The ASGI application of `hvfleet serve`: routes to the discovery, OpenAPI,
resource and action handlers (docs/api.md).

`create_app(store, authenticator, authorizer, audit=..., limits=...)` is all a
server needs; run it with uvicorn. Discovery and OpenAPI documents need any
valid token (as in Kubernetes, where they are open to every authenticated
caller); /version, /healthz, /livez and /readyz need none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.convertors import StringConvertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from hvfleet.guests import datasets
from hvfleet.model.errors import HvfleetError
from hvfleet.server import access_review, actions, dashboard, discovery, guard, impersonation, openapi
from hvfleet.server import placement as placement_api
from hvfleet.server.batch import batch
from hvfleet.server.context import ApiContext, AuditLog, Limits
from hvfleet.server.dashboard.history import HistorySettings
from hvfleet.server.guard import authenticate
from hvfleet.server.identity import Authenticator, Authorizer
from hvfleet.server.openapi_proto import PROTOBUF_CONTENT_TYPE, PROTOBUF_MEDIA, openapi_v2_protobuf
from hvfleet.server.placement.edge import catch_up_store
from hvfleet.server.resources import collection, item
from hvfleet.server.status import ApiError
from hvfleet.server.token_api import token_routes
from hvfleet.store.base import Store
from hvfleet.store.lifecycle import GarbageCollector

GV = "/apis/hvfleet.io/v1"
log = logging.getLogger("hvfleet.server")


class KnownPlural(StringConvertor):
    """`{plural:known}`: the plural of a kind this API serves, and nothing else
    (not an action's name such as `fit`)."""

    regex = "|".join(sorted(discovery.RESOURCES))


register_url_convertor("known", KnownPlural())


def _document(build: Callable[[], dict[str, Any]], public: bool = False) -> Callable[..., Any]:
    async def endpoint(request: Request) -> Response:
        if not public:
            await authenticate(request.app.state.ctx, request)
        return JSONResponse(build())

    return endpoint


async def _openapi_v2(request: Request) -> Response:
    accept = request.headers.get("accept", "")
    if PROTOBUF_MEDIA in accept:
        # What kubectl 1.2x asks for to validate manifests and to explain fields.
        await authenticate(request.app.state.ctx, request)
        return Response(openapi_v2_protobuf(), media_type=PROTOBUF_CONTENT_TYPE)
    if accept and "json" not in accept and "*/*" not in accept:
        raise ApiError(406, "NotAcceptable", "/openapi/v2 is served as JSON or protobuf")
    response: Response = await _document(openapi.openapi_v2)(request)
    return response


async def _healthy(request: Request) -> Response:
    """/livez: the process answers (a replica cut off from its store is
    still alive: restarting it would not bring the store back)."""
    return PlainTextResponse("ok")


# How long /readyz waits for the store (a load balancer's check times out soon).
READY_STORE_WAIT_S = 2.0


async def _ready(request: Request) -> Response:
    """/readyz and /healthz: the process answers and its store does (one read,
    `Store.ready`: never queued behind a write waiting for a lock), as
    kube-apiserver's checks include etcd. A
    replica whose store is unreachable answers 500, so a load balancer's
    health check (docs/scaling.md) takes it out of the pool while every API
    request would be 503; the reason stays in the server's log."""
    ctx: ApiContext = request.app.state.ctx
    try:
        await asyncio.wait_for(run_in_threadpool(ctx.store.ready), READY_STORE_WAIT_S)
    except (HvfleetError, TimeoutError) as exc:
        log.warning("%s: the store does not answer: %s", request.url.path, exc or "timed out")
        return PlainTextResponse(f"[-]store failed: reason withheld\n{request.url.path[1:]} check failed",
                                 status_code=500)
    return PlainTextResponse("ok")


def routes(dashboard_pages: bool = True) -> list[Any]:
    return [
        # The objects of the known kinds first: the router tries each route in
        # turn, and the writes agents make all day (a Lease renewal, a status)
        # would otherwise be matched after some 40 others. No action's path
        # matches these; an unknown plural goes on to the generic routes below.
        Route(f"{GV}/{{plural:known}}/{{name}}", item, methods=["GET", "PUT", "PATCH", "DELETE"]),
        Route(f"{GV}/{{plural:known}}/{{name}}/status", item, methods=["GET", "PUT", "PATCH"]),
        # The OpenStack Placement API (docs/placement.md).
        placement_api.mount(),
        # The dashboard's pages: /, /login, /hosts/..., /dashboard/...
        *(dashboard.routes() if dashboard_pages else []),
        Route("/version", _document(discovery.version, public=True)),
        Route("/healthz", _ready), Route("/livez", _healthy), Route("/readyz", _ready),
        Route("/api", _document(discovery.api_versions)),
        Route("/apis", _document(discovery.api_group_list)),
        Route("/apis/hvfleet.io", _document(discovery.api_group)),
        Route(GV, _document(discovery.api_resource_list)),
        Route(f"/apis/{access_review.GROUP}", _document(access_review.api_group)),
        Route(access_review.PREFIX, _document(access_review.api_resource_list)),
        Route(f"{access_review.PREFIX}/{access_review.ACCESS_REVIEWS}",
              access_review.self_subject_access_review, methods=["POST"]),
        Route(f"{access_review.PREFIX}/{access_review.RULES_REVIEWS}",
              access_review.self_subject_rules_review, methods=["POST"]),
        Route("/openapi/v2", _openapi_v2),
        Route("/openapi/v3", _document(openapi.openapi_v3_root)),
        Route(f"/openapi/v3/{openapi.GV_PATH}", _document(openapi.openapi_v3_group)),
        # Action endpoints first: their paths would otherwise match {plural}/{name}.
        *token_routes(),
        Route(impersonation.WHOAMI_PATH, impersonation.whoami, methods=["POST"]),
        Route(f"{GV}/batch", batch, methods=["POST"]),
        Route(f"{GV}/fit", actions.fit, methods=["POST"]),
        Route(f"{GV}/placement", actions.placement, methods=["POST"]),
        Route(f"{GV}/cpubaseline", actions.cpubaseline, methods=["POST"]),
        Route(f"{GV}/guests/generate", actions.guest_generate, methods=["POST"]),
        Route(f"{GV}/guests/check", actions.guest_check, methods=["POST"]),
        Route(f"{GV}/reservations/{{name}}/release", actions.release_reservation, methods=["POST"]),
        Route(f"{GV}/{{plural}}", collection, methods=["GET", "POST", "DELETE"]),
        Route(f"{GV}/{{plural}}/{{name}}", item, methods=["GET", "PUT", "PATCH", "DELETE"]),
        Route(f"{GV}/{{plural}}/{{name}}/status", item, methods=["GET", "PUT", "PATCH"]),
    ]


def create_app(
    store: Store,
    authenticator: Authenticator,
    authorizer: Authorizer,
    *,
    audit: AuditLog | None = None,
    limits: Limits | None = None,
    dashboard_pages: bool = True,
    history: HistorySettings | None = None,
) -> Starlette:
    """The API over `store`. The caller keeps ownership of the store (and closes
    it); the app stops its watch fan-out threads when uvicorn shuts it down.
    With `dashboard_pages`, the dashboard is served at / and its live state
    follows the watch fan-out from start-up (one more watcher per kind, and
    history the fan-out keeps for it)."""
    # The fan-outs, the collector and the token watch follow the store for as
    # long as the server runs: one stream for all of them (store/feed.py).
    store.share_watches()
    ctx = ApiContext(store, authenticator, authorizer, audit, limits or Limits())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await run_in_threadpool(datasets.preload)
        if dashboard_pages:
            await dashboard.start(app)
        # Dependents whose owners are gone (ownerReferences), deleted in the background.
        collector = GarbageCollector(store).start()
        try:
            yield
        finally:
            if dashboard_pages:
                await dashboard.stop(app)
            await run_in_threadpool(collector.close)
            ctx.close()

    # The Placement API's candidates GET is answered before the router (placement.Direct).
    app = placement_api.PlacementApp(placement_api.MOUNT, routes=routes(dashboard_pages), lifespan=lifespan)
    guard.install(app)  # handlers raise; the guard answers (server/guard.py)
    app.state.ctx = ctx
    # The Placement API's catch-up reads of etcd's revision, shared by concurrent requests.
    app.state.placement_store = catch_up_store(store)
    app.state.history_settings = history  # the dashboard's history tiers and retention
    return app
