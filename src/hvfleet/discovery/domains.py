"""What a libvirt domain takes from its host, and from which NUMA cell.

Two pure steps: `parse_domain` reads domain XML into a `DomainDemand` (no host
knowledge), and `attribute_to_cells` places that demand on the host's cells.

Counting rules (see docs/agent.md):
- `cpu` is the `<vcpu>` count (the maximum, as `<memory>` is), `memory` the
  `<memory>` element (the maximum, not `<currentMemory>`: a balloon can give
  memory back to the guest at any time).
- Memory backed by hugepages (`<memoryBacking><hugepages>`) counts as
  `hugepages-<size>` (any page size: `hugepages-32Mi` for `<page
  size='32768' unit='KiB'/>`, whether or not the host has a pool of that
  size) instead of `memory`. A guest NUMA cell uses the `<page>`
  whose `nodeset` names it, else the `<page>` without nodeset, else the
  host's default hugepage size (2 MiB on x86), as libvirt does.
- Cells are *host* NUMA nodes, found from `<numatune>` (`<memnode>` per guest
  cell, else `<memory nodeset>`) and from vCPU pinning (`<vcpupin cpuset>`, else
  `<vcpu cpuset>`), never from guest cell ids. A pinned vCPU is shared between
  the host cells holding its pinned CPUs, in proportion to how many of them
  each holds. An unpinned vCPU follows its memory's host nodes if numatune names
  them (libvirt's automatic placement does the same), else it is spread evenly
  over all cells; never over a cell without CPUs (a CXL or HBM memory node),
  where no vCPU runs. Unplaced memory is spread evenly over all cells. Spreading is
  the honest answer for an unpinned guest: the kernel may run it anywhere, and
  an even share keeps every cell's sum equal to the host's.
- Node ids that the host does not have are ignored; if none remain, the demand
  is spread evenly.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction

from lxml import etree

from hvfleet.discovery.host import HostTopology, hugepage_resource
from hvfleet.discovery.shares import split, split_evenly
from hvfleet.discovery.xmlsafe import parse_xml
from hvfleet.discovery.xmlvalues import memory_bytes, parse_set, size_kib
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hypervisor import ResourceList
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import CPU, MEMORY, ResourceName

DEFAULT_HUGEPAGE_KIB = 2048
MAX_VCPUS = 16384  # far above any libvirt driver's limit; guards hostile XML
MILLI = 1000

# virDomainState → the word `virsh domstate` prints, with "shut off" as "shutoff".
DOMAIN_STATES: dict[int, str] = {
    0: "nostate", 1: "running", 2: "blocked", 3: "paused", 4: "shutdown",
    5: "shutoff", 6: "crashed", 7: "pmsuspended",
}


def state_name(state: int) -> str:
    return DOMAIN_STATES.get(state, f"unknown({state})")


@dataclass(frozen=True)
class DomainRecord:
    """One domain as libvirt showed it: its XML and its virDomainState. Read by
    `hvfleet.discovery.libvirt_conn`, parsed here; defined here so the pure
    side (parsers, the agent's reconcile) needs no libvirt binding."""

    name: str
    uuid: str
    xml: str
    state: int


@dataclass(frozen=True)
class MemoryPart:
    """A piece of guest memory: a guest NUMA cell's, or all of it for a guest
    without NUMA cells (cell None), and the page size backing it."""

    guest_cell: int | None
    bytes: int
    # Hugepage size in KiB, or None for ordinary memory.
    page_kib: int | None = None


@dataclass(frozen=True)
class DomainDemand:
    uuid: str
    name: str
    vcpus: int
    memory_bytes: int
    memory_parts: tuple[MemoryPart, ...]
    # guest cell id → its vCPU ids
    guest_cells: dict[int, frozenset[int]] = field(default_factory=dict)
    # vCPU id → host CPUs (<cputune><vcpupin>)
    vcpu_pins: dict[int, frozenset[int]] = field(default_factory=dict)
    # <vcpu cpuset>: host CPUs of every vCPU without its own pin
    vcpu_cpuset: frozenset[int] | None = None
    # <numatune><memory nodeset>
    memory_nodeset: frozenset[int] | None = None
    # <numatune><memnode cellid nodeset>: guest cell → host nodes
    memnodes: dict[int, frozenset[int]] = field(default_factory=dict)

    def resources(self) -> ResourceList:
        out: ResourceList = {CPU: Quantity(self.vcpus)}
        for name, amount in _memory_by_resource(self.memory_parts).items():
            out[name] = name.quantity(amount)
        out.setdefault(MEMORY, MEMORY.quantity(0))
        return dict(sorted(out.items(), key=lambda kv: str(kv[0])))


def _resource_of(part: MemoryPart, where: str) -> ResourceName:
    if part.page_kib is None:
        return MEMORY
    name = hugepage_resource(part.page_kib)
    if name is None:
        raise InvalidInput(f"{where}: hugepage size {part.page_kib} KiB is not a power of two")
    return name


def _memory_by_resource(parts: tuple[MemoryPart, ...]) -> dict[ResourceName, int]:
    out: dict[ResourceName, int] = defaultdict(int)
    for p in parts:
        out[_resource_of(p, "domain")] += p.bytes
    return dict(out)


# -- parsing ---------------------------------------------------------------------------


def _int_attr(elem: etree._Element, attr: str, where: str) -> int:
    text = (elem.get(attr) or "").strip()
    if not text.isdecimal():
        raise InvalidInput(f"{where}: {attr}={text!r} is not a whole number")
    return int(text)


def _vcpus(root: etree._Element, where: str) -> tuple[int, frozenset[int] | None]:
    elem = root.find("vcpu")
    if elem is None:
        return 1, None  # libvirt's default
    text = (elem.text or "").strip()
    if not text.isdecimal() or not 0 < int(text) <= MAX_VCPUS:
        raise InvalidInput(f"{where}: <vcpu> {text!r} is not a vCPU count (1..{MAX_VCPUS})")
    cpuset = elem.get("cpuset")
    return int(text), parse_set(cpuset, f"{where} <vcpu cpuset>") if cpuset else None


def _guest_cells(root: etree._Element, where: str) -> dict[int, tuple[frozenset[int], int]]:
    """guest cell id → (vCPU ids, memory bytes)."""
    cells: dict[int, tuple[frozenset[int], int]] = {}
    for c in root.iterfind("cpu/numa/cell"):
        w = f"{where} guest NUMA cell"
        cid = _int_attr(c, "id", w) if c.get("id") is not None else len(cells)
        if cid in cells:
            raise InvalidInput(f"{where}: duplicate guest NUMA cell id {cid}")
        cpus_text = c.get("cpus")
        cpus = parse_set(cpus_text, f"{w} {cid} cpus") if cpus_text else frozenset()
        mem_text = (c.get("memory") or "").strip()
        if not mem_text.isdecimal():
            raise InvalidInput(f"{w} {cid}: memory={mem_text!r} is not a whole number")
        probe = etree.Element("memory", unit=c.get("unit") or "KiB")
        probe.text = mem_text
        cells[cid] = (cpus, memory_bytes(probe, f"{w} {cid} memory"))
    return cells


def _hugepage_sizes(
    root: etree._Element, where: str, default_kib: int
) -> tuple[bool, list[tuple[int, frozenset[int] | None]]]:
    """(backed by hugepages?, [(page size KiB, guest nodeset or None)])."""
    hp = root.find("memoryBacking/hugepages")
    if hp is None:
        return False, []
    pages: list[tuple[int, frozenset[int] | None]] = []
    for p in hp.iterfind("page"):
        size = size_kib(p.get("size"), p.get("unit"), f"{where} <hugepages><page>")
        ns = p.get("nodeset")
        pages.append((size, parse_set(ns, f"{where} <page nodeset>") if ns else None))
    if not pages:
        pages = [(default_kib, None)]
    return True, pages


def _page_for(
    cell: int | None, pages: list[tuple[int, frozenset[int] | None]], default_kib: int
) -> int:
    if cell is not None:
        for size, ns in pages:
            if ns is not None and cell in ns:
                return size
    for size, ns in pages:
        if ns is None:
            return size
    return default_kib if cell is not None else pages[0][0]


def _memory_parts(
    total: int,
    cells: dict[int, tuple[frozenset[int], int]],
    hugepages: bool,
    pages: list[tuple[int, frozenset[int] | None]],
    default_kib: int,
) -> tuple[MemoryPart, ...]:
    def page(cell: int | None) -> int | None:
        return _page_for(cell, pages, default_kib) if hugepages else None

    parts = [MemoryPart(cid, mem, page(cid)) for cid, (_, mem) in sorted(cells.items())]
    rest = total - sum(p.bytes for p in parts)
    if rest > 0 or not parts:
        # Memory outside guest cells (e.g. DIMMs) or a guest without cells.
        parts.append(MemoryPart(None, max(rest, 0), page(None)))
    return tuple(p for p in parts if p.bytes > 0) or (MemoryPart(None, 0, page(None)),)


def _pins(root: etree._Element, vcpus: int, where: str) -> dict[int, frozenset[int]]:
    pins: dict[int, frozenset[int]] = {}
    for p in root.iterfind("cputune/vcpupin"):
        vcpu = _int_attr(p, "vcpu", f"{where} <vcpupin>")
        if vcpu >= vcpus:
            raise InvalidInput(f"{where}: <vcpupin vcpu='{vcpu}'> but the guest has {vcpus} vCPUs")
        pins[vcpu] = parse_set(p.get("cpuset"), f"{where} <vcpupin vcpu='{vcpu}'> cpuset")
    return pins


def _numatune(
    root: etree._Element, where: str
) -> tuple[frozenset[int] | None, dict[int, frozenset[int]]]:
    mem = root.find("numatune/memory")
    nodeset = None
    if mem is not None and mem.get("nodeset"):
        nodeset = parse_set(mem.get("nodeset"), f"{where} <numatune><memory nodeset>")
    memnodes: dict[int, frozenset[int]] = {}
    for m in root.iterfind("numatune/memnode"):
        cell = _int_attr(m, "cellid", f"{where} <memnode>")
        memnodes[cell] = parse_set(m.get("nodeset"), f"{where} <memnode cellid='{cell}'> nodeset")
    return nodeset, memnodes


def parse_domain(
    xml: str | bytes, default_hugepage_kib: int = DEFAULT_HUGEPAGE_KIB
) -> DomainDemand:
    """A domain's demand, or InvalidInput naming the domain and what is wrong."""
    root = parse_xml(xml, "domain XML")
    if root.tag != "domain":
        raise InvalidInput(f"domain XML: root element is <{root.tag}>, not <domain>")
    # The name exactly as libvirt has it: libvirt takes " " or " a " as a
    # name, and a guest so named still runs and is counted.
    name = root.findtext("name") or ""
    uuid = (root.findtext("uuid") or "").strip().lower()
    where = f"domain {name!r}" if name else "domain"
    if not name:
        raise InvalidInput(f"domain XML{' ' + uuid if uuid else ''}: no <name>")
    if not uuid:
        raise InvalidInput(f"{where}: no <uuid>")
    mem_elem = root.find("memory")
    if mem_elem is None:
        raise InvalidInput(f"{where}: no <memory>")
    total = memory_bytes(mem_elem, f"{where} <memory>")
    vcpus, vcpu_cpuset = _vcpus(root, where)
    cells = _guest_cells(root, where)
    hugepages, pages = _hugepage_sizes(root, where, default_hugepage_kib)
    parts = _memory_parts(total, cells, hugepages, pages, default_hugepage_kib)
    for p in parts:
        _resource_of(p, where)
    nodeset, memnodes = _numatune(root, where)
    return DomainDemand(
        uuid=uuid,
        name=name,
        vcpus=vcpus,
        memory_bytes=total,
        memory_parts=parts,
        guest_cells={cid: cpus for cid, (cpus, _) in cells.items()},
        vcpu_pins=_pins(root, vcpus, where),
        vcpu_cpuset=vcpu_cpuset,
        memory_nodeset=nodeset,
        memnodes=memnodes,
    )


# -- placing the demand on host cells --------------------------------------------------


def _on_host(nodes: frozenset[int] | None, topology: HostTopology) -> frozenset[int] | None:
    if nodes is None:
        return None
    present = nodes & frozenset(topology.cell_ids)
    return present or None


def _memory_home(d: DomainDemand, guest_cell: int | None, t: HostTopology) -> frozenset[int] | None:
    """The host nodes a piece of memory is bound to, or None (unbound)."""
    if guest_cell is not None and guest_cell in d.memnodes:
        bound = _on_host(d.memnodes[guest_cell], t)
        if bound is not None:
            return bound
    return _on_host(d.memory_nodeset, t)


def _guest_cell_of_vcpu(d: DomainDemand, vcpu: int) -> int | None:
    for cid, cpus in d.guest_cells.items():
        if vcpu in cpus:
            return cid
    return None


def _vcpu_weights(d: DomainDemand, vcpu: int, t: HostTopology) -> dict[int, int]:
    pinned = d.vcpu_pins.get(vcpu, d.vcpu_cpuset)
    if pinned is not None:
        weights = t.cells_of_cpus(pinned)
        if weights:
            return weights
    home = _memory_home(d, _guest_cell_of_vcpu(d, vcpu), t)
    cells = home if home is not None else t.cell_ids
    # A vCPU runs on a CPU: never on a memory-only cell (CXL, HBM nodes:
    # `<cpus num='0'>`); with its memory all on such cells, on any that has CPUs.
    with_cpus = {c.id for c in t.cells if c.cpus}
    runnable = [c for c in cells if c in with_cpus] or sorted(with_cpus) or list(cells)
    return dict.fromkeys(sorted(runnable), 1)


CellUnits = dict[int, dict[ResourceName, int]]


def units_to_resources(units: dict[ResourceName, int]) -> ResourceList:
    """Whole units (millicpu for cpu, bytes for the rest) → quantities."""
    out: ResourceList = {}
    for r, amount in units.items():
        out[r] = r.quantity(Fraction(amount, MILLI) if r == CPU else amount)
    return out


def attribute_to_cells(d: DomainDemand, t: HostTopology) -> dict[int, ResourceList]:
    """host cell id → the part of `d` it carries; parts add up to `d.resources()`."""
    return {cell: units_to_resources(units) for cell, units in cell_units(d, t).items()}


def cell_units(d: DomainDemand, t: HostTopology) -> CellUnits:
    """`attribute_to_cells` in whole units (millicpu, bytes), for summing many domains."""
    # Exact shares of all vCPUs first, then one split into millicpus: rounding
    # each vCPU on its own would pile the rounding up on the lowest cell.
    share: dict[int, Fraction] = defaultdict(Fraction)
    for vcpu in range(d.vcpus):
        weights = _vcpu_weights(d, vcpu, t)
        total = sum(weights.values())
        for cell, w in weights.items():
            share[cell] += Fraction(w, total)
    milli = split(d.vcpus * MILLI, share)
    amounts: dict[int, dict[ResourceName, int]] = defaultdict(lambda: defaultdict(int))
    for part in d.memory_parts:
        resource = _resource_of(part, f"domain {d.name!r}")
        home = _memory_home(d, part.guest_cell, t)
        nodes = sorted(home if home is not None else t.cell_ids)
        # Hugepages move between cells in whole pages.
        page = part.page_kib * 1024 if part.page_kib else 1
        unit = page if part.bytes % page == 0 else 1
        for cell, units in split_evenly(part.bytes // unit, nodes).items():
            amounts[cell][resource] += units * unit
    out: CellUnits = {}
    for cell in t.cell_ids:
        values: dict[ResourceName, int] = {}
        if milli.get(cell):
            values[CPU] = milli[cell]
        for resource, amount in amounts.get(cell, {}).items():
            if amount:
                values[resource] = amount
        if values:
            out[cell] = values
    return out
