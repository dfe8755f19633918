"""Admins' token endpoints: issue, list, read, revoke and delete access tokens
over the API, so tokens for new hosts can be made where only the API (not the
store) is reachable.

    GET    /apis/hvfleet.io/v1/accesstokens              AccessTokenList
    POST   /apis/hvfleet.io/v1/accesstokens              {"role": ..., "hypervisor": ...,
                                                          "name": ..., "ttl": "30d"}
    GET    /apis/hvfleet.io/v1/accesstokens/{id}
    POST   /apis/hvfleet.io/v1/accesstokens/{id}/revoke
    DELETE /apis/hvfleet.io/v1/accesstokens/{id}

A create answers 201 with the stored record and, in `status.token`, the bearer
token itself, as Kubernetes' TokenRequest does: the one time it is shown.
The same paths also speak the generic Store mapping (docs/store.md), so a
remote Store backend needs nothing special for tokens: POST of an AccessToken
record (its hash made by the client, which then never sends the secret at all),
PUT of a record (compare-and-swap on resourceVersion; `force=true` to take
fields over; who a token speaks for never changes and a revoke is final), GET
and DELETE as above. A record's subject speaks for one role, on every path
(hvfleet.store.tokens.create_token). The
resource is not in discovery (it is no CRD and no fleet kind); it is authorized
as "tokens", which only admins hold (hvfleet.server.auth.ROLE_GRANTS), and
every write is audited.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hvfleet.model.errors import BadRequest, NotFound, UnsupportedMediaType
from hvfleet.model.meta import API_VERSION, Model
from hvfleet.model.token import AccessToken, check_token_update
from hvfleet.ops.tokens import TokenAnswer, TokenQuery, issue
from hvfleet.server import bodies
from hvfleet.server.auth import TokenAuthenticator
from hvfleet.server.context import ApiContext
from hvfleet.server.guard import about, audited, authenticate, precheck
from hvfleet.server.identity import Action, Identity
from hvfleet.server.status import Target, invalid_object, unknown_fields
from hvfleet.store.tokens import (
    KIND,
    create_token,
    find_token,
    list_tokens,
    revoke_token,
)

PATH = "/apis/hvfleet.io/v1/accesstokens"
M = TypeVar("M", bound=Model)
_TARGET_KIND = "AccessToken"


def _target(name: str = "") -> Target:
    return Target("accesstokens", name, _TARGET_KIND)


def _record(ctx: ApiContext, token_id: str) -> AccessToken:
    record = find_token(ctx.store, token_id)
    if record is None:
        raise NotFound(f"token {token_id!r} not found")
    return record


async def _document(request: Request, ctx: ApiContext) -> dict[str, Any]:
    media = bodies.media_type(request)
    if media not in ("application/json", "*/*"):
        raise UnsupportedMediaType(f"accesstokens: the body must be application/json, not {media!r}")
    raw = await bodies.read_body(request, ctx.limits.max_body)
    return await bodies.parse_document(raw, "application/json") if raw.strip() else {}


def _validated(model: type[M], doc: dict[str, Any], target: Target, what: str) -> M:
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        unknown = [".".join(str(p) for p in e["loc"]) for e in exc.errors()
                   if e["type"] == "extra_forbidden"]
        if unknown:
            raise unknown_fields(unknown) from None
        raise invalid_object(exc, target, what) from None


def _is_record(doc: dict[str, Any]) -> bool:
    return doc.get("kind") == _TARGET_KIND


def _as_record(doc: dict[str, Any], target: Target) -> AccessToken:
    if doc.get("apiVersion") != API_VERSION:
        raise BadRequest(f"the body must be an AccessToken of apiVersion {API_VERSION}")
    return _validated(AccessToken, doc, target, _TARGET_KIND)


def _store_record(ctx: ApiContext, who: Identity, record: AccessToken) -> AccessToken:
    action = Action("create", "tokens", name=record.name)

    def write() -> AccessToken:
        ctx.authorize(who, action, None, record)
        return create_token(ctx.store, record, who.manager)

    out = audited(ctx, who, action, None, write)
    return out


def _replace(ctx: ApiContext, who: Identity, record: AccessToken, force: bool) -> AccessToken:
    current = _record(ctx, record.name)
    action = Action("update", "tokens", name=record.name, force=force)

    def write() -> AccessToken:
        ctx.authorize(who, action, current, record)
        # Checked against the state the update's compare-and-swap names: a
        # record whose resourceVersion is not `current`'s is refused as stale.
        check_token_update(current, record)
        out = ctx.store.update(record, who.manager, force=force)
        assert isinstance(out, AccessToken)
        return out

    out = audited(ctx, who, action, current, write)
    _forget(ctx, record.name)
    return out


def _issue(ctx: ApiContext, who: Identity, body: TokenQuery) -> dict[str, Any]:
    action = Action("create", "tokens", name=body.name)
    issued: list[TokenAnswer] = []

    def write() -> AccessToken:
        ctx.authorize(who, action)
        issued.append(issue(ctx.store, body, who.manager))
        return issued[0].record

    audited(ctx, who, action, None, write)
    return issued[0].document()


async def collection(request: Request) -> Response:
    ctx: ApiContext = request.app.state.ctx
    about(request, _target())
    if request.method == "POST":
        bodies.no_dry_run(request, "access tokens")
        who = await authenticate(ctx, request)
        doc = await _document(request, ctx)
        if _is_record(doc):
            record = _as_record(doc, _target(str((doc.get("metadata") or {}).get("name", ""))))
            stored = await run_in_threadpool(_store_record, ctx, who, record)
            return JSONResponse(stored.to_dict(), status_code=201)
        body = _validated(TokenQuery, doc, _target(), "accesstokens")
        return JSONResponse(await run_in_threadpool(_issue, ctx, who, body), status_code=201)
    who = await authenticate(ctx, request)
    ctx.authorize(who, Action("list", "tokens"))
    items = await run_in_threadpool(list_tokens, ctx.store)
    return JSONResponse({"apiVersion": API_VERSION, "kind": "AccessTokenList", "metadata": {},
                         "items": [t.to_dict() for t in items]})


def _revoke(ctx: ApiContext, who: Identity, token_id: str) -> AccessToken:
    current = _record(ctx, token_id)
    action = Action("update", "tokens", name=token_id)

    def write() -> AccessToken:
        ctx.authorize(who, action, current, None)
        return revoke_token(ctx.store, token_id, who.manager)

    out = audited(ctx, who, action, current, write)
    _forget(ctx, token_id)
    return out


def _forget(ctx: ApiContext, token_id: str) -> None:
    """This replica stops accepting the token at once; the others within their
    cache age."""
    if isinstance(ctx.authenticator, TokenAuthenticator):
        ctx.authenticator.forget([token_id])


def _delete(ctx: ApiContext, who: Identity, token_id: str) -> AccessToken:
    current = _record(ctx, token_id)
    action = Action("delete", "tokens", name=token_id)

    def write() -> AccessToken:
        ctx.authorize(who, action, current, None)
        ctx.store.delete(KIND, token_id, current.metadata.resource_version)
        return current

    out = audited(ctx, who, action, current, write)
    _forget(ctx, token_id)
    return out


async def item(request: Request) -> Response:
    ctx: ApiContext = request.app.state.ctx
    token_id = request.path_params["name"]
    about(request, _target(token_id))
    who = await authenticate(ctx, request)
    if request.method == "GET":
        # Authorized before the lookup: a non-admin learns nothing, not even existence.
        ctx.authorize(who, Action("get", "tokens", name=token_id))
        record = await run_in_threadpool(_record, ctx, token_id)
        return JSONResponse(record.to_dict())
    bodies.no_dry_run(request, "access tokens")
    # A write is authorized before the token is looked up (a refusal says
    # nothing of whether it exists), and a refusal is audited like every write.
    if request.method == "PUT":
        doc = await _document(request, ctx)
        precheck(ctx, who, Action("update", "tokens", name=token_id))
        record = _as_record(doc, _target(token_id))
        if record.name != token_id:
            raise BadRequest(f"the name of the object ({record.name}) does not match the name "
                             f"on the URL ({token_id})")
        force = request.query_params.get("force", "").lower() in ("true", "1")
        out = await run_in_threadpool(_replace, ctx, who, record, force)
        return JSONResponse(out.to_dict())
    await bodies.read_body(request, ctx.limits.max_body)
    if request.method == "DELETE":
        precheck(ctx, who, Action("delete", "tokens", name=token_id))
        return JSONResponse((await run_in_threadpool(_delete, ctx, who, token_id)).to_dict())
    precheck(ctx, who, Action("update", "tokens", name=token_id))
    return JSONResponse((await run_in_threadpool(_revoke, ctx, who, token_id)).to_dict())


def token_routes() -> list[Route]:
    """The routes, to be placed before the generic {plural} ones."""
    return [
        Route(PATH, collection, methods=["GET", "POST"]),
        Route(f"{PATH}/{{name}}/revoke", item, methods=["POST"]),
        Route(f"{PATH}/{{name}}", item, methods=["GET", "PUT", "DELETE"]),
    ]
