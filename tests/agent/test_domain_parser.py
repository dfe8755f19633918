"""Domain XML → demand and per-cell placement (pure parser), on fixtures, on
hostile input, and on hypothesis-generated domains."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvfleet.discovery.domains import attribute_to_cells, parse_domain
from hvfleet.discovery.host import HostTopology
from hvfleet.model.capacity import add
from hvfleet.model.errors import InvalidInput
from hvfleet.model.quantity import Quantity

from .conftest import GI, fixture_text


def q(text: str) -> Quantity:
    return Quantity.parse(text)


def test_test_driver_default_domain_counts_maximum_memory() -> None:
    d = parse_domain(fixture_text("test-default-domain.xml"))
    assert (d.name, d.uuid) == ("test", "6695eb01-f6a4-8304-79aa-97f2502e193f")
    # <memory> 8 GiB, <currentMemory> 2 GiB: the maximum counts
    assert d.resources() == {"cpu": q("2"), "memory": q("8Gi")}


def test_nova_pinned_hugepage_guest_sits_on_its_pinned_cell(two_cells: HostTopology) -> None:
    d = parse_domain(fixture_text("nova-pinned-hugepages.xml"))
    assert d.resources() == {"cpu": q("4"), "memory": q("0"), "hugepages-2Mi": q("4Gi")}
    assert attribute_to_cells(d, two_cells) == {0: {"cpu": q("4"), "hugepages-2Mi": q("4Gi")}}


def test_cells_follow_numatune_not_guest_cell_ids(two_cells: HostTopology) -> None:
    d = parse_domain(fixture_text("crossed-guest-cells-mixed-pages.xml"))
    # guest cell 0: 1 GiB of 2 MiB pages; guest cell 1: 2 GiB of 1 GiB pages
    assert d.resources() == {
        "cpu": q("4"), "memory": q("0"), "hugepages-2Mi": q("1Gi"), "hugepages-1Gi": q("2Gi"),
    }
    # guest cell 0 (vCPUs 0-1) → host node 1; guest cell 1 (vCPUs 2-3) → host node 0;
    # unpinned vCPUs follow their guest cell's memory
    assert attribute_to_cells(d, two_cells) == {
        0: {"cpu": q("2"), "hugepages-1Gi": q("2Gi")},
        1: {"cpu": q("2"), "hugepages-2Mi": q("1Gi")},
    }


def test_unpinned_guest_is_spread_evenly_and_decimal_units_are_exact(
    two_cells: HostTopology,
) -> None:
    d = parse_domain(fixture_text("unpinned-decimal-units.xml"))
    assert d.uuid == "3b5b6a5e-2c1d-4f55-9a51-0c8f1e1d2a03"  # lower-cased
    # <vcpu current='1'>3</vcpu> counts 3; <memory unit='GB'>3</memory> is 3e9 bytes
    assert d.resources() == {"cpu": q("3"), "memory": Quantity(3 * 10**9, "binary")}
    assert attribute_to_cells(d, two_cells) == {
        0: {"cpu": q("1500m"), "memory": Quantity(1_500_000_000)},
        1: {"cpu": q("1500m"), "memory": Quantity(1_500_000_000)},
    }


def test_vcpu_cpuset_straddling_cells_is_shared(two_cells: HostTopology) -> None:
    d = parse_domain(fixture_text("vcpu-cpuset-across-cells.xml"))
    # cpuset 3-4: one CPU in each cell → each vCPU half on each cell;
    # memory is not bound by numatune → spread evenly
    assert attribute_to_cells(d, two_cells) == {
        0: {"cpu": q("1"), "memory": q("512Mi")},
        1: {"cpu": q("1"), "memory": q("512Mi")},
    }


def test_per_vcpu_pin_overrides_vcpu_cpuset_and_numatune(two_cells: HostTopology) -> None:
    xml = """<domain><name>p</name><uuid>u-1</uuid><memory unit='MiB'>300</memory>
      <vcpu cpuset='4-7'>3</vcpu>
      <cputune><vcpupin vcpu='0' cpuset='0'/><vcpupin vcpu='1' cpuset='0,1,2,4'/></cputune>
      <numatune><memory nodeset='1'/></numatune></domain>"""
    d = parse_domain(xml)
    # vCPU 0 → cell 0; vCPU 1 → 3/4 cell 0, 1/4 cell 1; vCPU 2 → <vcpu cpuset> 4-7 → cell 1
    assert attribute_to_cells(d, two_cells) == {
        0: {"cpu": q("1750m")},
        1: {"cpu": q("1250m"), "memory": q("300Mi")},
    }


def test_node_ids_missing_on_the_host_fall_back_to_spreading(two_cells: HostTopology) -> None:
    xml = """<domain><name>far</name><uuid>u-2</uuid><memory unit='MiB'>2</memory><vcpu>2</vcpu>
      <numatune><memory nodeset='7'/></numatune></domain>"""
    assert attribute_to_cells(parse_domain(xml), two_cells) == {
        0: {"cpu": q("1"), "memory": q("1Mi")},
        1: {"cpu": q("1"), "memory": q("1Mi")},
    }


def test_hugepages_without_page_size_use_the_default_size() -> None:
    xml = """<domain><name>h</name><uuid>u-3</uuid><memory unit='GiB'>1</memory>
      <memoryBacking><hugepages/></memoryBacking></domain>"""
    d = parse_domain(xml)
    assert d.resources() == {"cpu": q("1"), "memory": q("0"), "hugepages-2Mi": q("1Gi")}
    assert parse_domain(xml, default_hugepage_kib=1048576).resources()["hugepages-1Gi"] == GI


@pytest.mark.parametrize(("page", "resource"), [
    ("size='32768' unit='KiB'", "hugepages-32Mi"), ("size='64' unit='KiB'", "hugepages-64Ki"),
    ("size='16' unit='MiB'", "hugepages-16Mi"), ("size='16' unit='GiB'", "hugepages-16Gi"),
])
def test_guest_memory_on_any_hugepage_size_counts_as_that_sizes_resource(
        two_cells: HostTopology, page: str, resource: str) -> None:
    """arm64's 64 KiB and 32 MiB pages, POWER's 16 MiB and 16 GiB ones: each
    counts as `hugepages-<size>`, in whole pages per host cell."""
    xml = f"""<domain><name>arm</name><uuid>u-32</uuid><memory unit='GiB'>32</memory><vcpu>2</vcpu>
      <memoryBacking><hugepages><page {page}/></hugepages></memoryBacking>
      <numatune><memory nodeset='1'/></numatune></domain>"""
    d = parse_domain(xml)
    assert d.resources() == {"cpu": q("2"), "memory": q("0"), resource: q("32Gi")}
    assert attribute_to_cells(d, two_cells) == {1: {"cpu": q("2"), resource: q("32Gi")}}


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
]>
<domain><name>&lol3;</name><uuid>x</uuid><memory>1</memory></domain>"""

XXE = """<?xml version="1.0"?>
<!DOCTYPE domain [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<domain><name>&xxe;</name><uuid>x</uuid><memory>1</memory></domain>"""


@pytest.mark.parametrize(
    ("xml", "message"),
    [
        ("<domain><name>x</name>", "malformed XML"),
        ("", "malformed XML|empty"),
        (BILLION_LAUGHS, "DOCTYPE or ENTITY"),
        (XXE, "DOCTYPE or ENTITY"),
        ("<network/>", "not <domain>"),
        ("<domain><uuid>u</uuid><memory>1</memory></domain>", "no <name>"),
        ("<domain><name>a</name><memory>1</memory></domain>", "domain 'a': no <uuid>"),
        ("<domain><name>a</name><uuid>u</uuid></domain>", "domain 'a': no <memory>"),
        ("<domain><name>a</name><uuid>u</uuid><memory unit='KiB'>-5</memory></domain>",
         "'-5' is not a whole number"),
        ("<domain><name>a</name><uuid>u</uuid><memory unit='furlong'>5</memory></domain>",
         "unknown memory unit 'furlong'"),
        ("<domain><name>a</name><uuid>u</uuid><memory>5</memory><vcpu>0</vcpu></domain>",
         "not a vCPU count"),
        ("<domain><name>a</name><uuid>u</uuid><memory>5</memory><vcpu>2</vcpu>"
         "<cputune><vcpupin vcpu='2' cpuset='0'/></cputune></domain>", "has 2 vCPUs"),
        ("<domain><name>a</name><uuid>u</uuid><memory>5</memory>"
         "<cputune><vcpupin vcpu='0' cpuset='3-1'/></cputune></domain>", "out of order"),
        ("<domain><name>a</name><uuid>u</uuid><memory>5</memory>"
         "<numatune><memory nodeset='0-99999999'/></numatune></domain>", "too large"),
        ("<domain><name>a</name><uuid>u</uuid><memory>5</memory>"
         "<numatune><memory nodeset='0,^0'/></numatune></domain>", "selects nothing"),
        ("<domain><name>a</name><uuid>u</uuid><memory>4096</memory><memoryBacking><hugepages>"
         "<page size='3072'/></hugepages></memoryBacking></domain>",
         "hugepage size 3072 KiB is not a power of two"),
    ],
)
def test_domains_the_parser_cannot_understand_are_refused_with_a_message(
    xml: str, message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_domain(xml)


def test_entity_is_not_expanded_even_when_only_referenced() -> None:
    # No DOCTYPE: an undeclared entity reference is a syntax error, not an expansion.
    with pytest.raises(InvalidInput, match="malformed XML"):
        parse_domain("<domain><name>&xxe;</name><uuid>u</uuid><memory>1</memory></domain>")


# -- hypothesis --------------------------------------------------------------------------

UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "KB": 10**3, "MB": 10**6, "b": 1, "": 2**10}
# x86's two sizes, arm64's 64 KiB and 32 MiB, POWER's 16 MiB and 16 GiB.
PAGES = {2048: "hugepages-2Mi", 1048576: "hugepages-1Gi", 64: "hugepages-64Ki", 32768: "hugepages-32Mi",
         16384: "hugepages-16Mi", 16777216: "hugepages-16Gi"}


@st.composite
def domain_specs(draw: st.DrawFn) -> dict[str, object]:
    vcpus = draw(st.integers(1, 24))
    unit = draw(st.sampled_from(sorted(UNITS)))
    amount = draw(st.integers(0, 64 * 1024))
    page = draw(st.sampled_from([None, *PAGES]))
    nodeset = draw(st.sampled_from([None, "0", "1", "0-1", "0,7"]))
    pins = draw(
        st.dictionaries(
            st.integers(0, vcpus - 1),
            st.sets(st.integers(0, 7), min_size=1, max_size=4),
            max_size=vcpus,
        )
    )
    return {"vcpus": vcpus, "unit": unit, "amount": amount, "page": page,
            "nodeset": nodeset, "pins": pins}


def render(spec: dict[str, object]) -> str:
    unit_attr = f" unit='{spec['unit']}'" if spec["unit"] else ""
    parts = ["<domain type='kvm'><name>gen</name>",
             "<uuid>00000000-0000-0000-0000-000000000001</uuid>",
             f"<memory{unit_attr}>{spec['amount']}</memory>", f"<vcpu>{spec['vcpus']}</vcpu>"]
    if spec["page"] is not None:
        parts.append(f"<memoryBacking><hugepages><page size='{spec['page']}' unit='KiB'/>"
                     "</hugepages></memoryBacking>")
    pins = spec["pins"]
    assert isinstance(pins, dict)
    if pins:
        parts.append("<cputune>" + "".join(
            f"<vcpupin vcpu='{v}' cpuset='{','.join(map(str, sorted(c)))}'/>"
            for v, c in sorted(pins.items())) + "</cputune>")
    if spec["nodeset"] is not None:
        parts.append(f"<numatune><memory mode='strict' nodeset='{spec['nodeset']}'/></numatune>")
    parts.append("</domain>")
    return "".join(parts)


@settings(max_examples=300, deadline=None)
@given(spec=domain_specs())
def test_generated_domains_count_exactly_and_cells_add_up(
    two_cells_topology: HostTopology, spec: dict[str, object]
) -> None:
    d = parse_domain(render(spec))
    vcpus, unit, amount, page = spec["vcpus"], spec["unit"], spec["amount"], spec["page"]
    pins, nodeset = spec["pins"], spec["nodeset"]
    assert isinstance(vcpus, int) and isinstance(unit, str) and isinstance(amount, int)
    assert isinstance(pins, dict)
    total = amount * UNITS[unit]
    memory_resource = "memory" if page is None else PAGES[page]  # type: ignore[index]

    # hand-computable expectation: vCPUs, and all memory under one resource
    expected = {"cpu": Quantity(vcpus), "memory": Quantity(0)}
    expected[memory_resource] = Quantity(total)
    assert d.resources() == expected

    cells = attribute_to_cells(d, two_cells_topology)
    assert set(cells) <= {0, 1}
    summed = add(cells.values())
    for r, want in expected.items():
        assert summed.get(r, Quantity(0)) == want, r
    for values in cells.values():
        for r, part in values.items():
            assert part.value > 0
            # cpu in whole millicpus, memory in whole bytes: exact decimal forms
            assert (part.value * (1000 if r == "cpu" else 1)).denominator == 1
    # every vCPU pinned only into cell 0's CPUs (0-3) → all cpu on cell 0
    if len(pins) == vcpus and all(max(c) <= 3 for c in pins.values()):
        assert cells[0]["cpu"] == vcpus
    # memory bound to node 1 (or to 1 and a node the host lacks) → all on cell 1
    if nodeset in ("1",) and total:
        assert cells[1][memory_resource] == total


@st.composite
def numa_guest_specs(draw: st.DrawFn) -> dict[str, object]:
    """Two guest NUMA cells, each with its vCPUs, GiB of memory, optional memnode
    binding to a host node, and (if hugepage-backed) its own page size."""
    cells = []
    for _ in range(2):
        cells.append({
            "vcpus": draw(st.integers(1, 8)),
            "gib": draw(st.integers(1, 8)),
            "node": draw(st.sampled_from([None, 0, 1])),
            # Sizes that divide the cell's whole GiB (a 16 GiB page would not).
            "page": draw(st.sampled_from(sorted(k for k in PAGES if k <= 1048576))),
        })
    return {"cells": cells, "hugepages": draw(st.booleans())}


def render_numa(spec: dict[str, object]) -> str:
    cells = spec["cells"]
    assert isinstance(cells, list)
    total_vcpus = sum(c["vcpus"] for c in cells)
    total_gib = sum(c["gib"] for c in cells)
    numa, memnodes, pages, first = [], [], [], 0
    for i, c in enumerate(cells):
        last = first + c["vcpus"] - 1
        numa.append(f"<cell id='{i}' cpus='{first}-{last}' memory='{c['gib']}' unit='GiB'/>")
        first = last + 1
        if c["node"] is not None:
            memnodes.append(f"<memnode cellid='{i}' mode='strict' nodeset='{c['node']}'/>")
        pages.append(f"<page size='{c['page']}' unit='KiB' nodeset='{i}'/>")
    backing = (f"<memoryBacking><hugepages>{''.join(pages)}</hugepages></memoryBacking>"
               if spec["hugepages"] else "")
    tune = f"<numatune>{''.join(memnodes)}</numatune>" if memnodes else ""
    return (f"<domain type='kvm'><name>numa</name><uuid>u-numa</uuid>"
            f"<memory unit='GiB'>{total_gib}</memory>{backing}<vcpu>{total_vcpus}</vcpu>{tune}"
            f"<cpu><numa>{''.join(numa)}</numa></cpu></domain>")


@settings(max_examples=200, deadline=None)
@given(spec=numa_guest_specs())
def test_generated_numa_guests_land_on_their_memnode_cells(
    two_cells_topology: HostTopology, spec: dict[str, object]
) -> None:
    cells = spec["cells"]
    assert isinstance(cells, list)
    # Hand computation: a bound guest cell puts its vCPUs and memory on its host
    # node; an unbound one splits both evenly (an odd number of 1 GiB pages puts
    # the extra page on host cell 0, the lower id).
    want: dict[int, dict[str, Fraction]] = {0: {}, 1: {}}

    def put(cell: int, r: str, amount: Fraction) -> None:
        want[cell][r] = want[cell].get(r, Fraction(0)) + amount

    for c in cells:
        r = PAGES[c["page"]] if spec["hugepages"] else "memory"
        size = c["gib"] * GI
        if c["node"] is not None:
            put(c["node"], "cpu", Fraction(c["vcpus"]))
            put(c["node"], r, Fraction(size))
        else:
            put(0, "cpu", Fraction(c["vcpus"], 2))
            put(1, "cpu", Fraction(c["vcpus"], 2))
            unit = c["page"] * 1024 if spec["hugepages"] else 1
            units = size // unit
            put(0, r, Fraction((units + 1) // 2 * unit))
            put(1, r, Fraction(units // 2 * unit))
    got = attribute_to_cells(parse_domain(render_numa(spec)), two_cells_topology)
    expected = {
        cell: {r: Quantity(v) for r, v in values.items() if v}
        for cell, values in want.items()
        if any(values.values())
    }
    assert got == expected


# Values libvirt would refuse, or accept in odd spellings, planted where the parser
# reads numbers, units and sets.
ODD_VALUES = ["", " ", "-1", "0", "abc", "1.5", "99999999999999999999", "0-", "^", "^0", "3-1",
              "0-65536", "1,,2", "KiB", "GiB", "furlong", "1e9", "07", "0x10", "2048"]
TARGETS = [
    ("memory", None), ("memory", "unit"), ("vcpu", None), ("vcpu", "cpuset"),
    ("cputune/vcpupin", "vcpu"), ("cputune/vcpupin", "cpuset"),
    ("numatune/memory", "nodeset"), ("numatune/memnode", "cellid"),
    ("numatune/memnode", "nodeset"), ("memoryBacking/hugepages/page", "size"),
    ("memoryBacking/hugepages/page", "unit"), ("memoryBacking/hugepages/page", "nodeset"),
    ("cpu/numa/cell", "id"), ("cpu/numa/cell", "cpus"), ("cpu/numa/cell", "memory"),
    ("cpu/numa/cell", "unit"),
]
FUZZ_BASES = ["nova-pinned-hugepages.xml", "crossed-guest-cells-mixed-pages.xml",
              "vcpu-cpuset-across-cells.xml", "unpinned-decimal-units.xml"]


@settings(max_examples=400, deadline=None)
@given(
    base=st.sampled_from(FUZZ_BASES),
    edits=st.lists(st.tuples(st.sampled_from(TARGETS), st.sampled_from(ODD_VALUES)),
                   min_size=1, max_size=4),
)
def test_mangled_domains_parse_or_are_refused_never_crash(
    two_cells_topology: HostTopology,
    base: str,
    edits: list[tuple[tuple[str, str | None], str]],
) -> None:
    from lxml import etree

    root = etree.fromstring(fixture_text(base).encode())
    for (path, attr), value in edits:
        for el in root.iterfind(path):
            if attr is None:
                el.text = value
            else:
                el.set(attr, value)
    xml = etree.tostring(root)
    try:
        d = parse_domain(xml)
    except InvalidInput as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    cells = attribute_to_cells(d, two_cells_topology)
    summed = add(cells.values())
    for r, q in d.resources().items():
        assert summed.get(r, Quantity(0)) == q


_MEMORY_ONLY_NODE = """<capabilities><host><uuid>00000000-0000-0000-0000-000000000001</uuid>
<cpu><arch>x86_64</arch></cpu><topology><cells num='2'>
 <cell id='0'><memory unit='KiB'>8388608</memory><pages unit='KiB' size='4'>2097152</pages>
   <cpus num='4'><cpu id='0'/><cpu id='1'/><cpu id='2'/><cpu id='3'/></cpus></cell>
 <cell id='1'><memory unit='KiB'>8388608</memory><pages unit='KiB' size='4'>2097152</pages>
   <cpus num='0'></cpus></cell>
</cells></topology></host></capabilities>"""


@pytest.mark.parametrize("numatune", ["", "<numatune><memory nodeset='1'/></numatune>"])
def test_a_vcpu_never_lands_on_a_memory_only_cell(numatune: str) -> None:
    """A CXL or HBM node is a NUMA cell with memory and no CPUs (`<cpus
    num='0'>`). Unpinned vCPUs were spread over it too (2 of 4 there); they
    run on CPUs, so they go to the cells that have some, even when all the
    guest's memory is bound to the memory-only one."""
    from hvfleet.discovery.host import NodeInfo, parse_host_topology

    topology = parse_host_topology(_MEMORY_ONLY_NODE, NodeInfo("x86_64", 16384, 4, 2000, 2, 1, 4, 1))
    d = parse_domain("<domain type='kvm'><name>plain</name><uuid>11111111-1111-1111-1111-111111111111"
                     f"</uuid><memory unit='GiB'>2</memory><vcpu>4</vcpu>{numatune}"
                     "<os><type>hvm</type></os></domain>")
    cells = attribute_to_cells(d, topology)
    assert cells[0]["cpu"] == q("4") and "cpu" not in cells.get(1, {})
    assert add(list(cells.values()))["memory"] == q("2Gi")
