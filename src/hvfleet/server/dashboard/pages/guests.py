"""Guests (`/guests`): generate a domain XML for a group of hosts (with the
explanation of each decision and a download; the API's `guest generate`),
and check a domain XML against a group (`/guests/check`, the API's
`guest check`)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from hvfleet.discovery.xmlsafe import parse_xml
from hvfleet.guests.errors import NotEverywhere
from hvfleet.model.errors import Forbidden, HvfleetError, InvalidInput
from hvfleet.ops.guests import GuestQuery, generate, group_of
from hvfleet.ops.guests import check as check_guest
from hvfleet.server.bodies import whole_number
from hvfleet.server.context import ApiContext
from hvfleet.server.dashboard.pages.common import (
    ctx_of,
    error_page,
    field_of,
    page,
    read_form,
    selector_error,
    signed_in,
)
from hvfleet.server.dashboard.session import check_csrf
from hvfleet.server.identity import Action, Identity

_GUEST_FIELDS = {k: k for k in ("os", "name", "vcpus", "memory", "disks", "firmware")}


def _guest_body(q: dict[str, str]) -> tuple[GuestQuery | None, dict[str, str]]:
    errors: dict[str, str] = {}
    for key, label in (("os", "an osinfo short id, e.g. rhel9.1"), ("name", "a domain name"),
                       ("selector", "a label selector for the group")):
        if not q.get(key, "").strip():
            errors[key] = f"required: {label}"
    vcpus = q.get("vcpus", "").strip()
    count = whole_number(vcpus, 1)
    if count is None:
        errors["vcpus"] = f"{vcpus[:40]!r} is not a whole number of at least 1"
    if not q.get("memory", "").strip():
        errors["memory"] = "required, e.g. 4Gi"
    if errors:
        return None, errors
    disks = [d.strip() for d in q.get("disks", "").split(";") if d.strip()]
    return GuestQuery.from_plain({
        "os": q["os"].strip(), "name": q["name"].strip(), "vcpus": count, "memory": q["memory"].strip(),
        "disks": disks, "firmware": q.get("firmware", "auto"), "labelSelector": q["selector"].strip(),
        "explain": True}), {}


def _generated(ctx: ApiContext, query: GuestQuery) -> dict[str, Any]:
    """The guest generate answer's document (the caller authorized)."""
    return generate(query, group_of(ctx.store, query.label_selector)).document()


def _checked(ctx: ApiContext, domain: str, selector: str) -> dict[str, Any]:
    """The guest check answer's document (the caller authorized)."""
    return check_guest(parse_xml(domain, "domain"), group_of(ctx.store, selector)).document()


def _guests_page(request: Request, who: Any, status: int = 200, **values: Any) -> Response:
    defaults: dict[str, Any] = {"title": "Guests", "q": {}, "errors": {}, "generated": None, "link": "",
                                "check_errors": {}, "check_values": {}, "check": None, "generate_form": True}
    return page(request, "guests.html", who, status, scripts=["guests.js"], current="guests",
                **{**defaults, **values})


@signed_in
async def guests_page(request: Request, who: Identity) -> Response:
    ctx = ctx_of(request)
    q = dict(request.query_params)
    errors: dict[str, str] = {}
    generated: dict[str, str] | None = None
    link = ""
    if "go" in q:
        body, errors = _guest_body(q)
        if body is not None:
            try:  # before the selector is tried against the fleet, which tells what exists
                ctx.authorize(who, Action("create", "guests", name="generate"))
            except Forbidden as exc:
                return error_page(who, request, exc)
            wrong = await selector_error(ctx, body.label_selector, must_match=True)
            if wrong:
                errors["selector"] = wrong
                body = None
        if body is not None:
            try:
                doc = await run_in_threadpool(_generated, ctx, body)
                if q.get("download"):
                    return Response(doc["xml"], media_type="application/xml", headers={
                        "Content-Disposition": f'attachment; filename="{quote(body.name)}.xml"'})
                link = "/guests?" + urlencode({**q, "download": "1"})
                generated = {"name": body.name, "xml": doc["xml"], "explain": doc["explain"]}
            except (InvalidInput, NotEverywhere) as exc:  # shown at the form, as bad input is
                errors[field_of(exc, _GUEST_FIELDS)] = str(exc)
            except Forbidden as exc:
                return error_page(who, request, exc)
    return _guests_page(request, who, 422 if errors else 200, q=q, errors=errors, generated=generated,
                        link=link)


@signed_in
async def guest_check(request: Request, who: Identity) -> Response:
    ctx = ctx_of(request)
    try:
        form = await read_form(request)
        check_csrf(request, form)
    except HvfleetError as exc:
        return error_page(who, request, exc)
    errors: dict[str, str] = {}
    if not form.get("selector", "").strip():
        errors["selector"] = "required: a label selector for the group"
    if not form.get("domain", "").strip():
        errors["domain"] = "required: choose a file or paste the XML"
    check: dict[str, Any] | None = None
    if not errors:
        try:  # before the selector is tried against the fleet, which tells what exists
            ctx.authorize(who, Action("create", "guests", name="check"))
        except Forbidden as exc:
            return error_page(who, request, exc)
        wrong = await selector_error(ctx, form["selector"].strip(), must_match=True)
        if wrong:
            errors["selector"] = wrong
    if not errors:
        try:
            doc = await run_in_threadpool(_checked, ctx, form["domain"], form["selector"].strip())
            check = {
                "verdict": "runs on every host of the group" if doc["ok"] else "does NOT run on every host",
                "rows": [[h["host"], "ok" if h["ok"] else "does not run here",
                          "; ".join(h["problems"]) or "-", "; ".join(h["warnings"]) or "-"]
                         for h in doc["hosts"]],
            }
        except InvalidInput as exc:
            errors[field_of(exc, {"domain": "domain"})] = str(exc)
        except Forbidden as exc:
            return error_page(who, request, exc)
    return _guests_page(request, who, 422 if errors else 200, title="Guest check", generate_form=False,
                        check_errors=errors, check_values=form, check=check)
