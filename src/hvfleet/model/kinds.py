"""One strategy per kind: what differs between the kinds a store holds.

As Kubernetes' generic registry serves every kind through one `Store` with a
small strategy per kind (PrepareForCreate, PrepareForUpdate, Validate, which
fields a status write may touch), every hvfleet store backend, the field
ownership rules (`hvfleet.store.ownership`), the API and the CLI ask the
kind's `KindStrategy` instead of branching on the kind:
- its names (plural, short names: the CRD's, the API's paths, `kind_of`);
- whether it has a status, and who alone may write it (a Hypervisor's agent);
- the host an object belongs to (a Reservation's `spec.hypervisor`, a Lease's
  name): the per-host reservation index of the SQLite and etcd backends, a
  claim's host on the remote one, an agent's own objects;
- whether a claim checks it against its host (`claimed`), whether managedFields
  are recorded (a Lease has one writer, so not), whether agents may write spec;
- the prepare and validate hooks a write runs inside the store's atomic step;
- bounds: the kind's pydantic model (`model`), whose field types carry the
  bounds of `hvfleet.model.bounds`; `decode` is the one way to read a document.
Table columns are presentation: they are in `hvfleet.views.tables`, keyed by
the same kind names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from hvfleet.model.bounds import MAX_MANAGER
from hvfleet.model.capacity import growth_past_claim
from hvfleet.model.dashboard import HistorySeries
from hvfleet.model.errors import Forbidden, InvalidInput
from hvfleet.model.hypervisor import (
    Hypervisor,
    HypervisorSpec,
    OvercommitPolicy,
    Reservation,
    Resource,
)
from hvfleet.model.lease import Lease
from hvfleet.model.meta import validate_name
from hvfleet.model.overcommit import selects
from hvfleet.model.placement import PlacementConsumer, PlacementName, ResourceProvider
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import (
    ResourceName,
    placement_alias_error,
    placement_class_error,
    whole_units_error,
)
from hvfleet.model.token import AccessToken
from hvfleet.model.units import check_unit_annotations

AGENT_PREFIX = "agent/"
# An agent writes as agent/<host>, and a field manager is at most MAX_MANAGER
# characters: the longest name a Hypervisor an agent can report may have.
MAX_HYPERVISOR_NAME = MAX_MANAGER - len(AGENT_PREFIX)


def agent_manager(hypervisor_name: str) -> str:
    """The field manager (and token subject) of the agent of one hypervisor."""
    return f"{AGENT_PREFIX}{hypervisor_name}"


def hypervisor_name_error(name: str) -> str | None:
    """Why `name` cannot name a Hypervisor (or a host an agent or its token
    speaks for), or None: an object name whose agent's field manager fits.
    Checked where such a name is first given (a create, an agent's start, a
    token), never where one is read: a longer name stored before stays readable."""
    try:
        validate_name(name)
    except ValueError as exc:
        return str(exc)
    if len(name) > MAX_HYPERVISOR_NAME:
        return (f"{name[:24]}… ({len(name)} characters): a hypervisor's name is at most "
                f"{MAX_HYPERVISOR_NAME} characters, as its agent writes as "
                f"'{AGENT_PREFIX}<name>' (a field manager is at most {MAX_MANAGER})")
    return None


# The kind's model: every hook of a strategy takes objects of its own kind
# (the strategy is found by the object's `kind`, which its model fixes).
R = TypeVar("R", Hypervisor, Reservation, Lease, OvercommitPolicy, AccessToken,
            ResourceProvider, PlacementConsumer, PlacementName, HistorySeries)


def _no_check(*_: Any) -> None:
    return None


def _agent_writes_no_spec_on_create(obj: Hypervisor, manager: str) -> None:
    """A Hypervisor created by its agent carries no spec: spec is the operators'."""
    if manager.startswith(AGENT_PREFIX) and obj.spec != HypervisorSpec():
        raise Forbidden(f"{obj.kind} {obj.metadata.name}: agents do not write spec ({manager!r})")


def _spec_names(spec: HypervisorSpec) -> list[tuple[str, Iterable[str]]]:
    return [("spec.overcommit", spec.overcommit), ("spec.reserved", spec.reserved),
            ("spec.extraCapacity", spec.extra_capacity)]


def _no_placement_aliases(named: list[tuple[str, Iterable[str]]],
                          before: list[tuple[str, Iterable[str]]] | None = None) -> None:
    """Every resource named is one Placement can have, and not a well-known
    resource's class under its Placement name. On an update, a name the
    field held before passes both checks (`before`): a value stored before
    them stays as it is beside other changes (a host with a stored `VCPU`
    can still be drained)."""
    held = {where: {str(n) for n in names} for where, names in before or []}
    for where, names in named:
        kept = held.get(where, set())
        given = [n for n in names if str(n) not in kept]
        error = placement_alias_error(given, where) or placement_class_error(given, where)
        if error is not None:
            raise error


def _whole_units(named: list[tuple[str, Mapping[ResourceName, Quantity]]],
                 before: list[tuple[str, Mapping[ResourceName, Quantity]]] | None = None) -> None:
    """Amounts in whole Placement units (`whole_units_error`): those given
    anew, not one stored before that this write leaves as it was."""
    for n, (where, values) in enumerate(named):
        kept = before[n][1] if before is not None else {}
        given = {r: q for r, q in values.items() if kept.get(r) != q}
        error = whole_units_error(given, where)
        if error is not None:
            raise error


def _spec_amounts(spec: HypervisorSpec) -> list[tuple[str, Mapping[ResourceName, Quantity]]]:
    return [("spec.reserved", spec.reserved), ("spec.extraCapacity", spec.extra_capacity)]


def _hypervisor_create(obj: Hypervisor, manager: str) -> None:
    why = hypervisor_name_error(obj.metadata.name)
    if why is not None:
        raise InvalidInput(why, field="metadata.name")
    _agent_writes_no_spec_on_create(obj, manager)
    check_unit_annotations(obj)
    _no_placement_aliases(_spec_names(obj.spec))
    _whole_units(_spec_amounts(obj.spec))


def _hypervisor_update(old: Hypervisor, new: Hypervisor, _manager: str, _now: datetime) -> None:
    """What a create checks, where this write changes it (an agent's status
    write carries the stored spec and annotations, read before these checks)."""
    check_unit_annotations(new, old)
    if new.spec != old.spec:
        _no_placement_aliases(_spec_names(new.spec), _spec_names(old.spec))
        _whole_units(_spec_amounts(new.spec), _spec_amounts(old.spec))


def _reservation_create(obj: Reservation, _manager: str) -> None:
    _no_placement_aliases([("spec.resources", obj.spec.resources)])
    _whole_units([("spec.resources", obj.spec.resources)])


def _policy_create(obj: OvercommitPolicy, _manager: str) -> None:
    _no_placement_aliases([("spec.overcommit", obj.spec.overcommit)])


def _policy_update(old: OvercommitPolicy, new: OvercommitPolicy, _manager: str, _now: datetime) -> None:
    _no_placement_aliases([("spec.overcommit", new.spec.overcommit)],
                          [("spec.overcommit", old.spec.overcommit)])


def _lease_writer(obj: Lease, manager: str) -> None:
    """A Lease is written only by the agent it names, holding it as itself."""
    agent = agent_manager(obj.metadata.name)
    if manager != agent:
        raise Forbidden(
            f"Lease {obj.metadata.name}: written only by {agent!r}, not by {manager!r}"
        )
    if obj.spec.holder_identity not in ("", agent):
        raise InvalidInput(
            f"Lease {obj.metadata.name}: spec.holderIdentity: must be {agent!r} "
            f"(or empty once released), not {obj.spec.holder_identity!r}"
        )


def _lease_update(_old: Lease, new: Lease, manager: str, _now: datetime) -> None:
    _lease_writer(new, manager)


def _reservation_growth(old: Reservation, new: Reservation, _manager: str, now: datetime) -> None:
    """Only a claim re-checks free capacity in the atomic write (`Store.claim`):
    an update must not make a reservation hold more than was claimed."""
    grown = growth_past_claim(old, new, now)
    if grown is not None:
        field, what = grown
        raise InvalidInput(
            f"Reservation {new.metadata.name}: {what} would hold more than its claim "
            "checked; release it and claim anew",
            field=field,
        )


def _own_agent(obj: Resource) -> str | None:
    return agent_manager(obj.metadata.name)


def _nobody(_obj: Resource) -> str | None:
    return None


def _reservation_host(obj: Reservation) -> str | None:
    return obj.spec.hypervisor


def _named_host(obj: Resource) -> str | None:
    return obj.metadata.name


@dataclass(frozen=True)
class KindStrategy(Generic[R]):
    """What one kind does differently; see the module docstring."""

    kind: str
    model: type[R]
    plural: str
    short_names: tuple[str, ...] = ()
    # Public: listed, exported, applied, in the CRDs and an all-kinds watch.
    # Access tokens are stored but seen only through `hvfleet token`.
    public: bool = True
    has_status: bool = True
    # Who alone may write the object's status (None: any writer).
    status_owner: Callable[[R], str | None] = _nobody
    # The hypervisor the object belongs to (None: it belongs to none).
    host_of: Callable[[R], str | None] = _nobody
    # Where the host stands in the stored document, for an object that no
    # longer decodes (only for kinds the stores index per host: `claimed`).
    host_path: tuple[str, ...] = ()
    # Created by a claim that checks its host's free capacity; the store keeps
    # an index of them per host (SQLite's host column, etcd's index keys).
    claimed: bool = False
    # Whether writes record managedFields (a Lease has one writer: no).
    records_fields: bool = True
    # Whether an agent may change the object's spec.
    agent_writes_spec: bool = False
    # Whether an apply sets the status its manifest gives (a Reservation's
    # phase is its writer's: released, confirmed), not only spec and metadata.
    status_applied: bool = False
    # Checks a create runs on the object it stores, given the writing manager;
    # an update on (stored, new, manager, now).
    validate_create: Callable[[R, str], None] = _no_check
    validate_update: Callable[[R, R, str, datetime], None] = _no_check
    # Whether the object governs a host with these labels (None: the kind
    # selects no hosts). An agent may read only what governs its own host.
    selects_host: Callable[[R, Mapping[str, str]], bool] | None = None
    # Whether a server's long-lived watches follow this kind (the fleet index,
    # the Placement snapshot, the token cache, the API's watches): a store then
    # keeps the object its own write read back for them (hvfleet.store.decoded),
    # and SQLite's shared feed polls it (hvfleet.store.feed); the garbage
    # collector's sweep reads only these kinds. The dashboard's history series
    # are read by a get, never followed, never owned, and large.
    followed: bool = True

    @property
    def singular(self) -> str:
        return self.kind.lower()

    def names(self) -> tuple[str, ...]:
        """Every name a user may give for the kind (kind, singular, plural, short)."""
        return (self.singular, self.plural, *self.short_names)

    def decode(self, doc: Mapping[str, Any]) -> R:
        """The object a document describes, within the bounds its field types carry."""
        return self.model.model_validate(doc)

    def status_of(self, obj: R) -> object:
        """The object's status (None for a kind without one, as a Lease)."""
        return getattr(obj, "status", None) if self.has_status else None

    def indexed_host(self, obj: R | None) -> str | None:
        """The host the stores index `obj` under (claimed kinds only)."""
        return self.host_of(obj) if obj is not None and self.claimed else None

    def host_in(self, doc: object) -> str | None:
        """The host a stored document names at `host_path`, as far as it still does."""
        node = doc
        for key in self.host_path:
            node = node.get(key) if isinstance(node, dict) else None
        return node if self.host_path and isinstance(node, str) and node else None


STRATEGIES: dict[str, KindStrategy[Any]] = {s.kind: s for s in (
    KindStrategy[Hypervisor](
        "Hypervisor", Hypervisor, "hypervisors", ("hv",),
        status_owner=_own_agent, host_of=_named_host,
        validate_create=_hypervisor_create, validate_update=_hypervisor_update,
    ),
    KindStrategy[Reservation](
        "Reservation", Reservation, "reservations", ("res", "rsv"),
        host_of=_reservation_host, host_path=("spec", "hypervisor"), claimed=True,
        status_applied=True,
        validate_create=_reservation_create, validate_update=_reservation_growth,
    ),
    KindStrategy[Lease](
        "Lease", Lease, "leases", has_status=False, host_of=_named_host,
        records_fields=False, agent_writes_spec=True,
        validate_create=_lease_writer, validate_update=_lease_update,
    ),
    KindStrategy[OvercommitPolicy]("OvercommitPolicy", OvercommitPolicy, "overcommitpolicies",
                                   ("ocp",), selects_host=selects,
                                   validate_create=_policy_create, validate_update=_policy_update),
    KindStrategy[AccessToken]("AccessToken", AccessToken, "accesstokens", public=False),
    # The Placement API's records (hvfleet.model.placement): stored, served only under /placement.
    KindStrategy[ResourceProvider]("ResourceProvider", ResourceProvider, "resourceproviders",
                                   public=False),
    KindStrategy[PlacementConsumer]("PlacementConsumer", PlacementConsumer, "placementconsumers",
                                    public=False),
    KindStrategy[PlacementName]("PlacementName", PlacementName, "placementnames", public=False),
    # The dashboard's history (model.dashboard), written by the servers only.
    KindStrategy[HistorySeries]("HistorySeries", HistorySeries, "historyseries", public=False,
                                followed=False),
)}


def strategy(kind: str) -> KindStrategy[Any]:
    """The strategy of a kind name as objects carry it (`Hypervisor`); KeyError else."""
    return STRATEGIES[kind]


def strategy_of(obj: Resource) -> KindStrategy[Any]:
    return STRATEGIES[obj.kind]


def governs(obj: Resource, labels: Mapping[str, str]) -> bool:
    """Whether `obj` governs a host with `labels` (`KindStrategy.selects_host`)."""
    check = strategy_of(obj).selects_host
    return check is not None and bool(check(obj, labels))


def kind_of_model(model: type[Resource]) -> str:
    """The kind name of a model (`Hypervisor` → "Hypervisor")."""
    return next(k for k, s in STRATEGIES.items() if s.model is model)


def public_kinds() -> list[str]:
    return [k for k, s in STRATEGIES.items() if s.public]
