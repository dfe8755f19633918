"""The agent's reconcile: what libvirt showed → the Hypervisor's status.

It reads as the seed's node agent does, a short list of named pure steps, each
taking the object and returning a new one:

    add_capacity → add_instances → add_allocation → add_host_capabilities
    → add_effective_capacity → add_conditions → add_heartbeat

`digest` turns a raw `Observation` (XML strings and node info, as read from
libvirt by `hvfleet.agent.observe`) into `Facts` once, so the steps only
arrange values. Nothing here does I/O, so every step is tested alone.

effectiveCapacity takes its ratios from spec and the OvercommitPolicies that
select the host (`Facts.policies`, read by the runner). When the runner could
not read them (`Unresolved`), nothing is guessed: the last effectiveCapacity
(host and cells) stays, and the `Synced` condition says False and why, which
every reader shows (`hvfleet.model.spec_sync`).
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from hvfleet.discovery.domains import (
    CellUnits,
    DomainDemand,
    DomainRecord,
    cell_units,
    parse_domain,
    state_name,
    units_to_resources,
)
from hvfleet.discovery.host import HostTopology, NodeInfo, host_capacity, parse_host_topology
from hvfleet.model.bounds import MAX_INSTANCE_NAME, MAX_REASON
from hvfleet.model.capacity import add, counts_in_allocation, with_effective_capacity
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import HostCapabilities
from hvfleet.model.hypervisor import (
    Cell,
    CountMode,
    Hypervisor,
    Instance,
    OvercommitPolicy,
    ResourceList,
)
from hvfleet.model.meta import Condition, set_condition
from hvfleet.model.overcommit import (
    RATIOS_RESOLVED,
    RATIOS_UNRESOLVED,
    SYNCED_CONDITION,
    resolve_overcommit,
)
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import ResourceName

log = logging.getLogger(__name__)


LIBVIRT_CONNECTED = "LibvirtConnected"
READY = "Ready"

# virDomainEventType VIR_DOMAIN_EVENT_CRASHED and its details
# (virDomainEventCrashedDetailType), as libvirt numbers them.
CRASHED_EVENT = 8
CRASH_REASONS = {0: "panicked", 1: "crashloaded"}

CapabilitiesParser = Callable[[str, str | None], HostCapabilities]


@dataclass(frozen=True)
class Unresolved:
    """The OvercommitPolicies could not be read: the store's words why."""

    message: str


# What the runner read of the policies: the ones the store shows this agent
# (on a direct store, all of them; through the API, those selecting its host).
Policies = tuple[OvercommitPolicy, ...] | Unresolved


@dataclass(frozen=True)
class Observation:
    """Everything read from libvirt in one pass, unparsed."""

    uri: str
    caps_xml: str
    domcaps_xml: str | None
    node_info: NodeInfo
    libvirt_version: str
    hypervisor_version: str
    domains: tuple[DomainRecord, ...]
    at: datetime


@dataclass(frozen=True)
class CrashEvent:
    """One lifecycle CRASHED event libvirt delivered for a domain."""

    uuid: str
    at: datetime
    reason: str


@dataclass(frozen=True)
class ParsedDomain:
    record: DomainRecord
    demand: DomainDemand
    # host cell → its share in whole units (millicpu, bytes); see cell_units
    cells: CellUnits = field(default_factory=dict)


@dataclass(frozen=True)
class Facts:
    """An observation, parsed: what the steps arrange into status."""

    uri: str
    topology: HostTopology
    domains: tuple[ParsedDomain, ...]
    # Domains the parser could not understand: (name, one-line reason).
    skipped: tuple[tuple[str, str], ...]
    count: CountMode
    host_capabilities: HostCapabilities | None
    libvirt_version: str
    hypervisor_version: str
    now: datetime
    # Crash events seen since the last status write; added to the counts the
    # stored status already has (so they survive agent restarts).
    crashes: tuple[CrashEvent, ...] = ()
    # The agent's configured core dump directory, if usable (see AgentConfig).
    dump_location: str | None = None
    # The OvercommitPolicies in the store (read by the runner, not from libvirt):
    # effectiveCapacity takes their ratios where spec.overcommit says nothing.
    policies: Policies = ()


Parsed = tuple[DomainDemand, CellUnits] | InvalidInput


class DomainParseCache:
    """Parsed domains and their cell shares by the digest of their XML, so an
    event or resync re-parses only what changed. Only the domains of the latest
    pass are kept; a different host topology drops everything."""

    def __init__(self) -> None:
        self._entries: dict[bytes, Parsed] = {}
        self._topology: HostTopology | None = None

    def parse(self, records: tuple[DomainRecord, ...], topology: HostTopology) -> list[Parsed]:
        if topology != self._topology:
            self._entries, self._topology = {}, topology
        fresh: dict[bytes, Parsed] = {}
        out: list[Parsed] = []
        for r in records:
            key = hashlib.blake2b(r.xml.encode(), digest_size=16).digest()
            hit = fresh.get(key) or self._entries.get(key)
            if hit is None:
                try:
                    demand = parse_domain(r.xml)
                    hit = (demand, cell_units(demand, topology))
                except InvalidInput as exc:
                    hit = exc
            fresh[key] = hit
            out.append(hit)
        self._entries = fresh
        return out


def digest(
    obs: Observation,
    count: CountMode,
    capabilities_parser: CapabilitiesParser | None = None,
    cache: DomainParseCache | None = None,
) -> Facts:
    """Parse an observation. Host XML that cannot be parsed raises InvalidInput
    (the whole status would be wrong); a bad domain is skipped and reported."""
    topology = parse_host_topology(obs.caps_xml, obs.node_info)
    results = (cache or DomainParseCache()).parse(obs.domains, topology)
    parsed: list[ParsedDomain] = []
    skipped: list[tuple[str, str]] = []
    for record, result in zip(obs.domains, results, strict=True):
        if isinstance(result, InvalidInput):
            skipped.append((record.name, str(result)))
        else:
            parsed.append(ParsedDomain(record, *result))
    host_caps = None
    if capabilities_parser is not None:
        try:
            host_caps = capabilities_parser(obs.caps_xml, obs.domcaps_xml)
        except InvalidInput as exc:
            host_caps = HostCapabilities(notes=[f"host capabilities could not be parsed: {exc}"])
    return Facts(
        uri=obs.uri,
        topology=topology,
        domains=tuple(sorted(parsed, key=lambda d: (d.record.name, d.record.uuid))),
        skipped=tuple(sorted(skipped)),
        count=count,
        host_capabilities=host_caps,
        libvirt_version=obs.libvirt_version,
        hypervisor_version=obs.hypervisor_version,
        now=obs.at,
    )


def _status(h: Hypervisor, **update: object) -> Hypervisor:
    return h.model_copy(update={"status": h.status.model_copy(update=update)})


def _sorted(values: ResourceList) -> ResourceList:
    return dict(sorted(values.items(), key=lambda kv: str(kv[0])))


def _zeros(like: ResourceList) -> ResourceList:
    return {r: Quantity(0, q.format) for r, q in like.items()}


# -- the steps ------------------------------------------------------------------------


def add_capacity(h: Hypervisor, facts: Facts) -> Hypervisor:
    capacity, cells = host_capacity(facts.topology)
    # A cell keeps its effectiveCapacity until add_effective_capacity resolves a
    # new one (it does not when the policies could not be read).
    before = {c.id: c.effective_capacity for c in h.status.cells}
    cells = [c.model_copy(update={"effective_capacity": before.get(c.id, c.effective_capacity)})
             for c in cells]
    return _status(h, capacity=capacity, cells=cells)


def instance_name(name: str) -> str:
    """A domain's name as the status lists it: as libvirt has it, cut (with
    '…') past what a status holds (libvirt sets no bound; the uuid names it)."""
    return name if len(name) <= MAX_INSTANCE_NAME else name[:MAX_INSTANCE_NAME - 1] + "…"


def add_instances(h: Hypervisor, facts: Facts) -> Hypervisor:
    before = {i.uuid: i for i in h.status.instances}
    crashes: dict[str, list[CrashEvent]] = defaultdict(list)
    for c in facts.crashes:
        crashes[c.uuid].append(c)
    instances = []
    for d in facts.domains:
        uuid = d.demand.uuid
        old = before.get(uuid)
        count = old.crash_count if old else None
        last_time = old.last_crash_time if old else None
        last_reason = old.last_crash_reason if old else None
        if crashes.get(uuid):
            latest = max(crashes[uuid], key=lambda c: c.at)
            count = (count or 0) + len(crashes[uuid])
            last_time, last_reason = latest.at, latest.reason
        instances.append(Instance(
            uuid=uuid,
            name=instance_name(d.demand.name),
            state=state_name(d.record.state),
            resources=d.demand.resources(),
            crash_count=count,
            last_crash_time=last_time,
            last_crash_reason=last_reason,
        ))
    return _status(h, instances=instances)


def counted(facts: Facts) -> list[ParsedDomain]:
    """The domains that hold resources: all defined ones, or only active ones,
    judged as every reader of the status judges it (`counts_in_allocation`)."""
    return [d for d in facts.domains
            if counts_in_allocation(state_name(d.record.state), facts.count)]


def add_allocation(h: Hypervisor, facts: Facts) -> Hypervisor:
    """Σ of the counted domains, per host and per cell; every resource the host
    has appears, at 0 if nothing uses it. `status.countMode` says which
    domains it counts, so a reader can tell whether a listed instance is in
    it (a claim for a shut-off one under `--count running` holds all it has)."""
    # Summed in whole units (ints), turned into quantities once: a 500-domain
    # host would otherwise do thousands of exact-fraction additions per pass.
    host: dict[ResourceName, int] = defaultdict(int)
    per_cell: dict[int, dict[ResourceName, int]] = defaultdict(lambda: defaultdict(int))
    for d in counted(facts):
        for cell_id, units in d.cells.items():
            for r, amount in units.items():
                host[r] += amount
                per_cell[cell_id][r] += amount
    allocation = add([_zeros(h.status.capacity), units_to_resources(host)])
    cells: list[Cell] = []
    for cell in h.status.cells:
        alloc = add([_zeros(cell.capacity), units_to_resources(per_cell.get(cell.id, {}))])
        cells.append(cell.model_copy(update={"allocation": _sorted(alloc)}))
    return _status(h, allocation=_sorted(allocation), cells=cells, count_mode=facts.count)


def add_host_capabilities(h: Hypervisor, facts: Facts) -> Hypervisor:
    caps = facts.host_capabilities
    if caps is None:
        return _status(h, host_capabilities=None)
    # The connection knows the exact versions; the XML parser can only infer the
    # hypervisor's from machine type names, so its guess and note give way.
    notes = [n for n in caps.notes if not (n.startswith("QEMU version ") and "inferred" in n)]
    caps = caps.model_copy(
        update={
            "libvirt_version": facts.libvirt_version,
            "hypervisor_version": facts.hypervisor_version or caps.hypervisor_version,
            "dump_location": facts.dump_location,
            "notes": notes,
        }
    )
    return _status(h, host_capabilities=caps)


def _ratios(h: Hypervisor, policies: Sequence[OvercommitPolicy]) -> str:
    ratios = resolve_overcommit(h, policies)
    if not ratios:
        return "ratio 1 for every resource"
    return ", ".join(f"{r} {v.value:g} ({v.source})" for r, v in ratios.items())


def with_resolved_capacity(h: Hypervisor, policies: Policies, now: datetime) -> Hypervisor:
    """status.effectiveCapacity from spec and the policies, with the `Synced`
    condition saying so; if the policies are `Unresolved`, the last one kept."""
    if isinstance(policies, Unresolved):
        synced = Condition(
            type=SYNCED_CONDITION, status="False", reason=RATIOS_UNRESOLVED,
            message=(f"the agent could not read the OvercommitPolicies that select this host "
                     f"({policies.message}); status.effectiveCapacity is the last one it resolved"),
        )
    else:
        h = with_effective_capacity(h, policies)
        synced = Condition(
            type=SYNCED_CONDITION, status="True", reason=RATIOS_RESOLVED,
            message=f"status.effectiveCapacity under {_ratios(h, policies)}",
        )
    return _status(h, conditions=set_condition(h.status.conditions, synced, now))


def add_effective_capacity(h: Hypervisor, facts: Facts) -> Hypervisor:
    return with_resolved_capacity(h, facts.policies, facts.now)


def add_conditions(h: Hypervisor, facts: Facts) -> Hypervisor:
    conditions = set_condition(
        h.status.conditions,
        Condition(
            type=LIBVIRT_CONNECTED,
            status="True",
            reason="Connected",
            message=f"connected to {facts.uri} (libvirt {facts.libvirt_version})",
        ),
        facts.now,
    )
    n = len(facts.domains)
    if facts.skipped:
        names = ", ".join(name for name, _ in facts.skipped[:5])
        more = f" and {len(facts.skipped) - 5} more" if len(facts.skipped) > 5 else ""
        ready = Condition(
            type=READY,
            status="False",
            reason="UnparsableDomains",
            message=(
                f"allocation leaves out {len(facts.skipped)} domain(s) the agent cannot "
                f"parse: {names}{more}; first problem: {facts.skipped[0][1]}"
            ),
        )
    else:
        ready = Condition(
            type=READY,
            status="True",
            reason="Reconciled",
            message=f"capacity and allocation of {n} domain(s) ({facts.count}) observed",
        )
    conditions = set_condition(conditions, ready, facts.now)
    return _status(h, conditions=conditions)


def add_heartbeat(h: Hypervisor, facts: Facts) -> Hypervisor:
    return _status(h, observed_generation=h.metadata.generation, last_heartbeat_time=facts.now)


STEPS: tuple[Callable[[Hypervisor, Facts], Hypervisor], ...] = (
    add_capacity,
    add_instances,
    add_allocation,
    add_host_capabilities,
    add_effective_capacity,
    add_conditions,
    add_heartbeat,
)


def reconcile(h: Hypervisor, facts: Facts, now: datetime | None = None) -> Hypervisor:
    """`h` with its status rebuilt from `facts` (spec and metadata untouched)."""
    if now is not None:
        facts = replace(facts, now=now)
    for step in STEPS:
        h = step(h, facts)
    return h


def mark_disconnected(
    h: Hypervisor, uri: str, message: str, now: datetime, policies: Policies = ()
) -> Hypervisor:
    """libvirt cannot be reached: keep the last observation (marked not Ready),
    and still honour spec (and policy) changes in effectiveCapacity."""
    conditions = set_condition(
        h.status.conditions,
        Condition(type=LIBVIRT_CONNECTED, status="False", reason="Disconnected", message=message),
        now,
    )
    conditions = set_condition(
        conditions,
        Condition(
            type=READY,
            status="False",
            reason="LibvirtDisconnected",
            message=f"status is the last one observed before {uri} went away",
        ),
        now,
    )
    h = with_resolved_capacity(_status(h, conditions=conditions), policies, now)
    return _status(h, observed_generation=h.metadata.generation, last_heartbeat_time=now)


def mark_unreadable_host(
    h: Hypervisor, message: str, now: datetime, policies: Policies = (),
    reason: str = "UnreadableHost",
) -> Hypervisor:
    """libvirt answers, but its description of the host cannot be parsed (or,
    `reason` StatusRefused, what it describes cannot be stored): the last
    observation kept, not Ready, and why."""
    conditions = set_condition(
        h.status.conditions,
        Condition(type=READY, status="False", reason=reason, message=message[:MAX_REASON]),
        now,
    )
    h = with_resolved_capacity(_status(h, conditions=conditions), policies, now)
    return _status(h, observed_generation=h.metadata.generation, last_heartbeat_time=now)


def same_status(a: Hypervisor, b: Hypervisor) -> bool:
    """Equal apart from the heartbeat (conditions keep their transition times
    when their status does not change, so they compare equal)."""
    return a.status.model_copy(update={"last_heartbeat_time": None}) == b.status.model_copy(
        update={"last_heartbeat_time": None}
    )
