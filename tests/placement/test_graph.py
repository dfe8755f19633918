"""The provider graph value shared by the Placement core and the candidates
algorithm: Placement's capacity rule and the derived lookups."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hvfleet.placement.graph import MAX_INT, Inventory, Provider, ProviderGraph


@given(
    total=st.integers(1, 10**6),
    reserved=st.integers(0, 10**6),
    ratio=st.floats(0.0001, 100.0, allow_nan=False),
)
def test_capacity_is_placements_rule(total: int, reserved: int, ratio: float) -> None:
    inv = Inventory(total=total, reserved=reserved, allocation_ratio=ratio)
    assert inv.capacity == int((total - reserved) * ratio)


def test_inventory_defaults_are_placements() -> None:
    inv = Inventory(total=4)
    assert (inv.reserved, inv.min_unit, inv.max_unit, inv.step_size, inv.allocation_ratio) == (
        0, 1, MAX_INT, 1, 1.0)


def _p(uuid: str, parent: str | None, root: str, aggs: frozenset[str] = frozenset()) -> Provider:
    return Provider(uuid=uuid, name=uuid, generation=0, parent_uuid=parent, root_uuid=root,
                    inventories={}, usages={}, aggregates=aggs)


def test_graph_derives_children_trees_and_aggregates() -> None:
    g = ProviderGraph({p.uuid: p for p in [
        _p("r", None, "r", frozenset({"a"})), _p("c2", "r", "r"), _p("c1", "r", "r"),
        _p("s", None, "s", frozenset({"a", "b"})),
    ]})
    assert g.children == {"r": ("c1", "c2")}
    assert g.trees == {"r": ("c1", "c2", "r"), "s": ("s",)}
    assert g.by_aggregate == {"a": frozenset({"r", "s"}), "b": frozenset({"s"})}
