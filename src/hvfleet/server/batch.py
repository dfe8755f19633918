"""`POST /apis/hvfleet.io/v1/batch`: several writes, all or nothing (`Store.write_all`).

The body is `{"writes": [{"action": "create"|"update", "object": {...}}, ...]}`;
a write that is a server-side apply (`Write.applied`) also carries
`"applied": FieldsV1`, the fields of its configuration
(docs/store.md: what a remote Store backend sends for `write_all`, and what
`apply -f` of several documents becomes). Each object is decoded strictly;
each write is authorized as its own create or update — and as an update of
`/status` where it changes the status — with the stored and the new object,
all of them before any store error is answered; then one `write_all` writes them all as
the caller, or raises the first failure and writes nothing. Objects are
written whole, with Store semantics (status included, checked by the store's
ownership rules). A new Reservation cannot be created here: only a claim
(`POST reservations`) checks free capacity.
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hvfleet.model.errors import BadRequest, InvalidInput, NotFound, UnsupportedMediaType
from hvfleet.model.hypervisor import Resource
from hvfleet.model.kinds import strategy_of
from hvfleet.model.meta import API_VERSION
from hvfleet.server import bodies
from hvfleet.server.context import ApiContext
from hvfleet.server.discovery import BY_KIND
from hvfleet.server.guard import about, authenticate, code_of, precheck
from hvfleet.server.identity import Action, Identity
from hvfleet.server.status import ApiError, Target
from hvfleet.store.base import Write
from hvfleet.store.ownership import from_fields_v1
from hvfleet.store.undecodable import Undecodable


def _decode(doc: Any, validation: str) -> list[Write]:
    if not isinstance(doc, dict) or set(doc) != {"writes"} or not isinstance(doc["writes"], list):
        raise BadRequest('batch: the body must be {"writes": [{"action": ..., "object": {...}}, ...]}')
    writes: list[Write] = []
    for i, item in enumerate(doc["writes"]):
        where = f"writes[{i}]"
        if not isinstance(item, dict) or not {"action", "object"} <= set(item) <= {
                "action", "object", "applied"}:
            raise InvalidInput("must be {action, object[, applied]}", field=where)
        applied = item.get("applied")
        if applied is not None and not isinstance(applied, dict):
            raise InvalidInput("applied: must be FieldsV1 (an object)", field=where)
        if item["action"] not in ("create", "update"):
            raise InvalidInput(f"action: {item['action']!r} is not create or update", field=where)
        obj = item["object"]
        kind = obj.get("kind") if isinstance(obj, dict) else None
        if kind not in BY_KIND:
            raise InvalidInput(f"object.kind: {kind!r} is not one of {', '.join(BY_KIND)}", field=where)
        meta = obj.get("metadata")
        name = meta.get("name", "") if isinstance(meta, dict) else ""
        try:
            resource, _ = bodies.to_object(obj, kind, Target(BY_KIND[kind].plural, str(name), kind),
                                           validation)
        except ApiError as exc:
            raise ApiError(exc.code, exc.reason, f"{where}: {exc.message}",
                           [{**c, "field": f"{where}.object.{c['field']}"} for c in exc.causes]) from None
        if item["action"] == "create" and strategy_of(resource).claimed:
            raise InvalidInput("a new Reservation must be claimed (POST reservations), which checks "
                               "free capacity atomically", field=where)
        writes.append(Write(item["action"], resource,
                            None if applied is None else frozenset(from_fields_v1(applied))))
    if not writes:
        raise BadRequest("batch: no writes")
    return writes


def _actions(write: Write, current: Resource | None, force: bool) -> list[Action]:
    """What a write asks to do: create; or update the object, its /status, or both."""
    info = BY_KIND[write.object.kind]
    name = write.object.metadata.name
    if write.action == "create":
        return [Action("create", info.plural, name)]
    new = write.object
    status_changed = (current is not None and info.has_status
                      and getattr(current, "status", None) != getattr(new, "status", None))
    rest_changed = (current is None or current.spec != new.spec
                    or current.metadata.labels != new.metadata.labels
                    or current.metadata.annotations != new.metadata.annotations)
    out = []
    if rest_changed or not status_changed:
        out.append(Action("update", info.plural, name, None, force, apply=write.applied is not None))
    if status_changed:
        out.append(Action("update", info.plural, name, "status", force))
    return out


def write_batch(ctx: ApiContext, who: Identity, writes: list[Write], force: bool) -> list[Resource]:
    # Every write is authorized before any store error is answered: a refusal
    # comes first and tells nothing of which objects exist.
    checked: list[tuple[Write, Resource | None, list[Action]]] = []
    for w in writes:
        current: Resource | None = None
        if w.action == "update":
            try:
                current = ctx.store.get(w.object.kind, w.object.metadata.name)
            except NotFound:
                current = None  # write_all answers NotFound for it, writing nothing
            except Undecodable:
                current = None  # write_all overwrites it at the version named
        actions = _actions(w, current, force)
        for action in actions:
            precheck(ctx, who, action, current.metadata.resource_version if current is not None else None,
                     current, w.object)
        checked.append((w, current, actions))
    try:
        out = ctx.store.write_all(writes, who.manager, force=force)
    except Exception as exc:
        if ctx.audit is not None:
            code, reason = code_of(exc)
            for _, current, actions in checked:
                before = current.metadata.resource_version if current is not None else None
                ctx.audit.record(who, actions[0], before=before, after=None, code=code, reason=reason)
        raise
    if ctx.audit is not None:
        for (w, current, actions), stored in zip(checked, out, strict=True):
            before = current.metadata.resource_version if current is not None else None
            ctx.audit.record(who, actions[0], before=before, after=stored.metadata.resource_version,
                             code=201 if w.action == "create" else 200,
                             reason="Created" if w.action == "create" else "OK")
    return out


async def batch(request: Request) -> Response:
    ctx: ApiContext = request.app.state.ctx
    about(request, Target(name="batch"))
    bodies.no_dry_run(request, "a batch")
    media = bodies.media_type(request)
    if media not in ("application/json", "*/*"):
        raise UnsupportedMediaType(f"batch: the body must be application/json, not {media!r}")
    validation = bodies.field_validation(request.query_params.get("fieldValidation"))
    force = request.query_params.get("force", "").lower() in ("true", "1")
    who = await authenticate(ctx, request, Action("create", "batch"))
    raw = await bodies.read_body(request, ctx.limits.max_body)
    writes = _decode(await bodies.parse_document(raw, "application/json"), validation)
    out = await run_in_threadpool(write_batch, ctx, who, writes, force)
    return JSONResponse({"apiVersion": API_VERSION, "kind": "BatchResult",
                         "items": [o.to_dict() for o in out]})
