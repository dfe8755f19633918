"""Claims: taking space on a host before the VM exists, without double-booking.

A claim is a Reservation written by `Store.claim`, which runs the capacity
check (`fit.check_claim`, the same rules `hvfleet fit` uses) against the host
and its other reservations *inside* the backend's atomic write: a SQLite
transaction today, an etcd transaction on the host's and reservations'
revisions later. There is no lock across hosts, so claims on different hosts
never wait for each other. `reserve_auto` asks the fleet index for the best
host and claims it; when another scheduler won the race it refreshes the index
from the store's watch and tries again.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, cast

from pydantic import ValidationError

from hvfleet.model.bounds import LATEST
from hvfleet.model.capacity import claim_holds, covers_consumer, held_resources, reservation_phase
from hvfleet.model.errors import Conflict, InvalidInput, NotFound, Unavailable
from hvfleet.model.hypervisor import (
    HOLDING_PHASES,
    Hypervisor,
    OvercommitPolicy,
    Reservation,
    ReservationPhase,
    ReservationSpec,
    ReservationStatus,
)
from hvfleet.model.lease import Lease, lease_live
from hvfleet.model.meta import ObjectMeta, validation_message
from hvfleet.model.placement import PlacementConsumer
from hvfleet.model.readiness import DEFAULT_STALENESS
from hvfleet.model.resources import ResourceName
from hvfleet.model.selectors import Selector
from hvfleet.scheduling.errors import ConsumerAlreadyHolds, DoesNotFit, NoHostFits
from hvfleet.scheduling.fit import Reason, Rejection, check_claim
from hvfleet.scheduling.request import Request
from hvfleet.store.base import ClaimCheck, ClaimRefused, Store, Write

if TYPE_CHECKING:
    # numpy comes with the index: only `reserve_auto` needs it, not claiming on a host.
    from hvfleet.scheduling.index import FleetIndex, Weigher

MANAGER = "hvfleet-scheduler"
HYPERVISOR_LABEL = "hvfleet.io/hypervisor"
SOURCE_LABEL = "hvfleet.io/source"
DEFAULT_TTL = timedelta(minutes=10)
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def reservation_labels(host: str, source: str) -> dict[str, str]:
    labels = {SOURCE_LABEL: source}
    if _LABEL_VALUE.match(host):
        labels[HYPERVISOR_LABEL] = host
    return labels


def new_reservation(
    host: str,
    request: Request,
    consumer: str,
    ttl: timedelta | None,
    now: datetime,
) -> Reservation:
    try:
        if ttl is not None and now + ttl >= LATEST:
            raise InvalidInput(f"ends {(now + ttl).date()}, after the end of {LATEST.year - 1} "
                               "(use 'never' for no end)", field="ttl")
        return Reservation(
            metadata=ObjectMeta(
                name=f"res-{uuid.uuid4().hex[:20]}", labels=reservation_labels(host, "hvfleet")
            ),
            spec=ReservationSpec(
                hypervisor=host,
                resources=request.total_list(),
                consumer=consumer,
                expires_at=None if ttl is None else now + ttl,
            ),
            status=ReservationStatus(phase="Active"),
        )
    except OverflowError:
        raise InvalidInput("is longer than any date", field="ttl") from None
    except ValidationError as exc:  # one line naming the field (`cpu: '0.1n' is finer than 1n`)
        raise InvalidInput(validation_message(exc, f"reservation for {consumer} on {host}")) from None
    except ValueError as exc:
        raise InvalidInput(f"reservation for {consumer} on {host}: {exc}") from None


def reserve(
    store: Store,
    host: str,
    request: Request,
    consumer: str,
    ttl: timedelta | None = DEFAULT_TTL,
    *,
    staleness: timedelta = DEFAULT_STALENESS,
    manager: str = MANAGER,
) -> Reservation:
    """Claim `request` on `host` for `consumer`, or raise DoesNotFit."""
    placement_consumer_refusal(store, consumer)
    reservation = new_reservation(host, request, consumer, ttl, datetime.now(UTC))
    # Read before the atomic write, which covers the host and its reservations:
    # a policy changed in between counts as changed just after the claim.
    policies = store.list_overcommit_policies()
    # The agent's Lease, read the same way: readiness weighs it as fit and the
    # index do (a live lease is the heartbeat; an expired one outweighs the status).
    lease = agent_lease(store, host)
    return _claim(store, reservation, manager,
                  claim_check(consumer, request, staleness, policies, lease))


def _claim(store: Store, reservation: Reservation, manager: str, check: ClaimCheck, *,
           dry_run: bool = False) -> Reservation:
    """store.claim (or its dry run); a refusal by the check a remote store's
    server ran itself is the same DoesNotFit a local check raises."""
    try:
        if dry_run:
            return store.dry_run_claim(reservation, manager, check)
        return store.claim(reservation, manager, check)
    except ClaimRefused as exc:
        rejections = [
            Rejection(cast(Reason, reason), message,
                      None if resource is None else ResourceName.parse(resource))
            for reason, message, resource in exc.rejections
        ]
        raise DoesNotFit(exc.host, rejections) from None


def claim_check(
    consumer: str,
    request: Request,
    staleness: timedelta = DEFAULT_STALENESS,
    policies: Sequence[OvercommitPolicy] = (),
    lease: Lease | None = None,
) -> ClaimCheck:
    """The check every claim runs inside the store's atomic write: the consumer
    has no other live claim on that host (`covers_consumer`: Pending, Active,
    or Confirmed while its instance is there), and `request` fits there (under the
    fleet's overcommit `policies` and with the agent's `lease`, both read
    before the write; the lease is judged at the time taken inside it). What
    must be free is what the claim will hold (`claim_holds`): where
    libvirt's allocation already counts the consumer's instance on the host
    (`counted_in_allocation`), the claim needs only what that count lacks (a changed allocation
    of a running instance is usage − old + new, as in Placement)."""

    def check(h: Hypervisor, others: list[Reservation]) -> None:
        # The time is taken inside the atomic write: what expired by now is free.
        now = datetime.now(UTC)
        # A Confirmed claim counts too: it covers the running instance, and a
        # second claim would hold its VGPU twice.
        for other in others:
            if other.spec.consumer == consumer and covers_consumer(other, h, now):
                raise ConsumerAlreadyHolds(consumer, other.name, h.name)
        live = None if lease is None else lease_live(lease, now)
        check_claim(h, others, request, now, staleness, policies, live,
                    claim_holds(consumer, request.total_list(), h))

    return check


def claim_reservation(
    store: Store,
    reservation: Reservation,
    manager: str,
    *,
    staleness: timedelta = DEFAULT_STALENESS,
    dry_run: bool = False,
) -> Reservation:
    """Claim a reservation someone wrote out whole (the API's create): the same
    atomic check as `reserve`, with the same labels and an Active phase. With
    `dry_run`, the same checks on the current state, and nothing written (the
    API's dryRun: would it fit?)."""
    placement_consumer_refusal(store, reservation.spec.consumer)
    write = claim_write(store, reservation, staleness=staleness)
    assert isinstance(write.object, Reservation) and write.check is not None
    return _claim(store, write.object, manager, write.check, dry_run=dry_run)


def placement_consumer_refusal(store: Store, consumer: str) -> None:
    """Conflict when `consumer`'s allocations are a Placement client's (it has a
    Placement consumer record, kept while it has allocations): a claim made
    beside them here would not move the consumer generation Placement's
    clients write against, so one of them, working from what it read before,
    would replace this claim without a conflict. Such a consumer's
    allocations change through the Placement API (`PUT /allocations/{uuid}`),
    as Placement's own rule for consumers has it."""
    try:
        rec = store.get("PlacementConsumer", consumer.strip().lower())
    except (NotFound, InvalidInput):
        return
    generation = rec.spec.generation if isinstance(rec, PlacementConsumer) else None
    raise Conflict(f"consumer {consumer} has allocations made through the Placement API (consumer "
                   f"generation {generation}): change them there (PUT /placement/allocations/{consumer}), "
                   "not with a claim beside them")


def claim_write(store: Store, reservation: Reservation, *,
                staleness: timedelta = DEFAULT_STALENESS) -> Write:
    """The claim `claim_reservation` makes, as one write of an atomic batch
    (`Store.write_all`, with other objects): the same labels, phase and check."""
    labels = {**reservation_labels(reservation.spec.hypervisor, reservation.spec.source),
              **reservation.metadata.labels}
    reservation = reservation.model_copy(update={
        "metadata": reservation.metadata.model_copy(update={"labels": labels}),
        "status": ReservationStatus(phase="Active"),
    })
    request = Request(dict(reservation.spec.resources))
    policies = store.list_overcommit_policies()
    lease = agent_lease(store, reservation.spec.hypervisor)
    return Write("create", reservation,
                 check=claim_check(reservation.spec.consumer, request, staleness, policies, lease))


def agent_lease(store: Store, host: str) -> Lease | None:
    """The Lease of `host`'s agent, or None where it never held one."""
    try:
        lease = store.get("Lease", host)
    except NotFound:
        return None
    return lease if isinstance(lease, Lease) else None


@dataclass
class AutoClaim:
    reservation: Reservation
    attempts: int


def reserve_auto(
    store: Store,
    request: Request,
    consumer: str,
    ttl: timedelta | None = DEFAULT_TTL,
    *,
    selector: Selector | None = None,
    weigher: Weigher = "binpack",
    index: FleetIndex | None = None,
    staleness: timedelta = DEFAULT_STALENESS,
    attempts: int = 100,
    manager: str = MANAGER,
) -> AutoClaim:
    """Claim the best host for `request`; on a lost race, refresh and retry."""
    if index is None:
        from hvfleet.scheduling.index import FleetIndex

        index = FleetIndex.from_store(store, staleness)
    failed_at: dict[str, int] = {}
    last: Exception | None = None
    for attempt in range(1, attempts + 1):
        index.refresh(store)
        result = index.fit(request, selector=selector, weigher=weigher)
        # A host that refused us at this very index revision would refuse again.
        host = next((n for n in result.names if failed_at.get(n) != index.revision), None)
        if host is None:
            detail = f" (last refusal: {last})" if last else ""
            raise NoHostFits(f"no host fits {describe(request)}{detail}")
        try:
            return AutoClaim(
                reserve(store, host, request, consumer, ttl, staleness=staleness, manager=manager),
                attempt,
            )
        except ConsumerAlreadyHolds:
            raise
        except (DoesNotFit, Unavailable, Conflict) as exc:
            last = exc
            failed_at[host] = index.revision
    raise NoHostFits(f"no claim for {describe(request)} succeeded in {attempts} attempts: {last}")


def describe(request: Request) -> str:
    parts = ", ".join(f"{r}={q}" for r, q in sorted(request.resources.items(), key=str))
    return parts if request.count == 1 else f"{request.count} × ({parts})"


def release(store: Store, name: str, manager: str = MANAGER) -> Reservation:
    """Mark a reservation Released: its space is free from this write on."""

    # A recorded Confirmed may still hold what libvirt cannot see: releasing it
    # frees that too.
    releasable = HOLDING_PHASES | {"Confirmed"}

    def mutate(obj: Reservation) -> Reservation:
        if obj.status.phase not in releasable:
            return obj
        return obj.model_copy(update={"status": obj.status.model_copy(update={"phase": "Released"})})

    current = store.get_as(Reservation, name)
    if current.status.phase not in releasable:
        return current
    return store.update_as(Reservation, name, mutate, manager)


@dataclass(frozen=True)
class ReservationView:
    reservation: Reservation
    phase: ReservationPhase


def derive_phases(
    reservations: Iterable[Reservation], hosts: Iterable[Hypervisor], now: datetime
) -> list[ReservationView]:
    by_name = {h.name: h for h in hosts}
    return [
        ReservationView(r, reservation_phase(r, by_name.get(r.spec.hypervisor), now)) for r in reservations
    ]


def gc(store: Store, now: datetime | None = None, manager: str = MANAGER) -> list[ReservationView]:
    """Delete reservations that ended (Confirmed, Released, Expired) and hold
    nothing any more; returns them. A Confirmed one whose instance runs and
    that still holds resources the agent does not discover (VGPU, VFs) is kept,
    and its phase is recorded as Confirmed, so that it ends when the instance is
    gone rather than holding everything again. Every write names the
    resourceVersion it judged, so a reservation changed in the meantime is left
    for the next run."""
    now = now or datetime.now(UTC)
    removed: list[ReservationView] = []
    hosts = {h.name: h for h in store.list_hypervisors()}
    views = derive_phases(store.list_reservations(), hosts.values(), now)
    for view in views:
        if view.phase in HOLDING_PHASES:
            continue
        r = view.reservation
        if held_resources(r, hosts.get(r.spec.hypervisor), now):
            if r.status.phase != "Confirmed":
                status = r.status.model_copy(update={"phase": "Confirmed"})
                with contextlib.suppress(Conflict, NotFound):
                    store.update(r.model_copy(update={"status": status}), manager)
            continue
        try:
            store.delete("Reservation", view.reservation.name, view.reservation.metadata.resource_version)
        except (Conflict, NotFound):
            continue
        removed.append(view)
    return removed
