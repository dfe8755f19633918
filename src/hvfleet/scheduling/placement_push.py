"""Pushing hvfleet's numbers to a real Placement: inventories, and claims when asked.

`placement export` says what each hypervisor's resource provider should hold;
this module makes Placement hold it. For every root provider that belongs to a
hypervisor (by uid, else by name) the inventories hvfleet computes (`total`,
`reserved`, `min_unit`, `max_unit`, `step_size`, `allocation_ratio` from the
effective overcommit) replace Placement's for those resource classes, written
with Placement's provider-generation compare-and-swap and re-read on a stale
generation, a bounded number of times. Classes hvfleet does not compute, and
classes a nested provider of that tree already has (Nova's vGPUs under the
compute node), are left as Placement has them, so nothing is counted twice.

Placement accepts an inventory or allocation of a `CUSTOM_*` class only once
the class exists (standard classes always do), so before any of that is
written every custom class the pushed inventories and claims use is ensured,
as Nova's compute service does: `PUT /resource_classes/{name}` (idempotent
from microversion 1.7), or POST with a 409 taken as existing before it.

With claims pushed, every hvfleet Reservation (source `hvfleet`) that still
holds space becomes the allocation of its consumer, written with the consumer
generation, under hvfleet's own project and user ids; an allocation under those
ids whose claim ended (released, expired, confirmed, deleted) is removed the
same way. A consumer whose allocations belong to another project (Nova took
it over) is never touched. The pure planning (`planned_inventories`,
`claim_allocations`, `plan_claims`) takes values and returns values; the
`push_*` functions do the HTTP through `PlacementClient`.
"""

from __future__ import annotations

import functools
import math
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hvfleet.model.capacity import held_resources
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hypervisor import Hypervisor, Reservation
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import ResourceName
from hvfleet.scheduling.placement_client import GenerationConflict, PlacementClient, PlacementError

# Inventory fields hvfleet computes and compares; Placement returns all six.
INVENTORY_FIELDS = ("total", "reserved", "min_unit", "max_unit", "step_size")
# A stale generation means someone else wrote between our read and write: retry
# that many times, then report the provider or consumer as failed.
MAX_ATTEMPTS = 5

Allocations = dict[str, dict[str, int]]  # provider uuid → resource class → amount


@dataclass(frozen=True)
class PushIdentity:
    """The project and user hvfleet's allocations are written under. They mark an
    allocation as hvfleet's: only those are ever changed or removed."""

    project_id: str = "hvfleet"
    user_id: str = "hvfleet"


@dataclass(frozen=True)
class ProviderTree:
    """A hypervisor's root provider and the providers nested under it."""

    host: str
    root: str
    members: tuple[str, ...]  # root first, then nested providers by name


def managed_trees(
    providers: Iterable[Mapping[str, Any]], hosts: Mapping[str, Hypervisor]
) -> dict[str, ProviderTree]:
    """host name → its provider tree, for every root provider that belongs to a
    hypervisor (matched by metadata.uid, else by name, as the mirror does)."""
    rows = list(providers)
    by_uid = {h.metadata.uid: h for h in hosts.values() if h.metadata.uid}
    out: dict[str, ProviderTree] = {}
    for rp in sorted(rows, key=lambda p: str(p["name"])):
        if (rp.get("root_provider_uuid") or rp["uuid"]) != rp["uuid"]:
            continue
        h = by_uid.get(rp["uuid"]) or hosts.get(rp["name"])
        if h is None or h.name in out:
            continue
        nested = sorted(
            (p for p in rows if p.get("root_provider_uuid") == rp["uuid"] and p["uuid"] != rp["uuid"]),
            key=lambda p: str(p["name"]),
        )
        out[h.name] = ProviderTree(h.name, rp["uuid"], (rp["uuid"], *(p["uuid"] for p in nested)))
    return out


# -- custom resource classes ---------------------------------------------------------------

CUSTOM_PREFIX = "CUSTOM_"


def custom_classes(
    computed: Mapping[str, Mapping[str, Any]], claimed: Iterable[Iterable[ResourceName]] = ()
) -> list[str]:
    """The `CUSTOM_*` classes of the computed inventories (host → class →
    inventory) and of the claimed resources, sorted: the ones Placement must
    have before it accepts either."""
    classes = {cls for inventories in computed.values() for cls in inventories}
    classes |= {r.placement.resource_class for resources in claimed for r in resources}
    return sorted(c for c in classes if c.startswith(CUSTOM_PREFIX))


@dataclass
class ResourceClassPush:
    created: list[str] = field(default_factory=list)
    existing: int = 0
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"created": self.created, "existing": self.existing}


def ensure_resource_classes(client: PlacementClient, classes: Iterable[str]) -> ResourceClassPush:
    """Create each custom class Placement does not have yet. A class that cannot
    be created is an error of its own; the inventories and claims that use it
    then fail with Placement's answer, and the rest are pushed."""
    report = ResourceClassPush()
    for cls in classes:
        try:
            created = client.ensure_resource_class(cls)
        except PlacementError as exc:
            report.errors.append(f"resource class {cls}: {exc}")
            continue
        if created:
            report.created.append(cls)
        else:
            report.existing += 1
    return report


# -- inventories -----------------------------------------------------------------------


def same_inventory(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    """Equal as Placement would apply them. The ratio is compared with a relative
    tolerance because a MySQL-backed Placement stores it as a single-precision
    float (1.1 comes back as 1.100000023841858)."""
    if current is None:
        return False
    if any(int(current.get(f, 0)) != int(desired[f]) for f in INVENTORY_FIELDS):
        return False
    return math.isclose(float(current["allocation_ratio"]), float(desired["allocation_ratio"]), rel_tol=1e-6)


def planned_inventories(
    computed: Mapping[str, Mapping[str, Any]],
    current: Mapping[str, Mapping[str, Any]],
    nested_classes: Iterable[str] = (),
) -> dict[str, dict[str, Any]] | None:
    """The whole inventory set to PUT on a root provider, or None when Placement
    already holds what hvfleet computes. Classes hvfleet does not compute, and
    those a nested provider of the tree has, stay as Placement has them."""
    below = set(nested_classes)
    desired = {cls: dict(inv) for cls, inv in computed.items() if cls not in below}
    if all(same_inventory(current.get(cls), inv) for cls, inv in desired.items()):
        return None
    out = {cls: dict(inv) for cls, inv in current.items()}
    out.update(desired)
    return out


@dataclass
class Changes:
    """What a sync or a push did to a set of named things (providers,
    consumers), in the order its report shows them."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    unchanged: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"created": self.created, "updated": self.updated, "deleted": self.deleted,
                "unchanged": self.unchanged}


def _generation_checked(report: InventoryPush | ClaimPush, what: str, attempt: int, attempts: int,
                        write: Callable[[], object]) -> bool | None:
    """One write of `what` (`provider hv1`) that names the generation it read:
    True once written; False when the generation moved (counted as a retry; re-read
    and try again); None when it failed (noted in the report, with the last of the
    `attempts` that found the generation moved)."""
    try:
        write()
    except GenerationConflict:
        report.retries += 1
        if attempt == attempts - 1:
            report.errors.append(f"{what}: generation changed on each of {attempts} attempts")
        return False
    except PlacementError as exc:
        report.errors.append(f"{what}: {exc}")
        return None
    return True


@dataclass
class InventoryPush:
    updated: list[str] = field(default_factory=list)
    unchanged: int = 0
    retries: int = 0
    missing: list[str] = field(default_factory=list)  # hypervisors with no provider
    errors: list[str] = field(default_factory=list)
    # Resource classes per provider as read or written, so the claim push does
    # not read them again.
    classes: dict[str, set[str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "updated": self.updated,
            "unchanged": self.unchanged,
            "retries": self.retries,
            "missingProviders": self.missing,
        }


def push_inventories(
    client: PlacementClient,
    trees: Mapping[str, ProviderTree],
    computed: Mapping[str, Mapping[str, Mapping[str, Any]]],
    attempts: int = MAX_ATTEMPTS,
) -> InventoryPush:
    """Write each host's computed inventories (host → class → inventory) to its
    root provider with the provider generation CAS; a stale generation is
    re-read and retried up to `attempts` times."""
    report = InventoryPush(missing=sorted(set(computed) - set(trees)))
    for host in sorted(set(computed) & set(trees)):
        tree = trees[host]
        nested: set[str] = set()
        for member in tree.members[1:]:
            report.classes[member] = set(client.inventories(member)[1])
            nested |= report.classes[member]
        for attempt in range(attempts):
            generation, current = client.inventories(tree.root)
            report.classes[tree.root] = set(current)
            plan = planned_inventories(computed[host], current, nested)
            if plan is None:
                report.unchanged += 1
                break
            write = functools.partial(client.put_inventories, tree.root, generation, plan)
            written = _generation_checked(report, f"provider {host}", attempt, attempts, write)
            if written is False:
                continue
            if written is None:
                break
            report.classes[tree.root] = set(plan)
            report.updated.append(host)
            break
    return report


# -- claims ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ConsumerState:
    """What Placement holds for one consumer."""

    allocations: Allocations
    project_id: str | None = None
    user_id: str | None = None
    generation: int | None = None

    @classmethod
    def from_placement(cls, doc: Mapping[str, Any]) -> ConsumerState:
        allocations = {
            rp: {c: int(a) for c, a in (body.get("resources") or {}).items()}
            for rp, body in (doc.get("allocations") or {}).items()
        }
        gen = doc.get("consumer_generation")
        return cls(allocations, doc.get("project_id"), doc.get("user_id"), None if gen is None else int(gen))

    def owned_by(self, identity: PushIdentity) -> bool:
        return (self.project_id, self.user_id) == (identity.project_id, identity.user_id)


def canonical_consumer(consumer: str) -> str | None:
    """The consumer id as Placement spells it (a lowercase dashed UUID), or None
    when it is not a UUID: Placement accepts only those."""
    try:
        return str(uuid.UUID(consumer))
    except ValueError:
        return None


def claim_allocations(
    resources: Mapping[ResourceName, Quantity],
    tree: ProviderTree,
    classes: Mapping[str, Iterable[str]],
) -> Allocations:
    """A claim's resources as Placement allocations in its host's tree: each class
    on the root provider when it has that inventory, else on the first nested
    provider that has it. Amounts are rounded up to Placement units, as the
    export counts usage. InvalidInput names a resource no provider has."""
    out: Allocations = {}
    for r, q in sorted(resources.items(), key=lambda kv: str(kv[0])):
        cls = r.placement.resource_class
        home = next((m for m in tree.members if cls in set(classes.get(m, ()))), None)
        if home is None:
            raise InvalidInput(f"resources.{r}: no provider of {tree.host} in Placement has {cls}")
        amount = math.ceil(q.value / r.placement.base_per_unit)
        if amount > 0:
            out.setdefault(home, {})[cls] = out.get(home, {}).get(cls, 0) + amount
    return out


@dataclass
class ClaimPlan:
    put: dict[str, Allocations] = field(default_factory=dict)
    delete: list[str] = field(default_factory=list)
    unchanged: int = 0
    foreign: list[str] = field(default_factory=list)


def plan_claims(
    desired: Mapping[str, Allocations],
    states: Mapping[str, ConsumerState],
    identity: PushIdentity,
) -> ClaimPlan:
    """What to write so Placement holds exactly hvfleet's live claims under
    `identity`: put what differs, delete what is hvfleet's and no longer
    claimed, and leave alone every consumer another project holds."""
    plan = ClaimPlan()
    for consumer, allocations in sorted(desired.items()):
        state = states.get(consumer)
        if state is not None and state.allocations and not state.owned_by(identity):
            plan.foreign.append(consumer)
        elif state is not None and state.allocations == allocations:
            plan.unchanged += 1
        else:
            plan.put[consumer] = allocations
    for consumer, state in sorted(states.items()):
        if consumer not in desired and state.allocations and state.owned_by(identity):
            plan.delete.append(consumer)
    return plan


@dataclass
class ClaimPush(Changes):
    retries: int = 0
    foreign: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "retries": self.retries, "foreign": self.foreign}


def desired_claims(
    hosts: Mapping[str, Hypervisor],
    reservations: Iterable[Reservation],
    trees: Mapping[str, ProviderTree],
    classes: Mapping[str, Iterable[str]],
    now: datetime,
) -> tuple[dict[str, Allocations], list[str]]:
    """consumer → the allocations its live hvfleet claims make (what each claim
    holds now, `held_resources`: everything before the instance runs, then the
    part the agent does not discover, such as a VGPU); plus a message per claim
    that cannot be expressed in Placement."""
    out: dict[str, Allocations] = {}
    errors: list[str] = []
    for res in sorted(reservations, key=lambda r: r.name):
        h = hosts.get(res.spec.hypervisor)
        held = held_resources(res, h, now) if res.spec.source == "hvfleet" else {}
        if not held:
            continue
        consumer = canonical_consumer(res.spec.consumer)
        tree = trees.get(res.spec.hypervisor)
        if consumer is None:
            errors.append(f"reservation {res.name}: consumer {res.spec.consumer!r} is not a UUID")
            continue
        if tree is None:
            errors.append(f"reservation {res.name}: host {res.spec.hypervisor} has no provider")
            continue
        try:
            allocations = claim_allocations(held, tree, classes)
        except InvalidInput as exc:
            errors.append(f"reservation {res.name}: {exc}")
            continue
        mine = out.setdefault(consumer, {})
        for rp, amounts in allocations.items():
            for cls, amount in amounts.items():
                mine.setdefault(rp, {})[cls] = mine.get(rp, {}).get(cls, 0) + amount
    return out, errors


class ConsumerStates:
    """GET /allocations/{consumer}, at most once per consumer per sync."""

    def __init__(self, client: PlacementClient) -> None:
        self._client = client
        self._seen: dict[str, ConsumerState] = {}

    def get(self, consumer: str, *, fresh: bool = False) -> ConsumerState:
        if fresh or consumer not in self._seen:
            self._seen[consumer] = ConsumerState.from_placement(self._client.consumer_allocations(consumer))
        return self._seen[consumer]

    def remember(self, consumer: str, state: ConsumerState) -> None:
        """What a write of ours just made Placement hold."""
        self._seen[consumer] = state

    def owned_by(self, identity: PushIdentity) -> Callable[[str], bool]:
        """A predicate: does Placement hold `consumer` under `identity`?"""
        return lambda consumer: self.get(consumer).owned_by(identity)


def push_claims(
    client: PlacementClient,
    desired: Mapping[str, Allocations],
    listed: Iterable[str],
    states: ConsumerStates,
    identity: PushIdentity,
    attempts: int = MAX_ATTEMPTS,
) -> ClaimPush:
    """Make Placement hold `desired` (consumer → allocations) under `identity`;
    `listed` are the consumers Placement shows on the managed providers, among
    which hvfleet's ended claims are found. Each write names the consumer
    generation it read; a stale one is re-read, re-planned and retried."""
    report = ClaimPush()
    consumers = sorted(set(desired) | set(listed))
    plan = plan_claims(desired, {c: states.get(c) for c in consumers}, identity)
    report.unchanged, report.foreign = plan.unchanged, list(plan.foreign)
    todo: list[str] = sorted([*plan.put, *plan.delete])
    for consumer in todo:
        for attempt in range(attempts):
            state = states.get(consumer, fresh=attempt > 0)
            one = plan_claims(
                {consumer: desired[consumer]} if consumer in desired else {}, {consumer: state}, identity
            )
            if one.foreign:
                report.foreign.append(consumer)
                break
            if one.unchanged:
                report.unchanged += 1
                break
            allocations = one.put.get(consumer, {})
            if not allocations and not one.delete:
                break  # gone meanwhile: nothing of ours left to remove
            body = {
                "allocations": {rp: {"resources": r} for rp, r in allocations.items()},
                "project_id": identity.project_id,
                "user_id": identity.user_id,
                # None creates the consumer; Placement refuses it for one that exists.
                "consumer_generation": state.generation if state.allocations else None,
            }
            write = functools.partial(client.put_allocations, consumer, body)
            written = _generation_checked(report, f"consumer {consumer}", attempt, attempts, write)
            if written is False:
                continue
            if written is None:
                break
            states.remember(consumer, ConsumerState(allocations, identity.project_id, identity.user_id))
            if not allocations:
                report.deleted.append(consumer)
            elif state.allocations:
                report.updated.append(consumer)
            else:
                report.created.append(consumer)
            break
    return report


# -- one push ---------------------------------------------------------------------------


@dataclass
class PushReport:
    inventories: InventoryPush | None
    claims: ClaimPush | None
    # Consumers the mirror must not copy back: hvfleet's own live claims, and
    # whatever Placement holds under hvfleet's identity.
    skip: Callable[[str], bool]
    # GET /resource_providers/{uuid}/allocations as read by the claim push, for
    # the mirror to reuse (it skips every consumer the push wrote).
    allocations: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The custom classes ensured before anything was pushed; None when nothing was.
    resource_classes: ResourceClassPush | None = None

    @property
    def errors(self) -> list[str]:
        return [
            *(self.resource_classes.errors if self.resource_classes else []),
            *(self.inventories.errors if self.inventories else []),
            *(self.claims.errors if self.claims else []),
        ]


def push(
    client: PlacementClient,
    hosts: Mapping[str, Hypervisor],
    reservations: Iterable[Reservation],
    computed: Mapping[str, Mapping[str, Mapping[str, Any]]],
    now: datetime,
    *,
    inventories: bool = True,
    claims: bool = False,
    identity: PushIdentity = PushIdentity(),
) -> PushReport:
    """Push `computed` inventories (host → class → inventory) and, with `claims`,
    hvfleet's live claims to the providers of `hosts`."""
    reservations = list(reservations)
    providers = client.get("/resource_providers")["resource_providers"]
    trees = managed_trees(providers, hosts)
    class_report: ResourceClassPush | None = None
    if inventories or claims:
        claimed = (
            [
                held_resources(r, hosts.get(r.spec.hypervisor), now)
                for r in reservations
                if r.spec.source == "hvfleet" and r.spec.hypervisor in trees
            ]
            if claims
            else []
        )
        pushed = {h: inv for h, inv in computed.items() if h in trees} if inventories else {}
        class_report = ensure_resource_classes(client, custom_classes(pushed, claimed))
    inventory_report = push_inventories(client, trees, computed) if inventories else None
    states = ConsumerStates(client)
    claim_report: ClaimPush | None = None
    allocations: dict[str, dict[str, Any]] = {}
    if claims:
        known = inventory_report.classes if inventory_report else {}
        members = [m for t in trees.values() for m in t.members]
        classes = {m: known[m] if m in known else set(client.inventories(m)[1]) for m in members}
        for m in members:
            allocations[m] = client.get(f"/resource_providers/{m}/allocations")["allocations"]
        listed = {c for on_provider in allocations.values() for c in on_provider}
        desired, errors = desired_claims(hosts, reservations, trees, classes, now)
        claim_report = push_claims(client, desired, listed, states, identity)
        claim_report.errors[:0] = errors
    live = {
        c
        for r in reservations
        if r.spec.source == "hvfleet"
        and held_resources(r, hosts.get(r.spec.hypervisor), now)
        and (c := canonical_consumer(r.spec.consumer)) is not None
    }
    owned = states.owned_by(identity)
    return PushReport(
        inventory_report, claim_report, lambda c: c in live or owned(c), allocations, class_report
    )
