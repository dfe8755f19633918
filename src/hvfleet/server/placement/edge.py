"""The HTTP edge of hvfleet's Placement API: one wrapper every handler goes
through (microversion, authentication by `X-Auth-Token`, authorization by
role, Placement's error body, `last-modified`/`cache-control` per
microversion, request ids), and the one table from core error classes to
HTTP statuses."""

from __future__ import annotations

import json
import uuid as uuidlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from hvfleet.model.errors import Forbidden, Unauthorized
from hvfleet.placement.errors import (
    PlacementBadRequest,
    PlacementConflict,
    PlacementError,
    PlacementForbidden,
    PlacementNotFound,
)
from hvfleet.server.identity import Identity
from hvfleet.server.placement import policy
from hvfleet.server.placement.microversion import (
    MAX_VERSION,
    MIN_VERSION,
    NotAcceptableVersion,
    negotiate,
    version_text,
)
from hvfleet.store.base import Store

ERROR_CODE_VERSION = (1, 23)
LAST_MODIFIED_VERSION = (1, 15)


class UnsupportedMediaType(PlacementError):
    pass


class NotAcceptable(PlacementError):
    pass


class MethodNotAllowed(PlacementError):
    def __init__(self, detail: str, allowed: list[str]) -> None:
        super().__init__(detail)
        self.allowed = allowed


class Unauthenticated(PlacementError):
    pass


# THE table: core error class -> (status, title, webob's explanation).
STATUS: list[tuple[type[Exception], int, str, str]] = [
    (PlacementBadRequest, 400, "Bad Request",
     "The server could not comply with the request since it is either malformed or otherwise incorrect."),
    (Unauthenticated, 401, "Unauthorized", "This server could not verify that you are authorized to "
     "access the document you requested."),
    (PlacementForbidden, 403, "Forbidden", "Access was denied to this resource."),
    (PlacementNotFound, 404, "Not Found", "The resource could not be found."),
    (MethodNotAllowed, 405, "Method Not Allowed", "The method specified is not allowed for this resource."),
    (NotAcceptableVersion, 406, "Not Acceptable",
     "The resource could not be generated that was acceptable to your browser (content of type "
     "application/json."),
    (NotAcceptable, 406, "Not Acceptable", "The resource could not be generated that was acceptable."),
    (PlacementConflict, 409, "Conflict",
     "There was a conflict when trying to complete your request."),
    (UnsupportedMediaType, 415, "Unsupported Media Type",
     "The request media type is not supported by this server."),
]


@dataclass
class Call:
    """One request as a handler sees it."""

    request: Request
    version: tuple[int, int]
    who: Identity
    store: Store
    params: dict[str, list[str]]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    last_modified: datetime | None = None

    def at_least(self, major: int, minor: int) -> bool:
        return self.version >= (major, minor)

    def path(self, name: str) -> str:
        return str(self.request.path_params[name])

    def one(self, name: str) -> str | None:
        values = self.params.get(name)
        return values[0] if values else None


Handler = Callable[[Call, Any], Any]


def _error_response(exc: PlacementError, version: tuple[int, int] | None, request_id: str,
                    headers: dict[str, str]) -> Response:
    status, title, explanation = next((s, t, e) for cls, s, t, e in STATUS if isinstance(exc, cls))
    err: dict[str, Any] = {"status": status, "title": title,
                           "detail": f"{explanation}\n\n {exc.detail}  ", "request_id": request_id}
    if version is not None and version >= ERROR_CODE_VERSION:
        err["code"] = exc.code
    if status == 406 and version is None:
        err["max_version"] = version_text(MAX_VERSION)
        err["min_version"] = version_text(MIN_VERSION)
    out = dict(headers)
    if isinstance(exc, MethodNotAllowed):
        out["allow"] = ", ".join(exc.allowed)
    return Response(json.dumps({"errors": [err]}), status_code=status, headers=out,
                    media_type="application/json")


def http_date(t: datetime) -> str:
    return format_datetime(t.astimezone(UTC).replace(microsecond=0), usegmt=True)


def endpoint(rule: str, handler: Callable[[Call, Any], Any], *, body: bool = False,
             sends_json: bool = True) -> Callable[[Request], Awaitable[Response]]:
    """Wrap `handler(call, body)` for policy `rule`. With `body`, the request
    must be application/json and its parsed body is passed; with
    `sends_json`, the caller must accept JSON."""

    async def run(request: Request) -> Response:
        request_id = f"req-{uuidlib.uuid4()}"
        headers = {"openstack-request-id": request_id, "x-openstack-request-id": request_id,
                   "vary": "openstack-api-version"}
        version: tuple[int, int] | None = None
        try:
            version = negotiate(request.headers)
            headers["openstack-api-version"] = f"placement {version_text(version)}"
            ctx = request.app.state.ctx
            who = _identity(ctx, request)
            accept = request.headers.get("accept", "")
            if sends_json and accept and not any(
                    a.strip().split(";")[0] in ("application/json", "*/*", "application/*")
                    for a in accept.split(",")):
                raise NotAcceptable("Only application/json is provided")
            data: Any = None
            if body:
                ctype = request.headers.get("content-type")
                if not ctype or ctype.split(";")[0].strip() != "application/json":
                    raise UnsupportedMediaType(
                        f"The media type {ctype.split(';')[0] if ctype else None} is not supported, "
                        "use application/json")
                raw = await request.body()
                try:
                    data = json.loads(raw)
                except ValueError as exc:
                    raise PlacementBadRequest(f"Malformed JSON: {exc}") from None
            params: dict[str, list[str]] = {}
            for k, v in request.query_params.multi_items():
                params.setdefault(k, []).append(v)
            call = Call(request, version, who, ctx.store, params)
            await run_in_threadpool(policy.authorize, call, rule)
            out = await run_in_threadpool(handler, call, data)
        except PlacementError as exc:
            return _error_response(exc, version, request_id, headers)
        headers.update(call.headers)
        if call.last_modified is not None and call.at_least(*LAST_MODIFIED_VERSION):
            headers["last-modified"] = http_date(call.last_modified)
            headers["cache-control"] = "no-cache"
        if out is None:
            return Response(status_code=call.status if call.status != 200 else 204, headers=headers)
        return Response(json.dumps(out), status_code=call.status, headers=headers,
                        media_type="application/json")

    return run


def _identity(ctx: Any, request: Request) -> Identity:
    token = request.headers.get("x-auth-token")
    authorization = f"Bearer {token}" if token else request.headers.get("authorization")
    try:
        who: Identity = ctx.authenticator.authenticate(authorization)
    except Unauthorized as exc:
        raise Unauthenticated(str(exc)) from None
    except Forbidden as exc:
        raise PlacementForbidden(str(exc)) from None
    return who
