"""The resource handlers: collections, objects and their /status subresource.

Each handler parses the request, authenticates, builds an `Action`, asks the
authorizer, makes one store call and renders the answer; an error is raised,
and the server's guard (hvfleet.server.guard) answers it with a Status.
Writes always name `Identity.manager` as the field manager (a client's
`fieldManager` is ignored);
creating a Reservation is a claim (`hvfleet.scheduling.claims.claim_reservation`,
the same atomic check as `hvfleet reserve`); server-side apply merges with
the store's ownership rules (`hvfleet.store.apply.plan_one`, as `hvfleet apply`) and
is the only write that can meet an ownership conflict: PUT and PATCH are
Updates, which take the fields they change from whoever owned them. A write
that reads first (PATCH, DELETE) writes with the version it read and
authorized, and starts over if that version went stale meanwhile. `dryRun=All`
takes the same path, authorization and audit included, and ends in the store's
dry run of the write (`Store.dry_run*`: the same checks, no commit).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hvfleet.model.documents import without_nulls
from hvfleet.model.errors import (
    BadRequest,
    Conflict,
    Gone,
    InvalidInput,
    NotFound,
    UnsupportedMediaType,
)
from hvfleet.model.hypervisor import Reservation, Resource
from hvfleet.model.kinds import strategy_of
from hvfleet.model.meta import API_VERSION
from hvfleet.model.selectors import Selector, parse_selector
from hvfleet.scheduling.claims import claim_reservation
from hvfleet.server import bodies
from hvfleet.server.context import CONTINUE_MISMATCH, ApiContext
from hvfleet.server.discovery import BY_KIND, RESOURCES, ResourceInfo
from hvfleet.server.field_selector import parse_field_selector
from hvfleet.server.guard import (
    about,
    audited,
    audited_on_loop,
    authenticate,
    precheck,
    refusals_audited,
)
from hvfleet.server.identity import Action, Identity, Verb
from hvfleet.server.narrowing import get_visible, view_of
from hvfleet.server.negotiation import (
    PARTIAL_LIST,
    Form,
    a_list,
    encoded,
    form_of,
    include_object,
    not_a_list,
    partial_metadata,
)
from hvfleet.server.read_options import check_not_newer, read_options
from hvfleet.server.status import ApiError, Target, status, success
from hvfleet.server.table import TableInputs, table
from hvfleet.server.threads import in_thread
from hvfleet.server.watch_stream import WatchResponse
from hvfleet.store import lifecycle
from hvfleet.store.apply import plan_one
from hvfleet.store.base import FieldPath, StaleVersion, Write
from hvfleet.store.errors import RevisionNotReached
from hvfleet.store.ownership import applied_fields, named_fields, spec_changes, spec_paths
from hvfleet.store.undecodable import Undecodable

# The field manager of the apply `kubectl apply --server-side` sends after its
# own, holding only the last-applied-configuration annotation.
LAST_APPLIED_MANAGER = "kubectl-last-applied"


# -- plumbing ---------------------------------------------------------------------------

def _info(request: Request) -> ResourceInfo:
    info = RESOURCES.get(request.path_params["plural"])
    if info is None:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    return info


def _flag(request: Request, name: str) -> bool:
    value = request.query_params.get(name, "").lower()
    if value not in ("", "true", "false", "1", "0"):
        raise BadRequest(f"{name}: {value!r} is not a boolean")
    return value in ("true", "1")


def _update(ctx: ApiContext, who: Identity, current: Resource, new: Resource, force: bool,
            dry_run: bool, applied: frozenset[FieldPath] | None = None) -> Resource:
    """The store's compare-and-swap update of `new` over `current` (with
    `applied`: a server-side apply of those fields), or its dry run; the one
    that removes the last finalizer of an object being deleted deletes it
    (hvfleet.store.lifecycle.update)."""
    def write(new: Resource) -> Resource:
        if dry_run:
            return ctx.store.dry_run(Write("update", new, applied), who.manager, force=force)
        if applied is not None:
            return ctx.store.write_all([Write("update", new, applied)], who.manager, force=force)[0]
        return ctx.store.update(new, who.manager, force=force)

    return lifecycle.update(ctx.store, current, new, write, dry_run=dry_run)


def authorize_write(ctx: ApiContext, who: Identity, action: Action, current: Resource | None,
                    new: Resource) -> None:
    """The write's authorization. Owner references arrange an object's deletion
    (the garbage collector deletes it with its owners): setting or changing
    them takes the right to delete the object too, not only to write it."""
    ctx.authorize(who, action, current, new)
    before = current.metadata.owner_references if current is not None else None
    if (new.metadata.owner_references or None) != (before or None):
        ctx.authorize(who, Action("delete", BY_KIND[new.kind].plural, name=new.metadata.name or None,
                                  dry_run=action.dry_run), current, None)


def field_validation(request: Request) -> str:
    """The request's fieldValidation; kube-apiserver's default is Warn (drop
    unknown fields and say so in a Warning header), and so is this API's."""
    return bodies.field_validation(request.query_params.get("fieldValidation") or "Warn")


# The Warning header's size, as kube-apiserver bounds its warnings (4 KiB in
# all; past it each is cut to 256 characters, then the rest are dropped): an
# object with thousands of unknown fields made a header past the 64 KiB line
# Python's clients read, and the write that succeeded looked failed.
WARNINGS_MAX = 4096
WARNING_CUT = 256


def warning_header(warnings: list[str] | None) -> dict[str, str] | None:
    """The Warning header kubectl prints (one `299 - "text"` per warning)."""
    if not warnings:
        return None

    def texts(cut: int) -> list[str]:
        # A header is printable ASCII on one line: anything else (a stored
        # message quoted in a warning) is shown as '?'.
        return ['299 - "' + "".join(c if " " <= c <= "~" else "?" for c in w[:cut])
                .replace("\\", "\\\\").replace('"', '\\"') + '"' for w in warnings]

    whole = texts(1000)
    if sum(len(t) + 2 for t in whole) <= WARNINGS_MAX:
        return {"Warning": ", ".join(whole)}
    kept: list[str] = []
    size = 0
    for t in texts(WARNING_CUT):
        if size + len(t) + 2 > WARNINGS_MAX - 64:  # room for the count of the rest
            break
        kept.append(t)
        size += len(t) + 2
    if len(kept) < len(warnings):
        kept.append(f'299 - "and {len(warnings) - len(kept)} more warnings not shown"')
    return {"Warning": ", ".join(kept)}


def _unreadable_warnings(found: list[Undecodable]) -> list[str]:
    return [str(err) for err in found[:20]] + (
        [f"and {len(found) - 20} more objects that cannot be read"] if len(found) > 20 else [])


def render(request: Request, ctx: ApiContext, info: ResourceInfo, obj: Resource, code: int = 200,
           warnings: list[str] | None = None, inputs: TableInputs | None = None) -> Response:
    """One object's answer in the form the client negotiated (the object,
    a Table, or its PartialObjectMetadata)."""
    headers = warning_header(warnings)
    form = form_of(request)
    if form.table:
        inputs = ctx.table_inputs(info.kind) if inputs is None else inputs
        body = table(info.kind, [obj], inputs, obj.metadata.resource_version or "",
                     include_object(request), api_version=form.meta_api_version)
        return encoded(form, body, code, headers)
    if form.kind:
        return encoded(form, partial_metadata(obj.to_dict()["metadata"], form), code, headers)
    return encoded(form, obj.to_json(), code, headers)


def list_answer(form: Form, info: ResourceInfo, items: list[Resource], meta: dict[str, Any],
                headers: dict[str, str] | None = None) -> Response:
    """A list's answer: the kind's List, or meta.k8s.io's
    PartialObjectMetadataList (a Table is built by its caller)."""
    if form.kind == PARTIAL_LIST:
        return encoded(form, {"kind": PARTIAL_LIST, "apiVersion": form.meta_api_version,
                              "metadata": meta,
                              "items": [partial_metadata(o.to_dict()["metadata"], form)
                                        for o in items]}, headers=headers)
    return encoded(form, {"apiVersion": API_VERSION, "kind": f"{info.kind}List", "metadata": meta,
                          "items": [o.to_dict() for o in items]}, headers=headers)


def _retrying(ctx: ApiContext, pinned: bool, attempt: Callable[[], Resource | None]) -> Resource | None:
    """Read-authorize-write, again while the version read went stale — unless the
    client named the version itself (then a stale one is its Conflict)."""
    for n in range(ctx.limits.write_attempts):
        try:
            return attempt()
        except StaleVersion:
            if pinned or n == ctx.limits.write_attempts - 1:
                raise
            ctx.store.pause_after_conflict(n)
    raise AssertionError("unreachable")


# -- collections ----------------------------------------------------------------------------

def label_selector(text: str | None) -> Selector:
    """A query's labelSelector: one that does not parse is a malformed request
    (400 BadRequest, as kube-apiserver answers), not an invalid object."""
    try:
        return parse_selector(text)
    except BadRequest:
        raise
    except InvalidInput as exc:
        raise BadRequest(f"labelSelector: {exc.detail}") from None


def list_binding(who: Identity, kind: str, label_selector: str, field_selector: str) -> str:
    """What a continue token and its snapshot are bound to: the caller, the
    kind and the selectors of the list that issued it."""
    text = json.dumps([who.token_id, who.subject, kind, label_selector, field_selector])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _encode_continue(revision: int, after: str, snapshot: str, binding: str) -> str:
    raw = json.dumps({"rv": revision, "after": after, "snapshot": snapshot, "for": binding}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_continue(token: str, binding: str) -> tuple[int, str, str]:
    """(the revision the list was read at, -1 for "the current one"; the last
    name of the previous page; the snapshot it was cut from); BadRequest for a
    token of another list (caller, kind or selector). The binding is a hash of
    what the caller sends anyway, so every replica checks it alike."""
    try:
        # Strict: anything after the padding is no token this server issued.
        data = json.loads(base64.b64decode(token.encode(), altchars=b"-_", validate=True))
        revision = data["rv"]
        after, snapshot, bound = data["after"], data.get("snapshot", ""), data.get("for", "")
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
        raise BadRequest("continue: not a token this server issued") from None
    if (not isinstance(after, str) or not isinstance(snapshot, str) or not isinstance(bound, str)
            or not isinstance(revision, int) or isinstance(revision, bool) or revision < -1):
        raise BadRequest("continue: not a token this server issued")
    if not hmac.compare_digest(bound, binding):
        raise BadRequest(CONTINUE_MISMATCH)
    return revision, after, snapshot


# kube-apiserver's words (storage/etcd3 interpretListError) for a continue token
# whose revision was compacted: the Status carries a fresh token that goes on
# from the same name at the current revision.
CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. "
    "You can start a new list without the continue parameter, or use the continue token "
    "in this response to retrieve the remainder of the results. Continuing with the "
    "provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may "
    "show up in the list."
)


def _continue_expired(after: str, binding: str) -> Response:
    body = status(410, "Expired", CONTINUE_EXPIRED)
    body["metadata"] = {"continue": _encode_continue(-1, after, "", binding)}
    return JSONResponse(body, status_code=410)


def _limit(request: Request) -> int | None:
    return bodies.query_int(request, "limit") or None


async def collection(request: Request) -> Response:
    ctx: ApiContext = request.app.state.ctx
    info = _info(request)
    if request.method == "POST":
        return await create(request, ctx, info)  # negotiates once its caller is known
    # The answer's form first: a client nothing can be answered to gets 406
    # before anything is read or written (kube negotiates first too).
    form = form_of(request, stream=request.method == "GET" and _flag(request, "watch"))
    if _flag(request, "watch"):
        return await watch(request, ctx, info)
    a_list(form)
    if request.method == "DELETE":
        return await delete_collection(request, ctx, info)
    return await list_objects(request, ctx, info)


async def list_objects(request: Request, ctx: ApiContext, info: ResourceInfo) -> Response:
    q = request.query_params
    selector = label_selector(q.get("labelSelector"))
    names = parse_field_selector(q.get("fieldSelector"))
    options = read_options(q, watch=False)
    limit = _limit(request)
    who = await authenticate(ctx, request)
    narrowed = ctx.authorize_read(who, Action("list", info.plural, name=names.equal))
    view = None if narrowed is None else await in_thread(view_of, ctx.store, narrowed)
    binding = list_binding(who, info.kind, q.get("labelSelector", ""), q.get("fieldSelector", ""))
    token_rv, after, snapshot = (_decode_continue(q["continue"], binding) if q.get("continue")
                                 else (-1, None, ""))
    # A later page is cut at the revision the first page was read at: from this
    # process's copy of that read when it still has one (one store read for a
    # whole `kubectl get`), else read at that revision from the store's history
    # (any replica can: etcd keeps revisions until compaction, SQLite its event
    # log), else 410 Expired with a token that goes on at the current revision.
    kept = ctx.list_snapshots.get(snapshot, binding) if snapshot else None
    # Objects that do not decode are skipped (the store logs and counts them);
    # the first page names them in a Warning, and a Table shows them Unknown.
    unreadable: list[Undecodable] = []
    if kept is not None:
        revision, everything = kept
    else:
        if token_rv >= 0:
            try:
                result = await in_thread(ctx.store.list_at, info.kind, token_rv, selector)
            except Gone:
                assert after is not None
                return _continue_expired(after, binding)
            except RevisionNotReached:
                # Only a token edited by hand names a revision no replica has read at.
                raise BadRequest(f"continue: not a token this server issued (revision {token_rv} "
                                 "is past the store's)") from None
        else:
            result = await in_thread(ctx.store.list, info.kind, selector)
            check_not_newer(options, result.revision)
            exact = options.exact(limited=limit is not None)
            if exact is not None and exact != result.revision:
                # The objects as they were at that revision, from the store's history.
                result = await in_thread(ctx.store.list_at, info.kind, exact, selector)
        revision = result.revision
        everything = [o for o in result.items if names.matches(o.metadata.name)]
        unreadable = [e for e in result.undecodable
                      if names.matches(e.name) and (after is None or e.name > after)]
    if view is not None:
        everything = [o for o in everything if view.visible(o)]
        unreadable = []  # whether the caller may see them cannot be judged
    items = [o for o in everything if after is None or o.metadata.name > after]
    token, remaining = "", None
    if limit is not None and len(items) > limit:
        # As kube-apiserver: only a list without label or field selectors says
        # how many items are left (ListMeta.remainingItemCount).
        selected = bool(q.get("labelSelector") or q.get("fieldSelector"))
        remaining = None if selected else len(items) - limit
        items = items[:limit]
        snapshot = snapshot if kept is not None else ctx.list_snapshots.put(revision, everything, binding)
        token = _encode_continue(revision, items[-1].metadata.name, snapshot, binding)
    rv = str(revision)
    headers = warning_header(_unreadable_warnings(unreadable))
    form = form_of(request)
    if form.table:
        inputs = (await in_thread(ctx.table_inputs, info.kind) if view is None
                  else view.table_inputs)
        body = table(info.kind, items, inputs, rv, include_object(request), token, unreadable,
                     api_version=form.meta_api_version)
        return encoded(form, body, headers=headers)
    meta: dict[str, Any] = {"resourceVersion": rv}
    if token:
        meta["continue"] = token
    if remaining is not None:
        meta["remainingItemCount"] = remaining
    return list_answer(form, info, items, meta, headers)


async def watch(request: Request, ctx: ApiContext, info: ResourceInfo) -> Response:
    q = request.query_params
    selector = label_selector(q.get("labelSelector"))
    names = parse_field_selector(q.get("fieldSelector"))
    options = read_options(q, watch=True)
    timeout_s = bodies.query_int(request, "timeoutSeconds")
    limits = ctx.limits.watch
    # 0, as no value, means the server's longest watch (as in Kubernetes).
    timeout = min(float(timeout_s), limits.max_timeout) if timeout_s else limits.max_timeout
    who = await authenticate(ctx, request)
    narrowed = ctx.authorize_read(who, Action("watch", info.plural, name=names.equal))
    release = ctx.hub.acquire(who.token_id)
    try:
        fanout = await in_thread(ctx.hub.fanout, info.kind)
        initial: list[Resource] | None = None
        # Without sendInitialEvents, kube's default: the current objects first (as
        # ADDED) when no version is given, else changes after the version.
        send_initial = (options.send_initial_events if options.send_initial_events is not None
                        else options.resource_version in ("", "0"))
        if send_initial:
            listed = await in_thread(ctx.store.list, info.kind, selector)
            check_not_newer(options, listed.revision)
            since = listed.revision
            initial = listed.items
        else:
            current = await in_thread(ctx.store.revision)
            check_not_newer(options, current)
            since = options.revision if options.revision is not None else current
        return WatchResponse(
            ctx, fanout, info.kind, since, initial, selector=selector, names=names,
            bookmarks=_flag(request, "allowWatchBookmarks"), timeout=timeout,
            form=form_of(request, stream=True),
            include_object=include_object(request) if form_of(request, stream=True).table else "",
            release=release,
            view=None if narrowed is None else partial(view_of, ctx.store, narrowed),
            authorization=request.headers.get("authorization"),
            initial_events_end=bool(options.send_initial_events),
        )
    except BaseException:
        release()
        raise


async def create(request: Request, ctx: ApiContext, info: ResourceInfo) -> Response:
    dry_run = bodies.dry_run(request)
    # Who is asking comes first: nothing is read or decoded for an anonymous caller.
    action = Action("create", info.plural, dry_run=dry_run)
    who = await authenticate(ctx, request, action)
    # Every refusal from here on has its audit line (a body that does not
    # decode, an invalid object, an answer nobody can be given), as the
    # write's own have (`create_object`).
    with refusals_audited(ctx, who, action):
        not_a_list(form_of(request))
        validation = field_validation(request)
        media = bodies.media_type(request)
        if media not in bodies.OBJECT_TYPES:
            raise UnsupportedMediaType(f"create: the body must be application/json or "
                                       f"application/yaml, not {media!r}")
        body = await bodies.read_body(request, ctx.limits.max_body)
        doc, twice = await bodies.parse_object_body(body, media, validation)
        name = (doc.get("metadata") or {}).get("name", "") if isinstance(doc.get("metadata"), dict) else ""
        target = Target(info.plural, str(name), info.kind)
        about(request, target)  # the object the body names, in any error's Status
        obj, warnings = bodies.to_object(doc, info.kind, target, validation)
        out = await in_thread(create_object, ctx, who, info, obj, dry_run)
    return render(request, ctx, info, out, 201, twice + warnings)


def create_object(ctx: ApiContext, who: Identity, info: ResourceInfo, obj: Resource,
                  dry_run: bool = False, applied: frozenset[FieldPath] | None = None) -> Resource:
    """Create (a Reservation: claim) as the caller, or its dry run; with
    `applied`, a server-side apply's create (its fields are applied ones)."""
    action = Action("create", info.plural, name=obj.metadata.name or None, dry_run=dry_run)

    def create_one(candidate: Resource) -> Resource:
        if isinstance(candidate, Reservation):
            try:
                return claim_reservation(ctx.store, candidate, who.manager,
                                         staleness=ctx.limits.claim_staleness, dry_run=dry_run)
            except NotFound as exc:
                # The missing object is the host the reservation names, not the
                # reservation: a 404 would read as "reservation not found".
                raise InvalidInput(str(exc), field="spec.hypervisor") from None
        if dry_run:
            return ctx.store.dry_run(Write("create", candidate, applied), who.manager)
        if applied is not None:
            return ctx.store.write_all([Write("create", candidate, applied)], who.manager)[0]
        return ctx.store.create(candidate, who.manager)

    def write() -> Resource:
        # metadata.generateName without a name: a generated one, another on a collision.
        return lifecycle.create_named(obj, create_one)

    out = audited(ctx, who, action, None, write, check=lambda: authorize_write(ctx, who, action, None, obj))
    assert out is not None
    return out


# -- objects --------------------------------------------------------------------------------

async def item(request: Request) -> Response:
    ctx: ApiContext = request.app.state.ctx
    sub = "status" if request.url.path.endswith("/status") else None
    info = _info(request)
    name = request.path_params["name"]
    if sub is not None and not info.has_status:
        raise ApiError(404, "NotFound", f"{info.plural} have no status subresource")
    if request.method == "GET":
        not_a_list(form_of(request))
        # A get's only read option: a version past the newest is 504, as for lists.
        options = read_options({"resourceVersion": request.query_params.get("resourceVersion", "")},
                               watch=False)
        who = await authenticate(ctx, request)
        action = Action("get", info.plural, name=name, subresource=sub)
        narrowed = ctx.authorize_read(who, action)
        if options.revision is not None:
            check_not_newer(options, await in_thread(ctx.store.revision))
        if narrowed is not None:
            obj, view = await in_thread(get_visible, ctx.store, who, action, info.kind,
                                                narrowed)
            return render(request, ctx, info, obj, inputs=view.table_inputs)
        try:
            obj = await in_thread(ctx.store.get, info.kind, name)
        except Undecodable as exc:
            form = form_of(request)
            if not form.table:
                raise
            # `kubectl get KIND NAME`: the row says Unknown, the Warning why.
            inputs = await in_thread(ctx.table_inputs, info.kind)
            rows_doc = table(info.kind, [], inputs, str(exc.revision), include_object(request),
                             undecodable=[exc], api_version=form.meta_api_version)
            return encoded(form, rows_doc, headers=warning_header([str(exc)]))
        return render(request, ctx, info, obj)
    if request.method == "DELETE":
        if sub is not None:
            raise ApiError(405, "MethodNotAllowed", "the status subresource cannot be deleted")
        return await delete(request, ctx, info, name)
    dry_run = bodies.dry_run(request)
    force = _flag(request, "force")
    # Who is asking comes first: nothing is read or decoded for an anonymous caller.
    action = Action(_verb(request.method), info.plural, name, sub, force, dry_run)
    who = await authenticate(ctx, request, action)
    # Every refusal from here on has its audit line (a media type not taken, a
    # body that does not decode, an invalid object), as the write's own have.
    with refusals_audited(ctx, who, action):
        return await _write(request, ctx, info, who, name, sub, force, dry_run)


async def _write(request: Request, ctx: ApiContext, info: ResourceInfo, who: Identity, name: str,
                 sub: str | None, force: bool, dry_run: bool) -> Response:
    """PUT or PATCH of one object (or its status), for a caller already known."""
    not_a_list(form_of(request))
    validation = field_validation(request)
    media = bodies.media_type(request)
    if media == bodies.STRATEGIC_PATCH:
        raise UnsupportedMediaType(
            "strategic merge patch is not supported for custom resources; "
            "use a merge patch (application/merge-patch+json) or server-side apply")
    if request.method == "PATCH" and media not in bodies.PATCH_TYPES:
        raise UnsupportedMediaType(f"PATCH: the media type {media!r} is not supported "
                                   f"(use one of {', '.join(bodies.PATCH_TYPES)})")
    if request.method == "PUT" and media not in bodies.OBJECT_TYPES:
        raise UnsupportedMediaType(f"PUT: the body must be application/json or application/yaml, "
                                   f"not {media!r}")
    body = await bodies.read_body(request, ctx.limits.max_body)
    # Keys given twice: refused under fieldValidation=Strict, said under Warn.
    twice: list[str] = []
    doc: Any
    if media == bodies.JSON_PATCH:
        doc = await bodies.parse_patch_operations(body)
    else:
        doc, twice = await bodies.parse_object_body(body, media, validation)
    target = Target(info.plural, name, info.kind)
    if request.method == "PUT":
        obj, warnings = bodies.to_object(doc, info.kind, target, validation)
        _same_name(obj, name)
        replaced = await replace_on_loop(ctx, who, info, obj, sub, force, dry_run)
        if replaced is None:  # not on the loop: in a worker thread
            replaced = await in_thread(replace, ctx, who, info, obj, sub, force, dry_run)
        return render(request, ctx, info, replaced, 200, twice + warnings)
    if media == bodies.APPLY_PATCH:
        configuration = ApplyConfiguration(doc, info.kind, target, validation)
        out, created = await in_thread(
            server_side_apply, ctx, who, info, configuration, sub, force, dry_run,
            request.query_params.get("fieldManager") == LAST_APPLIED_MANAGER)
        return render(request, ctx, info, out, 201 if created else 200,
                      twice + configuration.warnings)
    out, warnings = await in_thread(merge, ctx, who, info, name, doc, sub, force,
                                            validation, media, dry_run)
    return render(request, ctx, info, out, 200, twice + warnings)


def _same_name(obj: Resource, name: str) -> None:
    if obj.metadata.name != name:
        raise BadRequest(f"the name of the object ({obj.metadata.name}) does not match the name "
                         f"on the URL ({name})")


def _with_status_of(base: Resource, source: Resource) -> Resource:
    kind = strategy_of(base)
    if not kind.has_status:
        return base  # a Lease has no status
    return base.model_copy(update={"status": kind.status_of(source)})


def _verb(method: str) -> Verb:
    return "update" if method == "PUT" else "patch"


def replace(ctx: ApiContext, who: Identity, info: ResourceInfo, obj: Resource, sub: str | None,
            force: bool, dry_run: bool = False) -> Resource:
    """PUT: compare-and-swap on the body's resourceVersion. The main resource
    keeps the stored status, /status keeps everything but status."""
    action = Action("update", info.plural, obj.metadata.name, sub, force, dry_run)
    precheck(ctx, who, action)
    try:
        # A PUT names the version it replaces: the store may know it already.
        with refusals_audited(ctx, who, action, passing=(Undecodable,)):
            current = ctx.store.get_for_write(info.kind, obj.metadata.name,
                                              obj.metadata.resource_version)
    except Undecodable:
        # Nothing stored can be read to keep: the body, as its writer may write
        # it, replaces the object (hvfleet.store.undecodable.overwrite).
        # (Nothing stored to keep deletion fields from: the body's own are the current.)
        out = audited(ctx, who, action, None, lambda: _update(ctx, who, obj, obj, force, dry_run),
                      check=lambda: ctx.authorize(who, action, None, obj))
        assert out is not None
        return out
    with refusals_audited(ctx, who, action):
        new = _replacement(current, obj, sub)
    out = audited(ctx, who, action, current, lambda: _update(ctx, who, current, new, force, dry_run),
                  check=lambda: authorize_write(ctx, who, action, current, new))
    assert out is not None
    return out


def uid_mismatch(wanted: str, stored: str | None) -> Conflict:
    """kube-apiserver's UID precondition failure: a Conflict about another
    object under the name, not a stale write (no resourceVersion cause, so a
    client that retries stale writes does not retry it against that object)."""
    return Conflict(f"Precondition failed: UID in precondition: {wanted}, "
                    f"UID in object meta: {stored or ''}")


def _replacement(current: Resource, obj: Resource, sub: str | None) -> Resource:
    """What a PUT writes over `current`: the main resource keeps the stored
    status, /status keeps everything but status (at the body's version). A
    body naming another uid is about another object (one deleted and made
    again under the name): 409, as kube-apiserver's UID precondition."""
    if obj.metadata.uid and obj.metadata.uid != current.metadata.uid:
        raise uid_mismatch(obj.metadata.uid, current.metadata.uid)
    if sub is None:
        return _with_status_of(obj, current)
    new = _with_status_of(current, obj)
    return new.model_copy(update={"metadata": current.metadata.model_copy(
        update={"resource_version": obj.metadata.resource_version})})


async def replace_on_loop(ctx: ApiContext, who: Identity, info: ResourceInfo, obj: Resource,
                          sub: str | None, force: bool, dry_run: bool) -> Resource | None:
    """`replace` with no thread crossed, where the store can await its write on
    the event loop (etcd) and already holds the object at the version the PUT
    names: an agent's Lease renewal or status write names the version of its
    own last write (docs/scaling.md, "The lease fast path"). The same
    authorization, ownership rules, compare-and-swap and audit line as
    `replace`. None when it cannot be done here (not at hand, a dry run, an
    object being deleted): `replace` in a thread does it."""
    store = ctx.store
    if dry_run or not store.writes_on_loop:
        return None
    action = Action("update", info.plural, obj.metadata.name, sub, force, dry_run)
    precheck(ctx, who, action)
    try:
        current = store.at_hand(info.kind, obj.metadata.name, obj.metadata.resource_version)
    except Undecodable:
        return None
    if current is None or current.metadata.deletion_timestamp is not None:
        # (Being deleted: the write that removes the last finalizer also deletes.)
        return None
    new = lifecycle.deletion_kept(current, _replacement(current, obj, sub))
    return await audited_on_loop(
        ctx, who, action, current, lambda: store.update_on_loop(current, new, who.manager, force=force),
        check=lambda: authorize_write(ctx, who, action, current, new))


def merge(ctx: ApiContext, who: Identity, info: ResourceInfo, name: str, patch: Any,
          sub: str | None, force: bool, validation: str, media: str,
          dry_run: bool = False) -> tuple[Resource, list[str]]:
    """PATCH with a JSON merge patch (RFC 7386) or JSON patch (RFC 6902) over the
    stored object."""
    if media == bodies.JSON_PATCH:
        pinned = any(isinstance(op, dict) and op.get("path") == "/metadata/resourceVersion"
                     for op in patch)
    else:
        pinned = isinstance(patch.get("metadata"), dict) and "resourceVersion" in patch["metadata"]
    action = Action("patch", info.plural, name, sub, force, dry_run)
    precheck(ctx, who, action)
    warnings: list[str] = []

    def attempt() -> Resource:
        current = ctx.store.get(info.kind, name)
        if media == bodies.JSON_PATCH:
            doc = bodies.json_patch(current.to_dict(), patch)
            if not isinstance(doc, dict):
                raise BadRequest("json patch: the result is not an object")
        else:
            doc = bodies.merge_patch(current.to_dict(), patch)
        patched, found = bodies.to_object(doc, info.kind, Target(info.plural, name, info.kind),
                                          validation)
        warnings[:] = found
        _same_name(patched, name)
        if sub is None:
            new = _with_status_of(patched, current)
        else:
            new = _with_status_of(current, patched)
            new = new.model_copy(update={"metadata": current.metadata.model_copy(
                update={"resource_version": patched.metadata.resource_version})})

        out = audited(ctx, who, action, current, lambda: _update(ctx, who, current, new, force, dry_run),
                      check=lambda: authorize_write(ctx, who, action, current, new))
        assert out is not None
        return out

    with refusals_audited(ctx, who, action):
        out = _retrying(ctx, pinned, attempt)
    assert out is not None
    return out, warnings


class ApplyConfiguration:
    """A server-side apply body as sent: a partial document, as kube-apiserver
    takes it (an apply configuration names only the fields its manager
    manages). Over a stored object it is merged onto that object's spec (or,
    at /status, its status) before it is validated, and the fields it names
    are read from the document itself (`named_fields`); an absent object is
    created from it, whole."""

    def __init__(self, doc: dict[str, Any], kind: str, target: Target, validation: str) -> None:
        self.doc: dict[str, Any] = without_nulls(doc)
        self.kind, self.target, self.validation = kind, target, validation
        self.warnings: list[str] = []
        # Unknown fields dropped under fieldValidation Warn/Ignore: not named.
        self.dropped: list[tuple[str, ...]] = []
        meta = self.doc.get("metadata")
        self.meta: dict[str, Any] = meta if isinstance(meta, dict) else {}

    @property
    def pinned(self) -> bool:
        return self.meta.get("resourceVersion") is not None

    def decode(self, doc: dict[str, Any]) -> Resource:
        obj, self.warnings, self.dropped = bodies.to_object_dropping(doc, self.kind, self.target,
                                                                     self.validation)
        _same_name(obj, self.target.name)
        return obj

    def named(self) -> frozenset[FieldPath]:
        """The fields the configuration names (`named_fields`), but for the
        unknown ones it dropped: an apply that names a field this server does
        not know (a newer client's) applies again as it applied first."""
        named = named_fields(self.doc)
        if not self.dropped:
            return named
        return frozenset(p for p in named if not any(p[:len(d)] == d for d in self.dropped))

    def whole(self) -> Resource:
        """The configuration as a whole object (a create, a replacement)."""
        return self.decode(self.doc)

    def over(self, current: Resource, status: bool) -> Resource:
        """The configuration merged onto `current`: its spec and metadata maps
        (and a status it gives, for a kind whose apply sets one), or with
        `status`, onto its status."""
        stored = current.to_dict()
        if status:
            base = {**stored, "metadata": {**stored["metadata"], "resourceVersion": None}}
            merged = bodies.merge_patch(base, {"status": self.doc.get("status") or {},
                                               "metadata": self.meta})
            return self.decode(merged)
        base = {"apiVersion": self.doc.get("apiVersion"), "kind": self.doc.get("kind"),
                "metadata": {"name": current.metadata.name}, "spec": stored.get("spec") or {}}
        if "status" in self.doc and "status" in stored:
            base["status"] = stored["status"]
        merged = bodies.merge_patch(base, self.doc)
        return self.decode(merged)


def _listed_meta(current: Resource, manifest: Resource, new: Resource) -> Resource:
    """`new` with the finalizers and owner references `manifest` names added
    to the stored ones (sets: kept, not pruned)."""
    update: dict[str, Any] = {}
    if manifest.metadata.finalizers:
        have = list(current.metadata.finalizers or [])
        update["finalizers"] = have + [f for f in manifest.metadata.finalizers if f not in have]
    if manifest.metadata.owner_references:
        have_refs = list(current.metadata.owner_references or [])
        uids = {r.uid for r in have_refs}
        update["owner_references"] = have_refs + [r for r in manifest.metadata.owner_references
                                                  if r.uid not in uids]
    if not update:
        return new
    return new.model_copy(update={"metadata": new.metadata.model_copy(update=update)})


def server_side_apply(ctx: ApiContext, who: Identity, info: ResourceInfo,
                      configuration: ApplyConfiguration, sub: str | None, force: bool,
                      dry_run: bool = False, last_applied: bool = False) -> tuple[Resource, bool]:
    """PATCH application/apply-patch+yaml: create when absent (a Reservation is
    claimed), else merge the configuration's spec by field ownership; fields
    another manager owns conflict (409, one FieldManagerConflict cause each)
    unless forced. At /status, the status it gives is merged onto the stored
    one (fields it leaves out are kept).

    `last_applied`: `kubectl apply --server-side` of an object that carries a
    client-side apply's last-applied annotation follows its apply with a
    second one holding only that annotation, as field manager
    `kubectl-last-applied`. hvfleet records the caller's identity as manager,
    so that apply would share (and prune) the Apply entry the first one just
    wrote: it is written as what it means, an update of the fields it names,
    which removes nothing (and, as an update, is refused to a role that may
    not force if it changes another manager's field)."""
    name = configuration.target.name
    created = False
    applying = Action("patch", info.plural, name, sub, force, dry_run, apply=True)
    precheck(ctx, who, applying)

    def attempt() -> Resource:
        nonlocal created
        try:
            current = ctx.store.get(info.kind, name)
        except NotFound:
            if sub is not None:
                raise
            created = True
            manifest = configuration.whole()
            return create_object(ctx, who, info, manifest, dry_run, applied_fields(manifest))
        except Undecodable as exc:
            # The manifest replaces an object that cannot be read, at its version.
            manifest = configuration.whole()
            new_meta = manifest.metadata.model_copy(update={
                "resource_version": manifest.metadata.resource_version or str(exc.revision)})
            replacing = manifest.model_copy(update={"metadata": new_meta})
            action = Action("patch", info.plural, name, sub, force, dry_run)
            out = audited(ctx, who, action, None,
                          lambda: _update(ctx, who, replacing, replacing, force, dry_run),
                          check=lambda: ctx.authorize(who, action, None, replacing))
            assert out is not None
            return out
        applied: frozenset[FieldPath] | None = None
        manifest = configuration.over(current, status=sub is not None)
        if sub is None:
            named = configuration.named()
            spelled = {p for p in named if p[0] != "spec"} | spec_paths(manifest)
            unnamed = sorted((named - spelled) | (spec_changes(current, manifest) - named))
            if unnamed:
                # A field the document gives under another spelling (snake_case):
                # it would be dropped, or set and owned by nobody.
                raise BadRequest(f"{'.'.join(unnamed[0])}: name the field as the API spells it "
                                 "(camelCase): an apply's field set is read from the document")
            # The one apply planning (as `hvfleet apply`); status is /status's business.
            planned = plan_one(current, manifest, who.manager, prune=not last_applied, applied=named)
            new, applied = _with_status_of(planned.object, current), planned.applied
            new = _listed_meta(current, manifest, new)
            if last_applied:
                applied = None
        else:
            new = _with_status_of(current, manifest)
            if manifest.metadata.resource_version is not None:
                new = new.model_copy(update={"metadata": current.metadata.model_copy(
                    update={"resource_version": manifest.metadata.resource_version})})
        action = Action("patch", info.plural, name, sub, force, dry_run, apply=applied is not None)

        out = audited(ctx, who, action, current,
                      lambda: _update(ctx, who, current, new, force, dry_run, applied),
                      check=lambda: authorize_write(ctx, who, action, current, new))
        assert out is not None
        return out

    with refusals_audited(ctx, who, applying):
        out = _retrying(ctx, configuration.pinned, attempt)
    assert out is not None
    return out, created


@dataclass(frozen=True)
class DeleteOptions:
    """What a DELETE asks beyond the object (kube's DeleteOptions, from its
    body or the query): preconditions, a dry run, the propagation."""

    uid: str | None = None
    resource_version: str | None = None
    dry_run: bool = False
    propagation: lifecycle.Propagation | None = None


def _delete_options(body: bytes, query: Mapping[str, str]) -> DeleteOptions:
    """The DeleteOptions of a DELETE: the body's (as client-go sends them),
    else the query's propagationPolicy / orphanDependents; invalid ones are
    refused as kube-apiserver's ValidateDeleteOptions refuses them (422)."""
    doc: dict[str, Any] = {}
    if body.strip():
        doc = bodies.decode_document(body, "application/json")
    pre = doc.get("preconditions") or {}
    if not isinstance(pre, dict):
        raise BadRequest("preconditions: must be an object")
    dry = doc.get("dryRun") or []
    if not isinstance(dry, list) or any(v != "All" for v in dry):
        raise BadRequest(f'dryRun: unsupported value {json.dumps(dry)} (supported: ["All"])')
    policy = doc.get("propagationPolicy", query.get("propagationPolicy"))
    orphan = doc.get("orphanDependents", query.get("orphanDependents"))
    if policy is not None and orphan is not None:
        raise InvalidInput("orphanDependents and deletionPropagation cannot be both set",
                           field="propagationPolicy")
    if policy is not None and policy not in lifecycle.PROPAGATIONS:
        raise InvalidInput(f"Unsupported value: {json.dumps(policy)}: supported values: "
                           + ", ".join(f'"{p}"' for p in lifecycle.PROPAGATIONS), field="propagationPolicy")
    if orphan is not None:
        if orphan not in (True, False, "true", "false"):
            raise BadRequest(f"orphanDependents: must be true or false, not {json.dumps(orphan)}")
        policy = "Orphan" if orphan in (True, "true") else "Background"
    uid, rv = pre.get("uid"), pre.get("resourceVersion")
    return DeleteOptions((str(uid) if uid else None), (str(rv) if rv else None), bool(dry), policy)


async def delete(request: Request, ctx: ApiContext, info: ResourceInfo, name: str) -> Response:
    dry_run = bodies.dry_run(request)
    action = Action("delete", info.plural, name, dry_run=dry_run)
    who = await authenticate(ctx, request, action)
    with refusals_audited(ctx, who, action, passing=(Undecodable,)):  # DeleteOptions refused too
        not_a_list(form_of(request))
        body = await bodies.read_body(request, ctx.limits.max_body)
        options = (await in_thread(_delete_options, body, request.query_params)
                   if len(body) > bodies.OFF_LOOP_BYTES else _delete_options(body, request.query_params))
        uid, rv = options.uid, options.resource_version
        dry_run = dry_run or options.dry_run
        try:
            out = await in_thread(delete_object, ctx, who, info, name, uid, rv, dry_run, options.propagation)
        except Undecodable as exc:
            gone = await in_thread(delete_undecodable, ctx, who, info, exc, uid, rv, dry_run)
            return JSONResponse(success(Target(info.plural, name, info.kind), gone.uid))
    return render(request, ctx, info, out)


def delete_undecodable(ctx: ApiContext, who: Identity, info: ResourceInfo, stored: Undecodable,
                       uid: str | None, rv: str | None, dry_run: bool) -> Undecodable:
    """Delete an object that cannot be read, as its name allows the caller to
    (the role table; nothing else of it can be judged), at the version that was
    read. Answered with a Status, since there is no object to show."""
    action = Action("delete", info.plural, stored.name, dry_run=dry_run)

    def write() -> Undecodable:
        if uid is not None and uid != stored.uid:
            raise uid_mismatch(uid, stored.uid)
        version = rv or str(stored.revision)
        if version != str(stored.revision):
            raise StaleVersion(f"{info.kind} {stored.name}: resourceVersion {version} is stale "
                               f"(current is {stored.revision})")
        if not dry_run:
            ctx.store.delete(info.kind, stored.name, version)
        return stored

    return audited(ctx, who, action, None, write, check=lambda: ctx.authorize(who, action))


def delete_object(ctx: ApiContext, who: Identity, info: ResourceInfo, name: str, uid: str | None,
                  rv: str | None, dry_run: bool = False,
                  propagation: lifecycle.Propagation | None = None) -> Resource:
    """Delete with preconditions; without them, with the version that was
    authorized. A dry run answers what would be deleted. `propagation`: what
    becomes of its dependents (lifecycle.delete)."""
    action = Action("delete", info.plural, name, dry_run=dry_run)
    precheck(ctx, who, action)

    def attempt() -> Resource:
        current = ctx.store.get(info.kind, name)

        def write() -> Resource:
            if uid is not None and uid != current.metadata.uid:
                raise uid_mismatch(uid, current.metadata.uid)
            # With finalizers, only marked (deletionTimestamp) until they are removed.
            return lifecycle.delete(ctx.store, current, who.manager, rv, dry_run=dry_run,
                                    propagation=propagation)[0]

        out = audited(ctx, who, action, current, write,
                      check=lambda: ctx.authorize(who, action, current, None))
        assert out is not None
        return out

    with refusals_audited(ctx, who, action, passing=(Undecodable,)):
        out = _retrying(ctx, rv is not None or uid is not None, attempt)
    assert out is not None
    return out


async def delete_collection(request: Request, ctx: ApiContext, info: ResourceInfo) -> Response:
    """DELETE on a collection: every object the label and field selectors match,
    authorized as deletecollection on the collection and as delete on each
    object (the store's rules and the audit log see one delete per object). As
    in Kubernetes it is not atomic: it answers the list of what it deleted."""
    q = request.query_params
    selector = label_selector(q.get("labelSelector"))
    names = parse_field_selector(q.get("fieldSelector"))
    dry_run = bodies.dry_run(request)
    # Who is asking comes first: nothing of the body is read for an anonymous caller.
    who = await authenticate(ctx, request, Action("deletecollection", info.plural, name=names.equal,
                                                  dry_run=dry_run))
    body = await bodies.read_body(request, ctx.limits.max_body)
    options = (await in_thread(_delete_options, body, q)
               if len(body) > bodies.OFF_LOOP_BYTES else _delete_options(body, q))
    dry_run = dry_run or options.dry_run
    action = Action("deletecollection", info.plural, name=names.equal, dry_run=dry_run)
    precheck(ctx, who, action)
    with refusals_audited(ctx, who, action):
        listed = await in_thread(ctx.store.list, info.kind, selector)
    deleted: list[Resource] = []
    for obj in listed.items:
        name = obj.metadata.name
        if not names.matches(name):
            continue
        try:
            deleted.append(await in_thread(delete_object, ctx, who, info, name, None, None,
                                           dry_run, options.propagation))
        except NotFound:
            continue  # deleted meanwhile: nothing left to do for it
    rv = await in_thread(ctx.store.revision)
    return list_answer(form_of(request), info, deleted, {"resourceVersion": str(rv)})
