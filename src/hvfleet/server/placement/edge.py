"""The HTTP edge of hvfleet's Placement API: one wrapper every handler goes
through (microversion, authentication by `X-Auth-Token`, authorization by
role, Placement's error body, `last-modified`/`cache-control` per
microversion, request ids), and the one table from core error classes to
HTTP statuses."""

from __future__ import annotations

import json
import threading
import uuid as uuidlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any, cast

from jinja2 import Environment
from starlette.requests import Request
from starlette.responses import Response

from hvfleet.model.errors import Forbidden, InvalidInput, Unauthorized
from hvfleet.placement.errors import (
    PlacementBadRequest,
    PlacementConflict,
    PlacementError,
    PlacementForbidden,
    PlacementNotFound,
)
from hvfleet.placement.records import Source
from hvfleet.placement.snapshot import ProviderSnapshot
from hvfleet.server.auth import authenticate_request
from hvfleet.server.identity import Identity
from hvfleet.server.placement import compression, policy
from hvfleet.server.placement.microversion import (
    MAX_VERSION,
    MIN_VERSION,
    NotAcceptableVersion,
    negotiate,
    version_text,
)
from hvfleet.server.threads import in_thread
from hvfleet.store.base import Store

ERROR_CODE_VERSION = (1, 23)
LAST_MODIFIED_VERSION = (1, 15)


class UnsupportedMediaType(PlacementError):
    pass


class NotAcceptable(PlacementError):
    pass


class MethodNotAllowed(PlacementError):
    def __init__(self, method: str, allowed: list[str]) -> None:
        super().__init__("The method specified is not allowed for this resource.")
        self.method = method
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
    _caught_up: bool = False  # a GET's snapshot has caught up once: it makes no write

    def snapshot(self, catch_up: bool = True) -> ProviderSnapshot:
        """The server's provider snapshot, caught up with the store unless not
        `catch_up` (a writer that only needs which uuid is which hypervisor: a
        host's uid never changes, and what the snapshot does not know yet the
        writer reads from the store). A GET catches up once (on etcd each
        catch-up asks etcd its revision); a write, before each read, as it
        reads what it wrote."""
        snap: ProviderSnapshot = self.request.app.state.ctx.placement_snapshot()
        if catch_up and not self._caught_up:
            # Over a remote store, the revision read is shared with the
            # requests asking at the same time (SharedRevision).
            snap.refresh(getattr(self.request.app.state, "placement_store", None) or self.store)
            self._caught_up = self.request.method in ("GET", "HEAD")
        return snap

    def source(self) -> Source:
        """What the core reads: the store, and the fleet as the snapshot has
        it, caught up with every write made before this request; the
        server's one allocation writer."""
        return Source(self.store, self.snapshot, self.request.app.state.ctx.placement_writer)

    @property
    def mount(self) -> str:
        """Where the Placement API is mounted on this listener: `/placement`
        on the main one, `` at the root of its own (--placement-listen); links
        and `location` start with it, as Placement builds them from SCRIPT_NAME."""
        return str(self.request.scope.get("root_path", ""))

    def at_least(self, major: int, minor: int) -> bool:
        return self.version >= (major, minor)

    def path(self, name: str) -> str:
        return str(self.request.path_params[name])

    def one(self, name: str) -> str | None:
        values = self.params.get(name)
        return values[0] if values else None


class SharedRevision:
    """The store's current revision for the Placement requests of one
    server, read once for all the requests that ask while a read is under
    way. On etcd each read is a round trip (and its CPU on the server), made
    before every GET so that it sees every write acknowledged before it, on
    any replica. Sharing keeps that: a caller takes only a read *begun after
    it asked*, whose answer is at or past every write acknowledged before
    then. A caller that finds no read under way begins its own at once (a
    lone client waits no longer than before); one that finds a read under
    way (begun before it asked: its answer may predate a write the caller
    must see) waits for the next read, begun as soon as that one ends, which
    answers every caller that asked meanwhile: under N concurrent requests
    the store sees about one read per round trip instead of N, and a request
    waits at most two round trips. kube-apiserver's consistent reads from its
    watch cache batch their progress requests to etcd alike."""

    def __init__(self, read: Callable[[], int]) -> None:
        self._read = read
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._begun = 0  # reads begun so far
        self._running = False  # the last begun is under way
        self._ended = 0  # the last read that ended (its number)
        self._outcome: int | BaseException = 0  # what it answered

    def revision(self) -> int:
        with self._changed:
            need = self._begun + 1  # the first read that begins after now
            while self._ended < need:
                if not self._running:
                    self._running = True
                    self._begun += 1
                    mine = self._begun
                    break
                self._changed.wait()
            else:
                return self._taken(self._outcome)
        outcome: int | BaseException
        try:
            outcome = self._read()
        except BaseException as exc:  # handed to every caller that waited for this read
            outcome = exc
        with self._changed:
            self._running = False
            self._ended, self._outcome = mine, outcome
            self._changed.notify_all()
        return self._taken(outcome)

    @staticmethod
    def _taken(outcome: int | BaseException) -> int:
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


class SharedRevisionStore:
    """`store` as a provider snapshot's catch-up sees it: its `revision()`
    shared (SharedRevision), everything else the store's own."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._shared = SharedRevision(store.revision)

    def revision(self) -> int:
        return self._shared.revision()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def catch_up_store(store: Store) -> Store | None:
    """What the Placement API's requests catch up with: `store` with its
    revision read shared between concurrent requests when that read is a
    round trip (etcd, a remote store); None for a store whose events are at
    hand (SQLite: a local read, and the warm path needs none, Store.change_mark)."""
    if store.events_at_hand:
        return None
    return cast(Store, SharedRevisionStore(store))


@dataclass(frozen=True)
class EncodedJSON:
    """A handler's answer already encoded, as the bytes the answer carries
    (the allocation candidates' body, kept with the provider graph: sent as
    it is, never copied or encoded again per request)."""

    body: bytes


Handler = Callable[[Call, Any], Any]


_HTML = Environment(autoescape=True).from_string(
    "<html>\n <head>\n  <title>{{ status }} {{ title }}</title>\n </head>\n <body>\n"
    "  <h1>{{ status }} {{ title }}</h1>\n  {{ explanation }}<br /><br />\n{{ detail }}\n\n"
    " </body>\n</html>")


def _wants_html(accept: str) -> bool:
    """webob renders an error as HTML for a client that asks for HTML and not JSON."""
    return "html" in accept and "json" not in accept


def _error_response(exc: PlacementError, version: tuple[int, int] | None, request_id: str,
                    headers: dict[str, str], accept: str = "") -> Response:
    status, title, explanation = next((s, t, e) for cls, s, t, e in STATUS if isinstance(exc, cls))
    if isinstance(exc, MethodNotAllowed):
        explanation = f"The method {exc.method} is not allowed for this resource."
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
    if _wants_html(accept):
        page = _HTML.render(status=status, title=title, explanation=explanation, detail=exc.detail)
        return Response(page, status_code=status, headers=out, media_type="text/html")
    return Response(json.dumps({"errors": [err]}), status_code=status, headers=out,
                    media_type="application/json")


def http_date(t: datetime) -> str:
    return format_datetime(t.astimezone(UTC).replace(microsecond=0), usegmt=True)


def endpoint(rule: str, handler: Callable[[Call, Any], Any], *,
             body: bool | Callable[[tuple[int, int]], bool] = False,
             sends_json: bool = True,
             versions: tuple[tuple[int, int], tuple[int, int] | None] = ((1, 0), None),
             masked: str = "404",
             at_once: Callable[[Call], Any] | None = None) -> Callable[[Request], Awaitable[Response]]:
    """Wrap `handler(call, body)` for policy `rule` ("open": no token needed,
    as Placement's version document). With `body` (or `body(version)` true),
    the request must be application/json and its parsed body is passed; with
    `sends_json`, the caller must accept JSON. Outside `versions` (since,
    until) the operation does not exist: 404, or 405 when `masked` says so.
    `at_once(call)`, asked after every check, on the event loop (it must
    never wait), answers in place of the handler unless it says None: a
    worker thread's hand-off costs more than a kept answer's lookup."""

    async def run(request: Request) -> Response:
        request_id = f"req-{uuidlib.uuid4()}"
        headers = {"openstack-request-id": request_id, "x-openstack-request-id": request_id,
                   "vary": "openstack-api-version"}
        version: tuple[int, int] | None = None
        try:
            version = negotiate(request.headers)
            headers["openstack-api-version"] = f"placement {version_text(version)}"
            ctx = request.app.state.ctx
            who = OPEN if rule == "open" else await _identity(ctx, request)
            clen = request.headers.get("content-length")
            try:
                if clen and int(clen) > 0 and not request.headers.get("content-type"):
                    raise PlacementBadRequest("content-type header required when content-length > 0")
            except ValueError:
                raise PlacementBadRequest("content-length header must be an integer") from None
            since, until = versions
            if version < since or (until is not None and version > until):
                if masked == "405":
                    raise MethodNotAllowed(request.method, [])
                raise PlacementNotFound("The resource could not be found.")
            accept = request.headers.get("accept", "")
            if sends_json and accept and not any(
                    a.strip().split(";")[0] in ("application/json", "*/*", "application/*")
                    for a in accept.split(",")):
                raise NotAcceptable("Only application/json is provided")
            wants_body = body(version) if callable(body) else body
            if wants_body:
                ctype = request.headers.get("content-type")
                if not ctype or ctype.split(";")[0].strip() != "application/json":
                    raise UnsupportedMediaType(
                        f"The media type {ctype.split(';')[0] if ctype else None} is not supported, "
                        "use application/json")
            params: dict[str, list[str]] = {}
            for k, v in request.query_params.multi_items():
                params.setdefault(k, []).append(v)
            call = Call(request, version, who, ctx.store, params)
            if not policy.allowed_by_role(who, rule):
                # An agent's own tree is looked up in the snapshot: off the event loop.
                await in_thread(policy.authorize, call, rule)
            data: Any = None
            if wants_body:
                raw = await request.body()
                try:
                    data = json.loads(raw)
                except ValueError as exc:
                    raise PlacementBadRequest(f"Malformed JSON: {exc}") from None
            out = at_once(call) if at_once is not None else None
            if out is None:
                out = await in_thread(handler, call, data)
        except PlacementError as exc:
            return _error_response(exc, version, request_id, headers, request.headers.get("accept", ""))
        except InvalidInput as exc:
            # A core refusal no Placement operation names (a bound of what is
            # stored): still Placement's 400 in its error body, never the
            # Kubernetes API's Status.
            return _error_response(PlacementBadRequest(str(exc)), version, request_id, headers,
                                   request.headers.get("accept", ""))
        headers.update(call.headers)
        location = headers.get("location")
        if location is not None and location.startswith("/"):
            # Absolute, as webob makes a Location header.
            headers["location"] = f"{request.url.scheme}://{request.url.netloc}{location}"
        if call.last_modified is not None and call.at_least(*LAST_MODIFIED_VERSION):
            headers["last-modified"] = http_date(call.last_modified)
            headers["cache-control"] = "no-cache"
        if out is None:
            return Response(status_code=call.status if call.status != 200 else 204, headers=headers)
        if isinstance(out, EncodedJSON) and len(out.body) >= compression.MIN_BYTES:
            headers["vary"] = "openstack-api-version, accept-encoding"
            if compression.accepts_gzip(request.headers.get("accept-encoding")):
                # Compressed once per kept body; the first time, off the event loop.
                packed = GZIP.kept(out.body) or await in_thread(GZIP.compress, out.body)
                headers["content-encoding"] = "gzip"
                return Response(packed, status_code=call.status, headers=headers,
                                media_type="application/json")
        content = out.body if isinstance(out, EncodedJSON) else json.dumps(out)
        return Response(content, status_code=call.status, headers=headers, media_type="application/json")

    return run


# The gzip bodies of the kept answers this process served last.
GZIP = compression.GzipKept()

# Who calls what needs no token (the version document).
OPEN = Identity(subject="anonymous", role="viewer")


async def _identity(ctx: Any, request: Request) -> Identity:
    """The caller, as `X-Auth-Token` (or `Authorization`) says: on the event
    loop when its token record is cached, else in a worker thread, which may
    read the store (`authenticate_request`, as the guard does)."""
    token = request.headers.get("x-auth-token")
    authorization = f"Bearer {token}" if token else request.headers.get("authorization")
    try:
        who: Identity = await authenticate_request(ctx.authenticator, authorization)
    except Unauthorized as exc:
        raise Unauthenticated(str(exc)) from None
    except Forbidden as exc:
        raise PlacementForbidden(str(exc)) from None
    return who
