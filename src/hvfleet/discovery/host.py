"""What a host physically has: logical CPUs, memory and hugepage pools, per
NUMA cell and in total, from libvirt's capabilities XML and node info.

Rules (see docs/agent.md):
- `cpu` is the number of logical CPUs libvirt lists in the cell.
- A cell's smallest listed page size is its ordinary page; every larger size is
  a hugepage pool, whatever its size (x86: 2 MiB, 1 GiB; arm64: 64 KiB, 2 MiB,
  32 MiB, 1 GiB; POWER: 16 MiB, 16 GiB). Pool memory is reported as
  `hugepages-<size>` (`hugepages-2Mi`, `hugepages-32Mi`: in bytes, named as
  Kubernetes does) and is *not* part of `memory`, since an ordinary guest can
  never use it.
- Host figures are the sums of the cell figures, so cells and host never
  disagree. (libvirt's node info may differ: the test driver's `test:///default`
  reports 3 GiB in node info but cells of 2 + 4 GiB; we report 6 GiB.)
- When capabilities list no NUMA topology (test-driver node files), the host is
  `nodeinfo.nodes` cells sharing CPUs (in contiguous id blocks) and memory
  evenly; `HostTopology.source` says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from lxml import etree

from hvfleet.discovery.shares import split_evenly
from hvfleet.discovery.xmlsafe import parse_xml
from hvfleet.discovery.xmlvalues import memory_bytes, size_kib
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hypervisor import Cell, ResourceList
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import CPU, MEMORY, ResourceName, hugepages_resource


def hugepage_resource(size_kib: int) -> ResourceName | None:
    """The resource of a pool of `size_kib` pages (`hugepages-32Mi` for
    32768), for every size libvirt reports; None for a size no page has
    (not a power of two), which a pool still takes from `memory`."""
    size = size_kib * 1024
    return hugepages_resource(size) if size & (size - 1) == 0 else None


@dataclass(frozen=True)
class NodeInfo:
    """virNodeGetInfo, as the Python binding returns it (memory in MiB)."""

    model: str
    memory_mib: int
    cpus: int
    mhz: int
    nodes: int
    sockets: int
    cores: int
    threads: int

    @classmethod
    def from_libvirt(cls, info: Sequence[object]) -> NodeInfo:
        if len(info) != 8:
            raise InvalidInput(f"node info: expected 8 fields, got {len(info)}")
        model, *numbers = info
        ints = [int(str(n)) for n in numbers]
        return cls(str(model), *ints)


@dataclass(frozen=True)
class HostCell:
    id: int
    cpus: frozenset[int]
    # All memory of the cell, hugepage pools included.
    memory_bytes: int
    # Hugepage pools: page size in KiB → number of pages.
    hugepages: dict[int, int] = field(default_factory=dict)

    @property
    def hugepage_bytes(self) -> int:
        return sum(size * 1024 * count for size, count in self.hugepages.items())


@dataclass(frozen=True)
class HostTopology:
    cells: tuple[HostCell, ...]
    # "capabilities": cells as libvirt reported them; "nodeinfo": libvirt gave no
    # topology, so cells were derived from node info (even split).
    source: Literal["capabilities", "nodeinfo"]

    @property
    def cell_ids(self) -> list[int]:
        return [c.id for c in self.cells]

    def cells_of_cpus(self, cpus: frozenset[int]) -> dict[int, int]:
        """cell id → how many of `cpus` it holds (cells holding none are left out)."""
        out: dict[int, int] = {}
        for c in self.cells:
            n = len(c.cpus & cpus)
            if n:
                out[c.id] = n
        return out


def _cell_from_xml(elem: etree._Element) -> HostCell:
    cid_text = elem.get("id", "")
    if not cid_text.isdecimal():
        raise InvalidInput(f"capabilities: NUMA cell id {cid_text!r} is not a number")
    cid = int(cid_text)
    where = f"capabilities: cell {cid}"
    mem = elem.find("memory")
    if mem is None:
        raise InvalidInput(f"{where}: no <memory>")
    total = memory_bytes(mem, f"{where} memory")
    cpus: set[int] = set()
    for cpu in elem.iterfind("cpus/cpu"):
        cpu_id = cpu.get("id", "")
        if not cpu_id.isdecimal():
            raise InvalidInput(f"{where}: cpu id {cpu_id!r} is not a number")
        cpus.add(int(cpu_id))
    pages: dict[int, int] = {}
    for p in elem.iterfind("pages"):
        size = size_kib(p.get("size"), p.get("unit"), f"{where} pages")
        count = (p.text or "0").strip()
        if not count.isdecimal():
            raise InvalidInput(f"{where}: page count {count!r} is not a number")
        pages[size] = int(count)
    ordinary = min(pages) if pages else None
    hugepages = {s: n for s, n in sorted(pages.items()) if s != ordinary}
    return HostCell(cid, frozenset(cpus), total, hugepages)


def _cells_from_nodeinfo(info: NodeInfo) -> tuple[HostCell, ...]:
    nodes = max(1, info.nodes)
    ids = list(range(nodes))
    cpu_counts = split_evenly(max(0, info.cpus), ids)
    mem = split_evenly(max(0, info.memory_mib) * 2**20, ids)
    cells = []
    first = 0
    for i in ids:
        n = cpu_counts.get(i, 0)
        cells.append(HostCell(i, frozenset(range(first, first + n)), mem.get(i, 0)))
        first += n
    return tuple(cells)


def parse_host_topology(caps_xml: str, node_info: NodeInfo) -> HostTopology:
    """NUMA cells with their CPUs, memory and hugepage pools."""
    root = parse_xml(caps_xml, "capabilities")
    if root.tag != "capabilities":
        raise InvalidInput(f"capabilities: root element is <{root.tag}>, not <capabilities>")
    cells = [_cell_from_xml(c) for c in root.iterfind("host/topology/cells/cell")]
    if not cells:
        return HostTopology(_cells_from_nodeinfo(node_info), "nodeinfo")
    ids = [c.id for c in cells]
    if len(set(ids)) != len(ids):
        raise InvalidInput(f"capabilities: duplicate NUMA cell ids {sorted(ids)}")
    return HostTopology(tuple(sorted(cells, key=lambda c: c.id)), "capabilities")


def cell_capacity(cell: HostCell) -> ResourceList:
    out: ResourceList = {
        CPU: Quantity(len(cell.cpus)),
        MEMORY: MEMORY.quantity(max(0, cell.memory_bytes - cell.hugepage_bytes)),
    }
    for size, count in cell.hugepages.items():
        name = hugepage_resource(size)
        if name is not None:
            out[name] = name.quantity(size * 1024 * count)
    return dict(sorted(out.items(), key=lambda kv: str(kv[0])))


def host_capacity(topology: HostTopology) -> tuple[ResourceList, list[Cell]]:
    """(host capacity, cells with their capacity); host = Σ cells."""
    cells = [Cell(id=c.id, capacity=cell_capacity(c)) for c in topology.cells]
    total: ResourceList = {}
    for c in cells:
        for r, q in c.capacity.items():
            total[r] = total[r] + q if r in total else q
    return dict(sorted(total.items(), key=lambda kv: str(kv[0]))), cells
