"""The dashboard's writes: overcommit set/unset, maintenance, reserve — each
the same store operation as the CLI's and the API's (`Store.update_hypervisor`, as an apply
with the caller as field manager, `scheduling.claims.reserve`), authorized by
the server's Authorizer before anything is read and again on the object to be
written, and audited. Form input is checked first, every field of it, so bad
values are one `FormError` naming each bad form field with its message (all
of them, not only the first) and nothing is written.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TypeVar

from pydantic import ValidationError

from hvfleet.model.durations import parse_expiry
from hvfleet.model.errors import HvfleetError, InvalidInput
from hvfleet.model.hypervisor import Hypervisor, Reservation, check_ratio
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import CPU, MEMORY, ResourceName
from hvfleet.scheduling.claims import reserve
from hvfleet.scheduling.request import Request as FitRequest
from hvfleet.server.context import ApiContext
from hvfleet.server.identity import Action, Identity
from hvfleet.server.resources import audited, precheck

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


def _edit(ctx: ApiContext, who: Identity, name: str, force: bool,
          change: Callable[[Hypervisor], Hypervisor]) -> Hypervisor:
    action = Action("patch", "hypervisors", name=name, force=force, apply=True)
    precheck(ctx, who, action)

    def mutate(h: Hypervisor) -> Hypervisor:
        new = change(h)
        ctx.authorize(who, action, h, new)
        return new

    def write() -> Hypervisor:
        # An apply of what the form changes: a field another manager owns is
        # shown as a conflict (force takes it), as the CLI's edits do.
        return ctx.store.update_hypervisor(name, mutate, who.manager, force=force, as_apply=True)

    out = audited(ctx, who, action, None, write)
    assert isinstance(out, Hypervisor)
    return out


def _with_spec(h: Hypervisor, **fields: object) -> Hypervisor:
    try:
        spec = h.spec.model_validate({**h.spec.model_dump(), **fields})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidInput(str(first.get("msg", exc)).removeprefix("Value error, ")) from None
    return h.model_copy(update={"spec": spec})


def set_overcommit(ctx: ApiContext, who: Identity, name: str, resource: str, ratio: str,
                   force: bool = False) -> Hypervisor:
    checks = _Checks()
    r = checks.run(lambda: resource_field(resource, "resource"))
    value = checks.run(lambda: ratio_field(ratio, "ratio", str(r) if r is not None else "cpu"))
    checks.done()
    assert r is not None and value is not None
    return _edit(ctx, who, name, force,
                 lambda h: _with_spec(h, overcommit={**h.spec.overcommit, r: value}))


def unset_overcommit(ctx: ApiContext, who: Identity, name: str, resource: str,
                     force: bool = False) -> Hypervisor:
    r = resource_field(resource, "resource")
    return _edit(ctx, who, name, force, lambda h: _with_spec(
        h, overcommit={k: v for k, v in h.spec.overcommit.items() if k != r}))


MAINTENANCE_MODES = ("", "manual", "drain")


def set_maintenance(ctx: ApiContext, who: Identity, name: str, mode: str, reason: str,
                    force: bool = False) -> Hypervisor:
    check_maintenance(mode, reason)
    return _edit(ctx, who, name, force, lambda h: _with_spec(
        h, maintenance=mode, maintenance_reason=reason.strip() if mode else ""))


def check_maintenance(mode: str, reason: str) -> None:
    """FormError naming every bad field of the maintenance form."""
    errors = {}
    if mode not in MAINTENANCE_MODES:
        errors["mode"] = f"{mode!r} is not one of: none, manual, drain"
    if mode == "manual" and not reason.strip():
        errors["reason"] = "required when maintenance is manual: say why"
    if errors:
        field, message = next(iter(errors.items()))
        raise FormError(field, message, errors)


def reserve_on(ctx: ApiContext, who: Identity, name: str, cpu: str, memory: str, consumer: str,
               ttl: str) -> Reservation:
    wanted: dict[ResourceName, Quantity] = {}
    checks = _Checks()
    q = checks.run(lambda: quantity_field(cpu, "cpu"))
    if q is not None:
        wanted[CPU] = q
    q = checks.run(lambda: quantity_field(memory, "memory"))
    if q is not None:
        wanted[MEMORY] = q
    if not wanted and not checks.errors:
        checks.errors["cpu"] = "give cpu or memory (or both)"
    instance = checks.run(lambda: consumer_field(consumer, "consumer"))
    life = checks.run(lambda: _field("ttl", lambda: parse_expiry(ttl.strip() or "10m", field="ttl")))
    checks.done()
    action = Action("create", "reservations")
    precheck(ctx, who, action)

    def write() -> Reservation:
        ctx.authorize(who, action)
        return reserve(ctx.store, name, FitRequest(wanted), str(instance),
                       life,  # type: ignore[arg-type]
                       staleness=ctx.limits.claim_staleness, manager=who.manager)

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
