"""The fleet's verbs as action endpoints under /apis/hvfleet.io/v1 (docs/api.md).

`POST fit`, `POST reservations/{name}/release`, `POST placement`,
`POST cpubaseline`, `POST guests/generate` and `POST guests/check` call the
same core functions as `hvfleet fit`, `release`, `placement export`,
`cpu baseline` and `guest generate|check`. Each body is a small model that
refuses unknown fields. They are served warm: the fleet index lives across
requests (caught up with the store before each fit), and osinfo-db and
libvirt's cpu_map are loaded once per process (`datasets.preload`). Each is authorized
as verb "create" on its own resource name ("fit", "release", ...).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hvfleet.discovery.xmlsafe import parse_xml
from hvfleet.model.errors import BadRequest, UnsupportedMediaType
from hvfleet.model.meta import API_VERSION, Model
from hvfleet.model.selectors import parse_selector
from hvfleet.ops.claims import release
from hvfleet.ops.fit import FitAnswer, FitQuery
from hvfleet.ops.fit import fit as run_fit
from hvfleet.ops.guests import (
    CpuBaselineQuery,
    CpuSource,
    GuestCheckQuery,
    GuestQuery,
    check,
    cpu_baseline,
    generate,
    group_of,
)
from hvfleet.ops.placement import PlacementQuery, export
from hvfleet.server import bodies
from hvfleet.server.context import ApiContext
from hvfleet.server.discovery import RESOURCES
from hvfleet.server.guard import about, audited, authenticate
from hvfleet.server.identity import Action, Identity
from hvfleet.server.resources import render
from hvfleet.server.status import Target, invalid_object, unknown_fields

# -- bodies ------------------------------------------------------------------------------------

async def _body(request: Request, ctx: ApiContext, model: type[Model], what: str) -> Any:
    media = bodies.media_type(request)
    if media not in ("application/json", "*/*"):
        raise UnsupportedMediaType(f"{what}: the body must be application/json, not {media!r}")
    raw = await bodies.read_body(request, ctx.limits.max_body)
    doc = await bodies.parse_document(raw, "application/json") if raw.strip() else {}
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        unknown = [".".join(str(p) for p in e["loc"]) for e in exc.errors() if e["type"] == "extra_forbidden"]
        if unknown:
            raise unknown_fields(unknown) from None
        raise invalid_object(exc, Target(name=what), what) from None


def _ok(kind: str, doc: dict[str, Any]) -> JSONResponse:
    return JSONResponse({"apiVersion": API_VERSION, "kind": kind, **doc})


def _verb(what: str, body_model: type[Model], run: Callable[[ApiContext, Identity, Any], dict[str, Any]],
          kind: str | None) -> Callable[[Request], Awaitable[Response]]:
    """The handler of an action: its body decoded strictly, the caller
    authenticated, `run` in the thread pool (it authorizes), the answer as a
    `kind` document (None: `run`'s document as it is); the guard answers any
    error with a Status about `what`."""

    async def handler(request: Request) -> Response:
        ctx: ApiContext = request.app.state.ctx
        about(request, Target(name=what))
        who = await authenticate(ctx, request)
        body = await _body(request, ctx, body_model, what)
        doc = await run_in_threadpool(run, ctx, who, body)
        return JSONResponse(doc) if kind is None else _ok(kind, doc)

    return handler


# -- fit ----------------------------------------------------------------------------------------

def _fit(ctx: ApiContext, who: Identity, body: FitQuery) -> dict[str, Any]:
    """The fit answer's document; the dashboard's fit page calls it too."""
    return fit_answer(ctx, who, body).document()


def fit_answer(ctx: ApiContext, who: Identity, query: FitQuery) -> FitAnswer:
    query.request()  # bad input is a 422 before authorization is asked
    query.selector()
    ctx.authorize(who, Action("create", "fit"))
    with ctx.index_lock:
        return run_fit(ctx.fleet_index(), query)


fit = _verb("fit", FitQuery, _fit, None)  # the answer is a FitResult already (FitAnswer.document)


# -- release ------------------------------------------------------------------------------------

def _release(ctx: ApiContext, who: Identity, name: str) -> Any:
    action = Action("create", "release", name=name)

    return audited(ctx, who, action, None, lambda: release(ctx.store, name, who.manager),
                   check=lambda: ctx.authorize(who, action))


async def release_reservation(request: Request) -> Response:
    ctx: ApiContext = request.app.state.ctx
    name = request.path_params["name"]
    about(request, Target("reservations", name, "Reservation"))
    bodies.no_dry_run(request, "release")
    who = await authenticate(ctx, request, Action("create", "release", name=name))
    await bodies.read_body(request, ctx.limits.max_body)
    out = await run_in_threadpool(_release, ctx, who, name)
    return render(request, ctx, RESOURCES["reservations"], out)


# -- placement ---------------------------------------------------------------------------------

def _placement(ctx: ApiContext, who: Identity, body: PlacementQuery) -> dict[str, Any]:
    parse_selector(body.label_selector)  # a bad selector is a 422 before authorization
    ctx.authorize(who, Action("create", "placement"))
    return export(ctx.store, body)


placement = _verb("placement", PlacementQuery, _placement, None)


# -- CPU baseline and guests ------------------------------------------------------------------

def _cpubaseline(ctx: ApiContext, who: Identity, body: CpuBaselineQuery) -> dict[str, Any]:
    if bool(body.cpus) == (body.label_selector is not None):
        raise BadRequest("cpubaseline: give cpus (XML texts) or labelSelector, not both")
    ctx.authorize(who, Action("create", "cpubaseline"))
    source = (CpuSource.of_texts(body.cpus) if body.label_selector is None
              else CpuSource.of_group(group_of(ctx.store, body.label_selector)))
    # UnknownHostCPU is an InvalidInput: a 422 saying which hosts (skipUnknown leaves them out).
    return cpu_baseline(source, body.expand, body.skip_unknown).document()


cpubaseline = _verb("cpubaseline", CpuBaselineQuery, _cpubaseline, "CPUBaseline")


def _generate(ctx: ApiContext, who: Identity, body: GuestQuery) -> dict[str, Any]:
    ctx.authorize(who, Action("create", "guests", name="generate"))
    return generate(body, group_of(ctx.store, body.label_selector)).document()


guest_generate = _verb("guests/generate", GuestQuery, _generate, "GuestDefinition")


def _check(ctx: ApiContext, who: Identity, body: GuestCheckQuery) -> dict[str, Any]:
    ctx.authorize(who, Action("create", "guests", name="check"))
    return check(parse_xml(body.domain, "domain"), group_of(ctx.store, body.label_selector)).document()


guest_check = _verb("guests/check", GuestCheckQuery, _check, "GuestCheck")
