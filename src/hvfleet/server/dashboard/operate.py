"""The dashboard's writes: overcommit set/unset, maintenance, reserve — each
the same operation as the CLI's (`hvfleet.ops.spec.edit_spec`, an apply with the
caller as field manager, `scheduling.claims.reserve`), authorized by
the server's Authorizer before anything is read and again on the object to be
written, and audited. Form input is checked first, every field of it, so bad
values are one `FormError` naming each bad form field with its message (all
of them, not only the first) and nothing is written.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TypeVar

from hvfleet.model.durations import parse_expiry
from hvfleet.model.errors import HvfleetError, InvalidInput
from hvfleet.model.hypervisor import Hypervisor, Reservation, check_ratio
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import ResourceName
from hvfleet.model.spec_edits import HostEdit, SpecEdit
from hvfleet.ops.claims import ClaimQuery, claim
from hvfleet.ops.spec import SpecEditRequest, edit_spec, maintenance_edit
from hvfleet.server.context import ApiContext
from hvfleet.server.guard import audited, precheck
from hvfleet.server.identity import Action, Identity

T = TypeVar("T")


class FormError(InvalidInput):
    """Bad input in form fields: `errors` maps each bad field (the form's input
    name) to its message; `field` and `detail` are the first of them."""

    def __init__(self, field: str, message: str, errors: dict[str, str] | None = None) -> None:
        super().__init__(message, field=field)
        self.detail = message
        self.errors = errors or {field: message}


class _Checks:
    """Collects every field's error, so the form shows all of them at once."""

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}

    def run(self, parse: Callable[[], T]) -> T | None:
        try:
            return parse()
        except FormError as exc:
            for k, v in exc.errors.items():
                self.errors.setdefault(k, v)
            return None

    def done(self) -> None:
        if self.errors:
            field, message = next(iter(self.errors.items()))
            raise FormError(field, message, dict(self.errors))


def _field(name: str, parse: Callable[[], object]) -> object:
    try:
        return parse()
    except (InvalidInput, ValueError) as exc:
        raise FormError(name, getattr(exc, "detail", None) or str(exc)) from None


def resource_field(text: str, field: str) -> ResourceName:
    if not text.strip():
        raise FormError(field, "required: a resource name such as cpu, memory or VGPU")
    out = _field(field, lambda: ResourceName.parse(text.strip(), where=field))
    assert isinstance(out, ResourceName)
    return out


def ratio_field(text: str, field: str, resource: str) -> float:
    try:
        number = float(text)
    except ValueError:
        raise FormError(field, f"{text!r} is not a number (a ratio such as 4 or 1.5)") from None
    try:
        return check_ratio(resource, number)
    except ValueError as exc:
        raise FormError(field, str(exc)) from None


def quantity_field(text: str, field: str, *, required: bool = False) -> Quantity | None:
    if not text.strip():
        if required:
            raise FormError(field, "required")
        return None
    q = _field(field, lambda: Quantity.parse(text.strip(), where=field))
    assert isinstance(q, Quantity)
    if q <= 0:
        raise FormError(field, f"{text.strip()} must be greater than 0")
    return q


def _quantity_check(text: str, field: str) -> Callable[[], Quantity | None]:
    return lambda: quantity_field(text, field)


def consumer_field(text: str, field: str) -> str:
    """The instance a reservation is for: a UUID, as Placement requires of a
    consumer (any spelling uuid.UUID reads; kept in its canonical form)."""
    if not text.strip():
        raise FormError(field, "required: the UUID of the instance the space is for")
    try:
        return str(uuid.UUID(text.strip()))
    except ValueError:
        raise FormError(field, f"{text.strip()!r} is not a UUID (e.g. 0b7e6f7e-5b1c-4f4e-9d7a-3f1f2f0e8a11):"
                               " a consumer is an instance's UUID, as in Placement") from None


def _edit(ctx: ApiContext, who: Identity, name: str, force: bool, edit: HostEdit) -> Hypervisor:
    action = Action("patch", "hypervisors", name=name, force=force, apply=True)
    precheck(ctx, who, action)

    def write() -> Hypervisor:
        # The CLI's path (hvfleet.ops.spec): an apply of what the form changes, so a
        # field another manager owns is shown as a conflict (force takes it).
        answer = edit_spec(ctx.store, SpecEditRequest(edit, name=name, force=force), who.manager,
                           check=lambda h, new: ctx.authorize(who, action, h, new))
        return answer.hosts[0]

    out = audited(ctx, who, action, None, write)
    assert isinstance(out, Hypervisor)
    return out


def set_overcommit(ctx: ApiContext, who: Identity, name: str, resource: str, ratio: str,
                   force: bool = False) -> Hypervisor:
    checks = _Checks()
    r = checks.run(lambda: resource_field(resource, "resource"))
    value = checks.run(lambda: ratio_field(ratio, "ratio", str(r) if r is not None else "cpu"))
    checks.done()
    assert r is not None and value is not None
    return _edit(ctx, who, name, force, SpecEdit("overcommit", changes={r: value}))


def unset_overcommit(ctx: ApiContext, who: Identity, name: str, resource: str,
                     force: bool = False) -> Hypervisor:
    r = resource_field(resource, "resource")
    return _edit(ctx, who, name, force, SpecEdit("overcommit", removals=[r]))


def set_maintenance(ctx: ApiContext, who: Identity, name: str, mode: str, reason: str,
                    force: bool = False) -> Hypervisor:
    check_maintenance(mode, reason)
    try:
        edit = maintenance_edit(mode, reason)
    except InvalidInput as exc:
        raise FormError(exc.field or "mode", exc.detail) from None
    return _edit(ctx, who, name, force, edit)


def check_maintenance(mode: str, reason: str) -> None:
    """FormError naming every bad field of the maintenance form."""
    errors = {}
    if mode not in ("", "manual", "drain"):
        errors["mode"] = f"{mode!r} is not one of: none, manual, drain"
    if mode == "manual" and not reason.strip():
        errors["reason"] = "required when maintenance is manual: say why"
    if errors:
        field, message = next(iter(errors.items()))
        raise FormError(field, message, errors)


def reserve_on(ctx: ApiContext, who: Identity, name: str, cpu: str, memory: str, consumer: str,
               ttl: str) -> Reservation:
    wanted: dict[str, str] = {}
    checks = _Checks()
    for key, text in (("cpu", cpu), ("memory", memory)):
        if checks.run(_quantity_check(text, key)) is not None:
            wanted[key] = text.strip()
    if not wanted and not checks.errors:
        checks.errors["cpu"] = "give cpu or memory (or both)"
    instance = checks.run(lambda: consumer_field(consumer, "consumer"))
    checks.run(lambda: _field("ttl", lambda: parse_expiry(ttl.strip() or "10m", field="ttl")))
    checks.done()
    # The CLI's `reserve HOST` (hvfleet.ops.claims), from the form's fields.
    query = ClaimQuery.from_plain({"host": name, **wanted, "consumer": str(instance),
                                   "ttl": ttl.strip() or "10m"})
    action = Action("create", "reservations")
    precheck(ctx, who, action)

    def write() -> Reservation:
        ctx.authorize(who, action)
        return claim(ctx.store, query, who.manager, ctx.limits.claim_staleness).reservation

    out = audited(ctx, who, action, None, write)
    assert isinstance(out, Reservation)
    return out


def allowed(ctx: ApiContext, who: Identity, action: Action) -> bool:
    """Whether the page should offer `action` to `who` (the server decides again)."""
    try:
        ctx.authorize(who, action)
    except HvfleetError:
        return False
    return True
