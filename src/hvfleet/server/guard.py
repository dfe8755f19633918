"""The server's one guard: who is asking, whether they may, the audit line of
every write, and the answer to every error, for every route of the
Kubernetes-shaped API (resources, actions, batch, tokens, reviews,
discovery, /metrics).

Handlers raise; they never build an error answer. `install(app)` registers
the guard once, as the app's middleware (and its handlers of the router's 404
and 405): an error class becomes a meta/v1 Status through the server's one table
(`hvfleet.server.errors.http_status_of`, via `status.from_error`), with the
request's resource and name in its details and kubectl-shaped messages. What a
request is about comes from its path (`{plural}`, `{name}`), or from the
handler when it knows better (`about`: a create names its object in the body,
an action its verb). An exception no table knows is logged and answered
500 InternalError; the connection stays open. The Placement API
(`/placement`) answers in its own format through its own wrapper
(`placement.edge.endpoint`), and the dashboard's pages answer a refusal with
an HTML page (`dashboard.pages.common.error_page`).

- `authenticate`: the caller (token, or whom an admin impersonates); a write
  refused here is audited.
- `precheck`: the authorization asked before anything is read, audited when
  refused.
- `audited`: authorize and run one write, and record it in the audit log
  whatever its result (one line per write, with the code it was answered).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hvfleet.model.errors import Forbidden, Gone, HvfleetError
from hvfleet.model.hypervisor import Resource
from hvfleet.model.meta import API_GROUP
from hvfleet.server.auth import authenticate_request
from hvfleet.server.connection import UNFRAMED
from hvfleet.server.context import ApiContext
from hvfleet.server.discovery import RESOURCES
from hvfleet.server.identity import Action, Identity
from hvfleet.server.impersonation import acting_identity
from hvfleet.server.status import ApiError, Target, from_error

log = logging.getLogger("hvfleet.server")
T = TypeVar("T")


# -- what a request is about, and the answer to its error -------------------------------------

def target_of(request: Request) -> Target:
    """What the request's path names: `{plural}` and `{name}`."""
    plural = request.path_params.get("plural", "")
    info = RESOURCES.get(plural)
    return Target(plural=plural, name=request.path_params.get("name", ""),
                  kind=info.kind if info else "")


def about(request: Request, target: Target) -> None:
    """Say what the request is about when its path does not (an action's verb,
    a create's object named in its body): the guard's Status names it."""
    request.state.about = target


def code_of(exc: Exception) -> tuple[int, str]:
    """(HTTP status, Status reason) an error is answered with: what the audit records."""
    body = from_error(exc, Target())
    return body["code"], body["reason"]


def answer(request: Request, exc: Exception) -> JSONResponse:
    """The Status for an error a handler raised, about what the request is about."""
    target: Target = getattr(request.state, "about", None) or target_of(request)
    if not isinstance(exc, (HvfleetError, ApiError)):
        log.error("unexpected error serving %s %s", request.method, request.url.path, exc_info=exc)
    elif isinstance(exc, Gone):
        # The Status says only "too old" (status.TOO_OLD); the store's detail stays here.
        log.info("%s %s: %s", request.method, request.url.path, exc)
    body = from_error(exc, target)
    url = _store_url(request)
    if url and url in body["message"]:
        # The store's address (etcd's endpoints and key prefix, SQLite's path) is
        # the server's business, not any caller's: the log keeps it.
        log.info("%s %s: %s", request.method, request.url.path, exc)
        body["message"] = body["message"].replace(f"store {url}", "the store").replace(url, "the store")
    return JSONResponse(body, status_code=body["code"])


def _store_url(request: Request) -> str | None:
    ctx = getattr(request.app.state, "ctx", None)
    url = getattr(getattr(ctx, "store", None), "url", None)
    return url if isinstance(url, str) and url else None


def _status(exc: Exception, target: Target) -> JSONResponse:
    body = from_error(exc, target)
    return JSONResponse(body, status_code=body["code"])


# The router's own refusals are about no resource: no path matched, or not with that method.
async def _not_found(request: Request, exc: Exception) -> Response:
    return _status(ApiError(404, "NotFound", "the server could not find the requested resource"), Target())


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return _status(ApiError(405, "MethodNotAllowed",
                            f"the server does not allow this method ({request.method}) here"), Target())


def _placement(path: str) -> bool:
    """Whether `path` is under the Placement API's mount (server.placement.mount)."""
    return path == "/placement" or path.startswith("/placement/")


class Guard:
    """The middleware: any exception a route raises before its answer has
    started is answered with its Status. (Raised later, in a streamed answer
    such as a watch, it can only end the stream: it goes on to the server.)"""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if UNFRAMED in scope.get("extensions", ()) and not _placement(scope["path"]):
            # Its body's framing is unknown: no handler runs for it. (Placement's
            # edge answers its own with Placement's 400, as Placement does.)
            bad = ApiError(400, "BadRequest", "the request's Content-Length is not a number")
            await _status(bad, Target())(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            if started:
                raise
            await answer(Request(scope), exc)(scope, receive, send)


def install(app: Starlette) -> None:
    """Put the guard on `app`, once for every route, and answer the router's
    own 404 and 405 as Statuses too."""
    app.add_middleware(Guard)
    app.add_exception_handler(404, _not_found)
    app.add_exception_handler(405, _not_allowed)


# -- authentication, authorization, audit -----------------------------------------------------

async def authenticate(ctx: ApiContext, request: Request, write: Action | None = None) -> Identity:
    """The caller, as its token says or as whom it impersonates (admins only,
    hvfleet.server.impersonation). A write refused here (401, or 403 for an
    impersonation) is audited too, with no identity."""
    try:
        who = await authenticate_request(ctx.authenticator, request.headers.get("authorization"))
        return acting_identity(who, request)
    except Exception as exc:
        if write is not None and ctx.audit is not None:
            code, reason = code_of(exc)
            ctx.audit.record(None, write, before=None, after=None, code=code, reason=reason)
        raise


def precheck(ctx: ApiContext, who: Identity, action: Action, before: str | None = None,
             current: Resource | None = None, new: Resource | None = None) -> None:
    """Ask before reading what the write is about: a caller who may not write
    gets 403 without learning whether the object exists (the full check, with
    the stored and the new object, follows before the write). With `current`
    and `new`, that full check itself (a batch authorizes every write before
    any is made). A refusal is audited, at version `before`."""
    try:
        ctx.authorize(who, action, current, new)
    except Exception as exc:
        if ctx.audit is not None:
            code, reason = code_of(exc)
            ctx.audit.record(who, action, before=before, after=None, code=code, reason=reason)
        _mark_audited(exc)
        raise


# Set on an exception whose refusal has its audit line, so a scope around the
# whole request (`refusals_audited`) does not write a second one.
_AUDITED = "_hvfleet_audited"


def _mark_audited(exc: Exception) -> None:
    with contextlib.suppress(AttributeError, TypeError):
        setattr(exc, _AUDITED, True)


@contextlib.contextmanager
def refusals_audited(ctx: ApiContext, who: Identity, action: Action,
                     passing: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """Around a write request after its precheck: a refusal met before the
    write itself (the object not found, the store down, a patch that does
    not apply, a result that is not valid) has its audit line too, as the
    write's own refusal has (`audited`): one line per write request, allowed
    or refused, as kube-apiserver audits every request. `passing`: what the
    caller goes on from (an object that does not decode, then replaced or
    deleted as such, audited by that write), not a refusal."""
    with _refusal_audited(ctx, who, action, None, passing):
        yield


def audited(ctx: ApiContext, who: Identity, action: Action, before: Resource | None,
            write: Callable[[], T], *, check: Callable[[], None] | None = None) -> T:
    """Authorize (`check`, if given) and run one write, and record it in the
    audit log whatever its result. When the authorization is separate from the
    write, a refusal by the store's own rules (only agent/<name> writes that
    host's status, agents never write spec) is worded as kube-apiserver words
    a refusal, with the store's reason after it."""
    with _refusal_audited(ctx, who, action, before):
        if check is not None:
            check()
        with _store_refusal_worded(action, check is not None):
            out = write()
    _audit_success(ctx, who, action, before, out)
    return out


async def audited_on_loop(ctx: ApiContext, who: Identity, action: Action, before: Resource | None,
                          write: Callable[[], Awaitable[T]], *, check: Callable[[], None]) -> T:
    """`audited` for a write awaited on the event loop (`Store.update_on_loop`):
    the same authorization, wording and audit line."""
    with _refusal_audited(ctx, who, action, before):
        check()
        with _store_refusal_worded(action, True):
            out = await write()
    _audit_success(ctx, who, action, before, out)
    return out


@contextlib.contextmanager
def _refusal_audited(ctx: ApiContext, who: Identity, action: Action, before: Resource | None,
                     passing: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    try:
        yield
    except passing:
        raise
    except Exception as exc:
        _audit_refusal(ctx, who, action, before, exc)
        raise


@contextlib.contextmanager
def _store_refusal_worded(action: Action, worded: bool) -> Iterator[None]:
    try:
        yield
    except Forbidden as exc:
        if not worded:
            raise
        target = f'{action.resource}.{API_GROUP} "{action.name}"' if action.name else action.resource
        raise Forbidden(f"{target} is forbidden: {exc}") from None


def _audit_refusal(ctx: ApiContext, who: Identity, action: Action, before: Resource | None,
                   exc: Exception) -> None:
    if getattr(exc, _AUDITED, False):
        return
    if ctx.audit is not None:
        code, reason = code_of(exc)
        rv_before = before.metadata.resource_version if before is not None else None
        ctx.audit.record(who, action, before=rv_before, after=None, code=code, reason=reason)
    _mark_audited(exc)


def _audit_success(ctx: ApiContext, who: Identity, action: Action, before: Resource | None,
                   out: object) -> None:
    if ctx.audit is not None:
        # Any object the write returns carries the version it was stored at.
        meta = getattr(out, "metadata", None)
        after = meta.resource_version if meta is not None and action.verb != "delete" else None
        code, reason = (201, "Created") if before is None and action.verb == "create" else (200, "OK")
        rv_before = before.metadata.resource_version if before is not None else None
        ctx.audit.record(who, action, before=rv_before, after=after, code=code, reason=reason)
