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
from fractions import Fraction
from typing import Any, Literal

from lxml import etree
from pydantic import Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hvfleet.discovery.xmlsafe import parse_xml
from hvfleet.guests import datacache
from hvfleet.guests.check import check_domain
from hvfleet.guests.cpu import baseline_cpu, cpu_element, qemu_models_of
from hvfleet.guests.cpuxml import cpus_from_texts
from hvfleet.guests.explain import explain as explain_plan
from hvfleet.guests.generate import generate as generate_guest
from hvfleet.guests.hosts import group_from_store
from hvfleet.guests.policy import LATEST
from hvfleet.guests.request import DiskSpec, GuestRequest, HostGroup, NicSpec, parse_memory
from hvfleet.model.errors import BadRequest, InvalidInput, UnsupportedMediaType
from hvfleet.model.hostcaps import HostCPU
from hvfleet.model.meta import API_VERSION, Model
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import MEMORY, ResourceName
from hvfleet.model.selectors import parse_selector
from hvfleet.scheduling.claims import release
from hvfleet.scheduling.index import FitResult, FleetIndex
from hvfleet.scheduling.placement import export_fleet
from hvfleet.scheduling.request import Request as FitRequest
from hvfleet.server import bodies
from hvfleet.server.context import ApiContext
from hvfleet.server.discovery import RESOURCES
from hvfleet.server.identity import Action, Identity
from hvfleet.server.resources import audited, authenticate, error_response, render
from hvfleet.server.status import Target, invalid_object, unknown_fields

# -- bodies ------------------------------------------------------------------------------------

class FitBody(Model):
    resources: dict[str, str | int]
    count: int = 1
    label_selector: str = ""
    weigher: Literal["binpack", "spread"] = "binpack"
    limit: int | None = Field(default=None, ge=1)
    why: bool = False


class PlacementBody(Model):
    label_selector: str = ""


class CpuBaselineBody(Model):
    # Either the hosts in the store matching a selector, or CPU/capabilities XML texts.
    label_selector: str | None = None
    cpus: list[str] = Field(default_factory=list)
    expand: bool = False
    # Leave out hosts whose CPU libvirt did not identify (else they are refused).
    skip_unknown: bool = False


class GuestBody(Model):
    os: str
    name: str
    vcpus: int
    memory: str
    disks: list[str] = Field(default_factory=list)
    nics: list[str] = Field(default_factory=list)
    firmware: str = "auto"
    secure_boot: bool = False
    tpm: bool = False
    mode: str = "intersection"
    policy: str = LATEST
    drivers: list[str] = Field(default_factory=list)
    label_selector: str = ""
    explain: bool = False


class GuestCheckBody(Model):
    domain: str
    label_selector: str = ""


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
    `kind` document (None: `run`'s document as it is), any error a Status."""

    async def handler(request: Request) -> Response:
        ctx: ApiContext = request.app.state.ctx
        try:
            who = await authenticate(ctx, request)
            body = await _body(request, ctx, body_model, what)
            doc = await run_in_threadpool(run, ctx, who, body)
            return JSONResponse(doc) if kind is None else _ok(kind, doc)
        except Exception as exc:
            return error_response(exc, Target(name=what))

    return handler


def _quantity(r: ResourceName, v: Fraction | Quantity) -> str:
    return str(Quantity(v, "binary" if r == MEMORY else "decimal"))


# -- fit ----------------------------------------------------------------------------------------

def fit_request(body: FitBody) -> FitRequest:
    out: dict[ResourceName, Quantity] = {}
    for name, value in body.resources.items():
        r = ResourceName.parse(name, where="resources")
        out[r] = Quantity.parse(value, where=f"resources.{r}")
    return FitRequest(out, body.count)


def fit_document(index: FleetIndex, result: FitResult, why: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "request": {"resources": {str(r): str(q) for r, q in sorted(result.request.resources.items(),
                                                                     key=str)},
                    "count": result.request.count},
        "weigher": result.weigher,
        "considered": result.considered,
        "fitting": result.fitting,
        "candidates": [
            {"name": c.name, "score": round(c.score, 6),
             "free": {str(r): _quantity(r, v) for r, v in sorted(index.free(c.name).items(), key=str)},
             "synced": index.synced(c.name).to_dict()}
            for c in result.candidates
        ],
    }
    if why:
        doc["rejected"] = {n: [r.to_dict() for r in found] for n, found in result.rejected.items()}
    return doc


def _fit(ctx: ApiContext, who: Identity, body: FitBody) -> dict[str, Any]:
    request = fit_request(body)
    selector = parse_selector(body.label_selector)
    ctx.authorize(who, Action("create", "fit"))
    with ctx.index_lock:
        index = ctx.fleet_index()
        result = index.fit(request, selector=selector, weigher=body.weigher, limit=body.limit,
                           why=body.why)
        return fit_document(index, result, body.why)


fit = _verb("fit", FitBody, _fit, "FitResult")


# -- release ------------------------------------------------------------------------------------

def _release(ctx: ApiContext, who: Identity, name: str) -> Any:
    action = Action("create", "release", name=name)

    return audited(ctx, who, action, None, lambda: release(ctx.store, name, manager=who.manager),
                   check=lambda: ctx.authorize(who, action))


async def release_reservation(request: Request) -> Response:
    ctx: ApiContext = request.app.state.ctx
    name = request.path_params["name"]
    try:
        bodies.no_dry_run(request, "release")
        who = await authenticate(ctx, request, Action("create", "release", name=name))
        await bodies.read_body(request, ctx.limits.max_body)
        out = await run_in_threadpool(_release, ctx, who, name)
        return render(request, ctx, RESOURCES["reservations"], out)
    except Exception as exc:
        return error_response(exc, Target("reservations", name, "Reservation"))


# -- placement ---------------------------------------------------------------------------------

def _placement(ctx: ApiContext, who: Identity, body: PlacementBody) -> dict[str, Any]:
    selector = parse_selector(body.label_selector)
    ctx.authorize(who, Action("create", "placement"))
    return export_fleet(ctx.store, selector)


placement = _verb("placement", PlacementBody, _placement, None)


# -- CPU baseline and guests ------------------------------------------------------------------

def _fresh_data() -> None:
    """osinfo-db and cpu_map are kept in memory; before a CPU or guest verb
    they are checked for a change (at most once a second), so an upgraded
    package is read without a restart."""
    datacache.revalidate(every=1.0)


def _group(ctx: ApiContext, selector: str) -> HostGroup:
    hvs = ctx.store.list_hypervisors(parse_selector(selector))
    if not hvs:
        raise InvalidInput(f"labelSelector {selector!r}: no hypervisor matches")
    return group_from_store([(h.metadata.name, h.status.host_capabilities) for h in hvs])


def _cpubaseline(ctx: ApiContext, who: Identity, body: CpuBaselineBody) -> dict[str, Any]:
    if bool(body.cpus) == (body.label_selector is not None):
        raise BadRequest("cpubaseline: give cpus (XML texts) or labelSelector, not both")
    ctx.authorize(who, Action("create", "cpubaseline"))
    _fresh_data()
    cpus: list[tuple[str, HostCPU]]
    qemu_models = None
    if body.cpus:
        cpus = cpus_from_texts([(f"cpus[{i}]", text) for i, text in enumerate(body.cpus)])
    else:
        assert body.label_selector is not None
        group = _group(ctx, body.label_selector)
        cpus = [(n, c.cpu) for n, c in group.hosts]
        qemu_models = qemu_models_of(group.hosts)
    # UnknownHostCPU is an InvalidInput: a 422 saying which hosts (skipUnknown leaves them out).
    d = baseline_cpu(cpus, qemu_models=qemu_models, skip_unknown=body.skip_unknown)
    c = d.value
    doc: dict[str, Any] = {"model": c.model, "vendor": c.vendor, "require": list(c.require),
                           "disable": list(c.disable), "hosts": len(cpus) - len(c.skipped),
                           "xml": etree.tostring(cpu_element(c, body.expand), pretty_print=True,
                                                 encoding="unicode")}
    if c.skipped:
        doc["skipped"] = list(c.skipped)
    if body.expand:
        doc["features"] = sorted(c.features)
    return doc


cpubaseline = _verb("cpubaseline", CpuBaselineBody, _cpubaseline, "CPUBaseline")


def _generate(ctx: ApiContext, who: Identity, body: GuestBody) -> dict[str, Any]:
    ctx.authorize(who, Action("create", "guests", name="generate"))
    _fresh_data()
    req = GuestRequest(
        os=body.os, name=body.name, vcpus=body.vcpus, memory=parse_memory(body.memory),
        disks=tuple(DiskSpec.parse(s) for s in body.disks),
        nics=tuple(NicSpec.parse(s) for s in body.nics),
        firmware=body.firmware, secure_boot=body.secure_boot, tpm=body.tpm, mode=body.mode,
        policy=body.policy, drivers=tuple(body.drivers),
    )
    xml, plan = generate_guest(req, _group(ctx, body.label_selector))
    doc: dict[str, Any] = {"xml": xml, "warnings": list(plan.warnings)}
    if body.explain:
        doc["explain"] = explain_plan(plan)
    return doc


guest_generate = _verb("guests/generate", GuestBody, _generate, "GuestDefinition")


def _check(ctx: ApiContext, who: Identity, body: GuestCheckBody) -> dict[str, Any]:
    ctx.authorize(who, Action("create", "guests", name="check"))
    _fresh_data()
    verdicts = check_domain(parse_xml(body.domain, "domain"), _group(ctx, body.label_selector))
    return {"ok": all(v.ok for v in verdicts),
            "hosts": [{"host": v.host, "ok": v.ok, "problems": list(v.problems),
                       "warnings": list(v.warnings)} for v in verdicts]}


guest_check = _verb("guests/check", GuestCheckBody, _check, "GuestCheck")
