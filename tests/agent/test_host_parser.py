"""Host capacity from capabilities XML and node info (pure parser)."""

from __future__ import annotations

import pytest

from hvfleet.discovery.host import NodeInfo, host_capacity, parse_host_topology
from hvfleet.model.errors import InvalidInput
from hvfleet.model.quantity import Quantity

from .conftest import GI, MI, UNUSED_NODE_INFO, fixture_text, two_cell_host


def q(text: str) -> Quantity:
    return Quantity.parse(text)


def test_hugepage_pools_leave_memory_and_become_their_own_resources() -> None:
    topo = two_cell_host()
    capacity, cells = host_capacity(topo)
    # cell 0: 16 GiB with 1024 x 2 MiB pages (2 GiB) set aside
    # cell 1: 16 GiB with 512 x 2 MiB (1 GiB) and 2 x 1 GiB (2 GiB) set aside
    assert [c.id for c in cells] == [0, 1]
    assert cells[0].capacity == {
        "cpu": q("4"), "memory": q("14Gi"), "hugepages-2Mi": q("2Gi"), "hugepages-1Gi": q("0"),
    }
    assert cells[1].capacity == {
        "cpu": q("4"), "memory": q("13Gi"), "hugepages-2Mi": q("1Gi"), "hugepages-1Gi": q("2Gi"),
    }
    assert capacity == {
        "cpu": q("8"), "memory": q("27Gi"), "hugepages-2Mi": q("3Gi"), "hugepages-1Gi": q("2Gi"),
    }
    assert str(capacity["memory"]) == "27Gi"
    assert topo.source == "capabilities"
    assert topo.cells_of_cpus(frozenset({3, 4, 5})) == {0: 1, 1: 2}


def test_every_pool_size_libvirt_reports_is_its_own_resource() -> None:
    """arm64 with 4 KiB base pages: 64 KiB, 2 MiB, 32 MiB and 1 GiB pools, each
    `hugepages-<size>` as Kubernetes names it, none left in `memory`."""
    topo = parse_host_topology(fixture_text("arm64-hugepages-capabilities.xml"), UNUSED_NODE_INFO)
    capacity, cells = host_capacity(topo)
    assert capacity == {
        "cpu": q("4"), "hugepages-1Gi": q("0"), "hugepages-2Mi": q("0"), "hugepages-32Mi": q("512Mi"),
        "hugepages-64Ki": q("256Mi"), "memory": q("7424Mi"),
    }
    assert [str(k) for k in capacity] == sorted(capacity)
    assert cells[0].capacity == capacity


def test_test_default_cells_sum_to_host_and_smallest_page_is_ordinary() -> None:
    # test:///default: cell 0 = 2 GiB with 4 KiB pages, cell 1 = 4 GiB whose
    # smallest page is 8 KiB (a test-driver quirk): neither is a hugepage pool.
    node_info = NodeInfo("i686", 3072, 16, 1400, 2, 2, 2, 2)
    topo = parse_host_topology(fixture_text("test-default-capabilities.xml"), node_info)
    capacity, cells = host_capacity(topo)
    assert capacity["cpu"] == 16
    assert capacity["memory"] == 6 * GI  # cells, not node info's 3 GiB
    assert capacity["hugepages-2Mi"] == 0
    assert capacity["hugepages-1Gi"] == 0
    assert [c.capacity["memory"] for c in cells] == [2 * GI, 4 * GI]
    assert [c.capacity["cpu"] for c in cells] == [8, 8]


def test_qemu_host_capabilities_give_one_cell() -> None:
    topo = parse_host_topology(fixture_text("qemu-embed-capabilities.xml"), UNUSED_NODE_INFO)
    capacity, cells = host_capacity(topo)
    assert len(cells) == 1
    assert capacity["cpu"] == 2
    assert capacity["memory"] == 5859100 * 1024


def test_without_topology_node_info_cells_split_evenly_in_cpu_blocks() -> None:
    caps = "<capabilities><host><topology><cells num='0'></cells></topology></host></capabilities>"
    topo = parse_host_topology(caps, NodeInfo("x86_64", 3 * 1024 + 1, 10, 2000, 4, 1, 5, 2))
    assert topo.source == "nodeinfo"
    # 10 CPUs over 4 cells: 3, 3, 2, 2 in contiguous id blocks
    assert [sorted(c.cpus) for c in topo.cells] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    # 3073 MiB over 4 cells, in bytes, summing exactly
    mems = [c.memory_bytes for c in topo.cells]
    assert sum(mems) == 3073 * MI
    assert max(mems) - min(mems) <= 1


@pytest.mark.parametrize(
    ("xml", "message"),
    [
        ("<capabilities><host>", "malformed XML"),
        ("<domain/>", "not <capabilities>"),
        (
            "<capabilities><host><topology><cells><cell id='0'><cpus/></cell>"
            "</cells></topology></host></capabilities>",
            "cell 0: no <memory>",
        ),
        (
            "<capabilities><host><topology><cells><cell id='x'/></cells></topology></host>"
            "</capabilities>",
            "cell id 'x'",
        ),
        (
            "<capabilities><host><topology><cells><cell id='0'><memory unit='parsec'>1</memory>"
            "</cell></cells></topology></host></capabilities>",
            "unknown memory unit 'parsec'",
        ),
        (
            "<!DOCTYPE capabilities [<!ENTITY x 'y'>]><capabilities>&x;</capabilities>",
            "DOCTYPE or ENTITY",
        ),
    ],
)
def test_broken_capabilities_are_refused_with_a_message(xml: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_host_topology(xml, UNUSED_NODE_INFO)
