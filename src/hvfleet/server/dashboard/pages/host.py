"""A host's page (`/hosts/NAME`): its live part (readiness, bars, the
`describe` tables, spec owners, NUMA cells, instances, reservations,
conditions, recent changes, history; also served alone as `?part=live` for
host.js), and the operator's actions posted to `/hosts/NAME/actions`
(`operate`), each shown only to callers the Authorizer would allow."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from hvfleet import views
from hvfleet.model import capacity as cap
from hvfleet.model.errors import Forbidden, HvfleetError, InvalidInput, NotFound
from hvfleet.model.hypervisor import Hypervisor, Reservation
from hvfleet.server.context import ApiContext
from hvfleet.server.dashboard import history, operate
from hvfleet.server.dashboard.html import render
from hvfleet.server.dashboard.live import FleetState
from hvfleet.server.dashboard.pages.common import (
    csrf_of,
    ctx_of,
    error_page,
    html,
    read_form,
    signed_in,
    state_of,
)
from hvfleet.server.dashboard.pages.history import history_html
from hvfleet.server.dashboard.session import check_csrf, clear_flash, read_flash, set_flash
from hvfleet.server.identity import Action, Identity
from hvfleet.store.base import OwnershipConflict
from hvfleet.store.ownership import leaves


def _when(ts: datetime | None) -> str:
    return ts.isoformat(timespec="seconds") if ts else "-"


def _spec_rows(h: Hypervisor, owners: dict[str, str]) -> list[list[str]]:
    spec = h.to_dict().get("spec", {})
    rows = []
    for path, value in sorted(leaves(spec, ("spec",)).items()):
        key = ".".join(path)
        owner = owners.get(key) or next((m for p, m in owners.items() if key.startswith(p + ".")), "-")
        rows.append([key, json.dumps(value) if not isinstance(value, str) else value, owner])
    return rows


def _cell_bars(h: Hypervisor, policies: list[Any]) -> list[dict[str, Any]]:
    out = []
    for c in h.status.cells:
        eff = cap.cell_effective_capacity(c, h.status.capacity, h, policies)
        for r in sorted(c.capacity, key=str):
            used = c.allocation.get(r)
            e = eff.get(r)
            share = (float(used.value) / float(e.value)) if used is not None and e else 0.0
            out.append({"label": f"cell {c.id} {r}", "used": views.human(r, used),
                        "effective": views.human(r, e), "share": min(share, 1)})
    return out


def host_live_html(state: FleetState, ctx: ApiContext, name: str) -> str:
    """The parts of a host's page that follow the watch."""
    with state.lock:
        h = state.hosts.get(name)
        row = state.rows.get(name)
        mine = [r for r in state.reservations.values() if r.spec.hypervisor == name]
        recent = list(state.recent.get(name, ()))
        policies = state.policy_list()
    if h is None or row is None:
        raise NotFound(f"hypervisor {name!r} not found")
    now = datetime.now(UTC)
    doc = state.current([row])[0].doc
    has_spec = bool(h.spec.model_dump(exclude_defaults=True))
    return render(
        "host_live.html",
        rd=doc["readiness"], synced=doc["synced"], resources=doc["resources"],
        capacity={"headers": [c.name for c in views.capacity_detail_columns()],
                  "rows": views.capacity_detail_rows(h, mine, now, policies)},
        spec_rows=_spec_rows(h, state.owners_of(name)) if has_spec else [],
        cells={"headers": [c.name for c in views.cell_columns()], "rows": views.cell_rows(h, policies)}
        if h.status.cells else None,
        cell_bars=_cell_bars(h, policies),
        instances=[[i.name, i.uuid, i.state, ", ".join(f"{k}={views.human(k, v)}"
                                                      for k, v in sorted(i.resources.items()))]
                   for i in h.status.instances],
        reservations={"headers": [c.name for c in views.reservation_columns(True)],
                      "rows": [views.reservation_row(r, h, now, True)
                               for r in sorted(mine, key=lambda r: r.name)]},
        conditions=[[c.type, c.status, c.reason, c.message, _when(c.last_transition_time)]
                    for c in h.status.conditions],
        heartbeat=_when(h.status.last_heartbeat_time),
        recent=[[c.at, c.type, f"{c.kind}/{c.name}", c.resource_version, c.manager, ", ".join(c.fields)]
                for c in recent],
    )


def _host_page(request: Request, who: Identity, name: str, notice: str = "",
               errors: dict[str, str] | None = None, values: dict[str, str] | None = None,
               form: str = "", conflict: dict[str, Any] | None = None, failure: str = "",
               confirm: dict[str, str] | None = None) -> str:
    ctx, state = ctx_of(request), state_of(request)
    state.fresh()
    live = host_live_html(state, ctx, name)
    with state.lock:
        h = state.hosts[name]
    labels = ", ".join(f"{k}={v}" for k, v in sorted(h.metadata.labels.items())) or "none"
    # Only what the server's Authorizer would allow this caller is offered.
    may = {"edit": operate.allowed(ctx, who, Action("patch", "hypervisors", name=name)),
           "force": operate.allowed(ctx, who, Action("patch", "hypervisors", name=name, force=True,
                                                      apply=True)),
           "reserve": operate.allowed(ctx, who, Action("create", "reservations"))}
    instances = [f"{i.name} ({i.state})" for i in h.status.instances]
    charts = history_html(request, history.host_series(name), f"Hypervisor {name}",
                          request.query_params.get("range", "hour"), f"/hosts/{quote(name)}")
    return render("host.html", title=f"Hypervisor {name}", who=who, csrf=csrf_of(request),
                  scripts=["host.js", "history.js"], current="", history=Markup(charts),
                  name=name, labels=labels, notice=notice,
                  actions=may, errors=errors or {}, values=values or {}, form=form,
                  maintenance=h.spec.maintenance, maintenance_reason=h.spec.maintenance_reason,
                  conflict=conflict, failure=failure, confirm=confirm, instances=instances,
                  live=Markup(live))  # rendered (escaped) above


@signed_in
async def host(request: Request, who: Identity) -> Response:
    name = request.path_params["name"]
    try:
        await run_in_threadpool(ctx_of(request).authorize, who, Action("get", "hypervisors", name=name))
        if request.query_params.get("part") == "live":
            return html(await run_in_threadpool(host_live_html, state_of(request), ctx_of(request), name))
        q = request.query_params
        flash = read_flash(request) or {}
        # Only a notice the server made, carried signed (a `?notice=` in a link
        # anyone can write once showed any text as this server's own words).
        notice = str(flash.get("notice") or "")
        values: dict[str, str] = flash.get("values") or {}
        if q.get("resume") == "1":  # a form sent after its session ended, back after the login
            values = {k: v for k, v in q.items() if k not in ("resume", "range", "notice")}
            notice = ("Your session had ended before this form was saved: nothing was written. "
                      "Check it and send it again.")
        page = await run_in_threadpool(
            _host_page, request, who, name, notice, flash.get("errors"), values,
            values.get("action", ""), flash.get("conflict"), flash.get("failure", ""), flash.get("confirm"))
        response = html(page)
        clear_flash(response, request, _path(name))
        return response
    except HvfleetError as exc:
        return error_page(who, request, exc)


_VALUE_MAX = 512


def _path(name: str) -> str:
    return f"/hosts/{quote(name, safe='')}"


def _conflict(form: dict[str, str], exc: OwnershipConflict) -> dict[str, Any]:
    """What the conflict section shows: who owns what, and the same form again
    (to send with force)."""
    return {"owners": ", ".join(f"{f} is owned by {m}" for f, m in exc.conflicts) or str(exc),
            "hidden": [(k, v) for k, v in form.items() if k not in ("csrf", "force")]}


def _run_action(ctx: ApiContext, who: Identity, name: str, form: dict[str, str]) -> str:
    kind = form.get("action", "")
    force = form.get("force") == "true"
    if kind == "overcommit-set":
        h = operate.set_overcommit(ctx, who, name, form.get("resource", ""), form.get("ratio", ""), force)
        return f"overcommit {form.get('resource', '').strip()} set to {form.get('ratio', '').strip()} " \
               f"(generation {h.metadata.generation})"
    if kind == "overcommit-unset":
        h = operate.unset_overcommit(ctx, who, name, form.get("resource", ""), force)
        return f"overcommit {form.get('resource', '').strip()} unset (generation {h.metadata.generation})"
    if kind == "maintenance":
        h = operate.set_maintenance(ctx, who, name, form.get("mode", ""), form.get("reason", ""), force)
        return f"maintenance: {h.spec.maintenance or 'none'} (generation {h.metadata.generation})"
    if kind == "reserve":
        r: Reservation = operate.reserve_on(ctx, who, name, form.get("cpu", ""), form.get("memory", ""),
                                            form.get("consumer", ""), form.get("ttl", ""))
        return f"reservation {r.name} is {r.status.phase}"
    raise InvalidInput(f"unknown action {kind!r}", field="action")


@signed_in
async def host_action(request: Request, who: Identity) -> Response:
    name = request.path_params["name"]
    ctx, state = ctx_of(request), state_of(request)
    try:
        form = await read_form(request)
        check_csrf(request, form)
    except HvfleetError as exc:
        return error_page(who, request, exc)
    kind = form.get("action", "")
    # What the form sent, to fill it in again (cut so the flash cookie stays under 4 KiB).
    values = {k: v[:_VALUE_MAX] for k, v in form.items() if k not in ("csrf", "force", "confirm")}

    def back(outcome: dict[str, Any]) -> Response:
        # Post/redirect/get: the outcome goes to the page in a signed cookie, so
        # a reload shows it again and sends nothing.
        response = RedirectResponse(_path(name), status_code=303)
        set_flash(response, request, _path(name), {"values": values, **outcome})
        return response

    if kind == "maintenance" and form.get("confirm") != "yes":
        try:
            operate.check_maintenance(form.get("mode", ""), form.get("reason", ""))
        except operate.FormError as exc:
            return back({"errors": exc.errors})
        with state.lock:
            current = state.hosts.get(name)
        if form.get("mode") in ("manual", "drain") and current is not None and \
                current.spec.maintenance != form.get("mode"):
            return back({"confirm": values})  # says which host and which instances, then sends again
    try:
        notice = await run_in_threadpool(_run_action, ctx, who, name, form)
    except operate.FormError as exc:
        return back({"errors": exc.errors})
    except OwnershipConflict as exc:
        return back({"conflict": _conflict(form, exc)})
    except Forbidden as exc:
        return error_page(who, request, exc)
    except InvalidInput as exc:  # refused by the core after the form checks (e.g. the spec's rules)
        field_name = {"overcommit-set": "ratio", "overcommit-unset": "resource", "maintenance": "reason",
                      "reserve": "cpu"}.get(kind, "action")
        return back({"errors": {field_name: str(exc)}})
    except HvfleetError as exc:  # does not fit, not found, ...
        return back({"failure": str(exc)})
    # Show the new state now, not a watch event later.
    await asyncio.sleep(0)
    state.fresh()
    response = RedirectResponse(_path(name), status_code=303)
    set_flash(response, request, _path(name), {"notice": notice})
    return response
