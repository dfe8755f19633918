"""The resource-provider graph as Placement sees it: providers (hypervisors
and stored providers alike), their inventories, usages, traits and
aggregates. A value, built by the placement core from the store and the fleet
index, read by `placement.candidates` to answer `GET /allocation_candidates`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

# Placement's database integer bound: the default max_unit and the largest
# value any inventory field may take.
MAX_INT = 2147483647


@dataclass(frozen=True, slots=True)
class Inventory:
    total: int
    reserved: int = 0
    min_unit: int = 1
    max_unit: int = MAX_INT
    step_size: int = 1
    allocation_ratio: float = 1.0

    @property
    def capacity(self) -> int:
        """What may be allocated in all: Placement's rule
        `int((total - reserved) * allocation_ratio)`."""
        return int((self.total - self.reserved) * self.allocation_ratio)


@dataclass(frozen=True, slots=True)
class Provider:
    uuid: str
    name: str
    generation: int
    parent_uuid: str | None
    root_uuid: str
    inventories: Mapping[str, Inventory]  # resource class -> inventory
    usages: Mapping[str, int]  # resource class -> used (sum of allocations)
    traits: frozenset[str] = frozenset()
    aggregates: frozenset[str] = frozenset()  # aggregate uuids


class GraphBasis:
    """What a graph was derived from: `previous`, a graph of the same
    providers in the same order, equal to this one but for the providers in
    `changed` (uuids). The candidates index of `previous` is then patched for
    those providers instead of being built again (hvfleet.placement.candidates);
    `previous` is let go once that is done, so graphs never chain."""

    __slots__ = ("changed", "previous")

    def __init__(self, previous: ProviderGraph | None, changed: frozenset[str]) -> None:
        self.previous = previous
        self.changed = changed


@dataclass(frozen=True)
class ProviderGraph:
    """Derived lookups (children, trees, aggregates) are computed once per
    graph, on first use."""

    providers: Mapping[str, Provider]  # by uuid
    basis: GraphBasis | None = field(default=None, compare=False, repr=False)

    @cached_property
    def children(self) -> Mapping[str, tuple[str, ...]]:
        """Child provider uuids by parent uuid (sorted, so answers are stable)."""
        out: dict[str, list[str]] = {}
        for p in self.providers.values():
            if p.parent_uuid is not None:
                out.setdefault(p.parent_uuid, []).append(p.uuid)
        return {k: tuple(sorted(v)) for k, v in out.items()}

    @cached_property
    def trees(self) -> Mapping[str, tuple[str, ...]]:
        """Every provider uuid of a tree, by root uuid."""
        out: dict[str, list[str]] = {}
        for p in self.providers.values():
            out.setdefault(p.root_uuid, []).append(p.uuid)
        return {k: tuple(sorted(v)) for k, v in out.items()}

    @cached_property
    def by_aggregate(self) -> Mapping[str, frozenset[str]]:
        """Provider uuids by aggregate uuid."""
        out: dict[str, set[str]] = {}
        for p in self.providers.values():
            for agg in p.aggregates:
                out.setdefault(agg, set()).add(p.uuid)
        return {k: frozenset(v) for k, v in out.items()}
