"""The atomic batch endpoint: `Store.write_all` over the API.

    POST /apis/hvfleet.io/v1/batch[?force=true]
    {"writes": [{"action": "create" | "update", "object": {...}}, ...]}
    → 200 {"kind": "BatchResult", "items": [the stored objects, in order]}

Each write is authorized for the caller as the single request it stands for
(a create; an update of the main resource and/or of /status, by what it
changes), all before anything is written; then one `store.write_all` writes
them all or none, as the caller's field manager. A failure is the Status of
the first write that failed (404, 409 with its causes, 403, 422), and nothing
is written. A Reservation is never created here: creating one is a claim
(POST …/reservations), as `hvfleet apply` says too. The remote store's
`write_all` and `update` of both status and spec use this endpoint.
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hvfleet.model.errors import BadRequest, InvalidInput, UnsupportedMediaType
from hvfleet.model.hypervisor import Reservation, Resource
from hvfleet.server import bodies
from hvfleet.server.context import ApiContext
from hvfleet.server.discovery import BY_KIND
from hvfleet.server.identity import Action, Identity
from hvfleet.server.resources import _flag, _no_dry_run, authenticate, code_of, error_response
from hvfleet.server.status import Target
from hvfleet.store.base import OwnershipConflict, Write, changed_parts, check_batch

PATH = "/apis/hvfleet.io/v1/batch"


def parse_writes(doc: dict[str, Any], validation: str) -> list[Write]:
    writes = doc.get("writes")
    if not isinstance(writes, list):
        raise BadRequest('batch: the body must be {"writes": [{"action": ..., "object": ...}, ...]}')
    out: list[Write] = []
    for i, item in enumerate(writes):
        if not isinstance(item, dict) or item.get("action") not in ("create", "update"):
            raise BadRequest(f"writes[{i}]: needs action create or update, and an object")
        obj = item.get("object")
        kind = obj.get("kind") if isinstance(obj, dict) else None
        info = BY_KIND.get(kind) if isinstance(kind, str) else None
        if info is None or not isinstance(obj, dict):
            raise BadRequest(f"writes[{i}].object: kind must be one of {', '.join(BY_KIND)}")
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        target = Target(info.plural, str((meta or {}).get("name", "")), info.kind)
        parsed, _ = bodies.to_object(obj, info.kind, target, validation)
        out.append(Write(item["action"], parsed))
    check_batch(out)
    return out


def _actions(ctx: ApiContext, write: Write, force: bool) -> tuple[list[Action], Resource | None]:
    """The requests this write stands for, and the stored object it replaces."""
    obj = write.object
    plural, name = BY_KIND[obj.kind].plural, obj.metadata.name
    if write.action == "create":
        if isinstance(obj, Reservation):
            raise InvalidInput(f"Reservation {name}: is created only by a claim "
                               "(POST /apis/hvfleet.io/v1/reservations, `hvfleet reserve`)")
        return [Action("create", plural, name)], None
    current = ctx.store.get(obj.kind, name)
    status_changed, rest_changed = changed_parts(current, obj)
    actions = []
    if rest_changed or not status_changed:
        actions.append(Action("update", plural, name, None, force))
    if status_changed:
        actions.append(Action("update", plural, name, "status", force))
    return actions, current


def write_batch(ctx: ApiContext, who: Identity, writes: list[Write], force: bool) -> list[Resource]:
    planned: list[tuple[Action, Resource | None]] = []
    try:
        for w in writes:
            actions, current = _actions(ctx, w, force)
            for action in actions:
                planned.append((action, current))
                ctx.authorize(who, action, current, w.object)
        out = ctx.store.write_all(writes, who.manager, force=force)
    except Exception as exc:
        if ctx.audit is not None and planned:
            code, reason = code_of(exc)
            for action, current in planned:
                ctx.audit.record(who, action, before=_rv(current), after=None, code=code,
                                 reason=reason)
        raise
    if ctx.audit is not None:
        stored: dict[tuple[str, str], Resource] = {(o.kind, o.metadata.name): o for o in out}
        for action, current in planned:
            after = stored.get((BY_KIND_PLURAL[action.resource], action.name or ""))
            code, reason = (201, "Created") if action.verb == "create" else (200, "OK")
            ctx.audit.record(who, action, before=_rv(current),
                             after=None if after is None else after.metadata.resource_version,
                             code=code, reason=reason)
    return out


BY_KIND_PLURAL = {info.plural: kind for kind, info in BY_KIND.items()}


def _rv(obj: Resource | None) -> str | None:
    return None if obj is None else obj.metadata.resource_version


async def batch(request: Request) -> Response:
    ctx: ApiContext = request.app.state.ctx
    try:
        _no_dry_run(request)
        force = _flag(request, "force")
        validation = bodies.field_validation(request.query_params.get("fieldValidation"))
        media = bodies.media_type(request)
        if media not in ("application/json", "*/*"):
            raise UnsupportedMediaType(f"batch: the body must be application/json, not {media!r}")
        who = await authenticate(ctx, request)
        doc = bodies.decode_document(await bodies.read_body(request, ctx.limits.max_body), media)
        writes = parse_writes(doc, validation)
        out = await run_in_threadpool(write_batch, ctx, who, writes, force)
    except OwnershipConflict as exc:
        plural = BY_KIND[exc.kind].plural if exc.kind in BY_KIND else ""
        return error_response(exc, Target(plural, exc.name, exc.kind))
    except Exception as exc:
        return error_response(exc, Target())
    return JSONResponse({"kind": "BatchResult", "apiVersion": "hvfleet.io/v1",
                         "items": [o.to_dict() for o in out]})
