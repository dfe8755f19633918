"""The fleets and queries the allocation-candidates tests draw (hypothesis):
compute nodes with nested children two levels deep, sharing providers with
MISC_SHARES_VIA_AGGREGATE, aggregates, traits, inventories with reserves,
ratios, min/max units and steps, allocations that fit; queries at random
microversions 1.10–1.39 with every query feature and some malformed ones.
Shared by the differential against real Placement and the index tests."""

from __future__ import annotations

import os_resource_classes
import os_traits
from hypothesis import strategies as st

from hvfleet.placement.graph import Inventory
from tests.placement.inprocess_placement import Fleet, ProviderSpec

AGGS = [f"aaaaaaaa-0000-4000-8000-00000000000{i}" for i in range(3)]
TRAITS = ["CUSTOM_T1", "CUSTOM_T2", "CUSTOM_T3", "HW_CPU_X86_AVX2"]
CLASSES = ["VCPU", "MEMORY_MB", "DISK_GB", "SRIOV_NET_VF", "CUSTOM_MAGIC"]
KNOWN_CLASSES = frozenset(os_resource_classes.STANDARDS) | {"CUSTOM_MAGIC"}
KNOWN_TRAITS = frozenset(os_traits.get_traits()) | {"CUSTOM_T1", "CUSTOM_T2", "CUSTOM_T3"}
VERSIONS = [(1, m) for m in (10, 12, 16, 17, 21, 22, 24, 25, 27, 28, 29, 31, 32, 33, 34, 35, 36, 38, 39)]


def _uuid(kind: int, n: int) -> str:
    return f"{kind:08x}-0000-4000-8000-{n:012d}"


@st.composite
def inventories(draw: st.DrawFn, classes: list[str]) -> dict[str, Inventory]:
    out = {}
    for rc in draw(st.lists(st.sampled_from(classes), unique=True, max_size=3)):
        total = draw(st.integers(1, 12))
        reserved = draw(st.sampled_from([0, 0, 0, 1, total]))
        out[rc] = Inventory(
            total=total,
            reserved=reserved,
            min_unit=draw(st.sampled_from([1, 1, 1, 2])),
            max_unit=draw(st.sampled_from([total, total, max(1, total // 2), 2147483647])),
            step_size=draw(st.sampled_from([1, 1, 1, 2])),
            allocation_ratio=draw(st.sampled_from([1.0, 1.0, 2.0, 0.5, 1.5])),
        )
    return out


@st.composite
def fleets(draw: st.DrawFn) -> Fleet:
    providers: list[ProviderSpec] = []
    n = 0

    def add(parent: str | None, classes: list[str], depth: int) -> None:
        nonlocal n
        n += 1
        u = _uuid(1, n)
        providers.append(
            ProviderSpec(
                uuid=u,
                name=f"rp{n}",
                parent=parent,
                inventories=draw(inventories(classes)),
                traits=frozenset(draw(st.lists(st.sampled_from(TRAITS), unique=True, max_size=2))),
                aggregates=frozenset(draw(st.lists(st.sampled_from(AGGS), unique=True, max_size=2)))
                if parent is None or draw(st.booleans())
                else frozenset(),
            )
        )
        if depth < 2:
            for _ in range(draw(st.integers(0, 2 if depth == 0 else 1))):
                add(u, ["VCPU", "MEMORY_MB", "SRIOV_NET_VF", "CUSTOM_MAGIC"], depth + 1)

    for _ in range(draw(st.integers(1, 4))):
        add(None, CLASSES, 0)
    for _ in range(draw(st.integers(0, 2))):
        n += 1
        providers.append(
            ProviderSpec(
                uuid=_uuid(2, n),
                name=f"ss{n}",
                parent=None,
                inventories=draw(inventories(["DISK_GB", "CUSTOM_MAGIC"])),
                traits=frozenset({"MISC_SHARES_VIA_AGGREGATE"})
                | frozenset(draw(st.lists(st.sampled_from(TRAITS), unique=True, max_size=1))),
                aggregates=frozenset(draw(st.lists(st.sampled_from(AGGS), unique=True, max_size=2))),
            )
        )
    fleet = Fleet(providers)
    # Allocations that fit: one unit-valid amount per chosen inventory.
    for _ in range(draw(st.integers(0, 3))):
        p = draw(st.sampled_from(providers))
        if not p.inventories:
            continue
        rc = draw(st.sampled_from(sorted(p.inventories)))
        inv = p.inventories[rc]
        used = sum(a.get(p.uuid, {}).get(rc, 0) for a in fleet.allocations)
        room = int((inv.total - inv.reserved) * inv.allocation_ratio) - used
        amount = min(room, inv.max_unit) // inv.step_size * inv.step_size
        if amount >= max(inv.min_unit, 1):
            fleet.allocations.append({p.uuid: {rc: amount}})
    return fleet


@st.composite
def queries(draw: st.DrawFn, fleet: Fleet) -> tuple[tuple[int, int], list[tuple[str, str]]]:
    mv = draw(st.sampled_from(VERSIONS))
    params: list[tuple[str, str]] = []
    granular = mv >= (1, 25)

    def resources() -> str:
        picked = draw(st.lists(st.sampled_from(CLASSES), unique=True, min_size=1, max_size=3))
        return ",".join(f"{rc}:{draw(st.sampled_from([1, 1, 2, 3, 4, 8]))}" for rc in picked)

    def traits_value() -> str:
        if mv >= (1, 39) and draw(st.integers(0, 4)) == 0:
            any_of = draw(st.lists(st.sampled_from(TRAITS), unique=True, min_size=1, max_size=2))
            return "in:" + ",".join(any_of)
        names = draw(st.lists(st.sampled_from(TRAITS), unique=True, min_size=1, max_size=2))
        if mv >= (1, 22):
            names = [("!" + t if draw(st.integers(0, 3)) == 0 else t) for t in names]
        return ",".join(names)

    def member_of_value() -> str:
        roll = draw(st.integers(0, 5))
        if roll == 0 and mv >= (1, 32):
            return "!" + draw(st.sampled_from(AGGS))
        if roll == 1:
            any_of = draw(st.lists(st.sampled_from(AGGS), unique=True, min_size=1, max_size=2))
            return "in:" + ",".join(any_of)
        return draw(st.sampled_from(AGGS))

    def group(suffix: str, resourceless: bool = False) -> None:
        if not resourceless:
            params.append((f"resources{suffix}", resources()))
        if mv >= (1, 17) and (resourceless or draw(st.integers(0, 2)) == 0):
            params.append((f"required{suffix}", traits_value()))
        if mv >= (1, 21) and draw(st.integers(0, 3)) == 0:
            params.append((f"member_of{suffix}", member_of_value()))
        if mv >= (1, 31) and draw(st.integers(0, 5)) == 0:
            p = draw(st.sampled_from(fleet.providers))
            params.append((f"in_tree{suffix}", p.uuid))

    if not granular or draw(st.integers(0, 4)) > 0:
        group("")
    suffixes: list[str] = []
    if granular:
        for i in range(draw(st.integers(0 if params else 1, 2))):
            suffix = f"_G{i}" if mv >= (1, 33) and draw(st.booleans()) else str(i + 1)
            group(suffix)
            suffixes.append(suffix)
        if mv >= (1, 36) and suffixes and draw(st.integers(0, 2)) == 0:
            resourceless = "_R" if mv >= (1, 33) else "9"
            group(resourceless, resourceless=True)
            params.append(("same_subtree", ",".join([*suffixes[:1], resourceless])))
            suffixes.append(resourceless)
        elif mv >= (1, 36) and len(suffixes) > 1 and draw(st.booleans()):
            params.append(("same_subtree", ",".join(suffixes)))
        if (len(suffixes) > 1 or draw(st.integers(0, 3)) == 0) and draw(st.integers(0, 9)) > 0:
            params.append(("group_policy", draw(st.sampled_from(["none", "isolate"]))))
    if mv >= (1, 35) and draw(st.integers(0, 4)) == 0:
        params.append(("root_required", traits_value().replace("in:", "")))
    if mv >= (1, 16) and draw(st.integers(0, 4)) == 0:
        params.append(("limit", str(draw(st.integers(1, 3)))))
    roll = draw(st.integers(0, 19))
    if roll == 0:  # malformed or unknown input
        params.append(
            draw(
                st.sampled_from(
                    [
                        ("resources", "VCPU:0"),
                        ("resources", "VCPU"),
                        ("resources", "CUSTOM_NOPE:1"),
                        ("required", "CUSTOM_NOPE"),
                        ("limit", "0"),
                        ("group_policy", "bogus"),
                        ("member_of", "not-a-uuid"),
                        ("in_tree", "nope"),
                        ("bogus", "1"),
                    ]
                )
            )
        )
    return mv, params
