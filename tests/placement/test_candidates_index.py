"""The candidates index of a graph derived from an earlier one (what the
server's provider snapshot hands out after a claim, a status write or a trait
change) answers exactly as an index built whole over the same providers, and
is derived, not rebuilt, when the change is only numbers, traits or
aggregates. The served JSON text equals json.dumps of the documented body."""

from __future__ import annotations

import dataclasses
import json
import urllib.parse
from datetime import UTC, datetime
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvfleet.model.meta import ObjectMeta
from hvfleet.model.placement import PlacementInventory, ResourceProvider, ResourceProviderSpec
from hvfleet.placement import candidates
from hvfleet.placement.candidates import (
    PlacementBadRequest,
    find_candidates,
    parse_candidates_query,
    render_candidates,
    render_candidates_json,
)
from hvfleet.placement.graph import GraphBasis, Inventory, Provider, ProviderGraph
from hvfleet.placement.snapshot import ProviderSnapshot
from hvfleet.store import Store, open_store
from hvfleet.store.tokens import issue_token
from tests.placement.candidate_cases import AGGS, TRAITS, fleets, queries


def answer(graph: ProviderGraph, mv: tuple[int, int],
           params: list[tuple[str, str]]) -> tuple[int, str | bytes]:
    grouped: dict[str, list[str]] = {}
    for k, v in params:
        grouped.setdefault(k, []).append(v)
    try:
        a = find_candidates(graph, parse_candidates_query(grouped, mv))
    except PlacementBadRequest as e:
        return 400, e.detail
    text = render_candidates_json(a, mv)
    assert text == json.dumps(render_candidates(a, mv))
    return 200, text.encode()  # as the server sends it


def kept(graph: ProviderGraph, mv: tuple[int, int],
         params: list[tuple[str, str]]) -> tuple[int, str | bytes]:
    """The answer as the server makes it: the body kept with the graph's index."""
    grouped: dict[str, list[str]] = {}
    for k, v in params:
        grouped.setdefault(k, []).append(v)
    try:
        return 200, candidates.candidates_json(graph, grouped, mv)
    except PlacementBadRequest as e:
        return 400, e.detail


@st.composite
def edits(draw: st.DrawFn, graph: ProviderGraph) -> dict[str, Provider]:
    """New values for some providers: usages (a claim), inventory numbers (a
    status write), traits and aggregates; the same classes and tree."""
    out: dict[str, Provider] = {}
    for u in draw(st.lists(st.sampled_from(sorted(graph.providers)), unique=True, min_size=1, max_size=4)):
        p = graph.providers[u]
        usages = {rc: draw(st.integers(0, inv.total * 2)) for rc, inv in p.inventories.items()}
        inventories = {
            rc: dataclasses.replace(inv, total=draw(st.integers(1, 12)), reserved=0)
            if draw(st.booleans()) else inv
            for rc, inv in p.inventories.items()
        }
        traits = frozenset(draw(st.lists(st.sampled_from(TRAITS), unique=True, max_size=2)))
        if "MISC_SHARES_VIA_AGGREGATE" in p.traits:
            traits |= {"MISC_SHARES_VIA_AGGREGATE"}
        aggregates = frozenset(draw(st.lists(st.sampled_from(AGGS), unique=True, max_size=2)))
        out[u] = dataclasses.replace(p, usages=usages, inventories=inventories, traits=traits,
                                     aggregates=aggregates)
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_derived_index_answers_as_one_built_whole(data: st.DataObject) -> None:
    fleet = data.draw(fleets())
    first = fleet.graph()
    asked = [data.draw(queries(fleet)) for _ in range(4)]
    for mv, params in asked:
        # first's index exists before the change, with its bodies kept
        assert kept(first, mv, params) == answer(first, mv, params)
        assert kept(first, mv, params) == answer(first, mv, params)
    changed = data.draw(edits(first))
    providers = {u: changed.get(u, p) for u, p in first.providers.items()}
    derived = ProviderGraph(providers, GraphBasis(first, frozenset(changed)))
    whole = ProviderGraph(dict(providers))
    for mv, params in [*asked, *(data.draw(queries(fleet)) for _ in range(4))]:
        where = f"{mv} ?{urllib.parse.urlencode(params)}"
        assert answer(derived, mv, params) == answer(whole, mv, params), where
        # no body kept for `first` is served for `derived`
        assert kept(derived, mv, params) == answer(whole, mv, params), where


def _flat(n: int) -> ProviderGraph:
    out = {}
    for i in range(n):
        u = f"00000000-0000-4000-8000-{i:012d}"
        out[u] = Provider(u, f"cn{i}", 1, None, u, {"VCPU": Inventory(8), "MEMORY_MB": Inventory(4096)},
                          {"VCPU": 0})
    return ProviderGraph(out)


def test_a_claim_patches_the_index_and_a_new_provider_rebuilds_it(monkeypatch: object) -> None:
    built: list[int] = []
    real_init = candidates._Index.__init__

    def counting(self: candidates._Index, graph: ProviderGraph) -> None:
        built.append(len(graph.providers))
        real_init(self, graph)

    mp = monkeypatch  # pytest's MonkeyPatch
    mp.setattr(candidates._Index, "__init__", counting)  # type: ignore[attr-defined]
    q = parse_candidates_query({"resources": ["VCPU:8"]}, (1, 39))
    first = _flat(50)
    assert len(find_candidates(first, q).allocation_requests) == 50
    u = next(iter(first.providers))
    claimed = dataclasses.replace(first.providers[u], usages={"VCPU": 1})
    second = ProviderGraph({**first.providers, u: claimed}, GraphBasis(first, frozenset({u})))
    assert len(find_candidates(second, q).allocation_requests) == 49
    assert built == [50]  # derived: no second build
    assert second.basis is not None and second.basis.previous is None  # let go once used
    new = "00000000-0000-4000-8000-999999999999"
    third = ProviderGraph(
        {**second.providers, new: dataclasses.replace(claimed, uuid=new, root_uuid=new, usages={})},
        GraphBasis(second, frozenset({new})),
    )
    assert len(find_candidates(third, q).allocation_requests) == 50
    assert built == [50, 51]  # a provider more: built whole


def _providers(store: Store, n: int) -> list[ResourceProvider]:
    """`n` stored root providers cn0… with 4 VCPU each."""
    records = []
    for i in range(n):
        u = f"00000000-0000-4000-8000-{i:012d}"
        spec = ResourceProviderSpec(provider_name=f"cn{i}", root_uuid=u, generation=1,
                                    inventories={"VCPU": PlacementInventory(total=4)})
        records.append(store.create(ResourceProvider(metadata=ObjectMeta(name=u), spec=spec), "test"))
    return records


def test_the_snapshot_hands_out_a_graph_derived_from_the_last_one_after_a_claim(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/h.db")
    records = _providers(store, 20)
    snap = ProviderSnapshot.from_store(store)
    q = parse_candidates_query({"resources": ["VCPU:4"]}, (1, 39))
    first = snap.graph()
    assert len(find_candidates(first, q).allocation_requests) == 20
    claimed = records[7].model_copy(update={"spec": records[7].spec.model_copy(update={
        "allocations": {"c0": {"VCPU": 1}}, "generation": 2})})
    store.update(claimed, "test")
    # A write the snapshot does not follow:
    issue_token(store, "viewer", manager="test", now=datetime.now(UTC), ttl=None, name="v")
    snap.refresh(store)
    second = snap.graph()
    assert second.basis is not None and second.basis.changed == {records[7].name}
    assert list(second.providers) == list(first.providers)  # the order stays
    got = find_candidates(second, q)
    assert records[7].name not in {u for ar in got.allocation_requests for u in ar.allocations}
    assert len(got.allocation_requests) == 19
    issue_token(store, "viewer", manager="test", now=datetime.now(UTC), ttl=None, name="w")
    snap.refresh(store)
    assert snap.graph() is second  # nothing it follows changed
    store.close()


def test_a_body_is_kept_per_graph_and_a_derived_graph_makes_its_own(monkeypatch: object) -> None:
    found: list[int] = []
    real_find = candidates.find_candidates

    def counting(graph: ProviderGraph, query: candidates.CandidatesQuery, **kw: object) -> object:
        found.append(1)
        return real_find(graph, query, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(candidates, "find_candidates", counting)  # type: ignore[attr-defined]
    first = _flat(20)
    params = [("resources", "VCPU:2"), ("limit", "30")]
    body = kept(first, (1, 39), params)
    assert kept(first, (1, 39), params) is not None and len(found) == 1  # the second was kept
    assert kept(first, (1, 39), params)[1] is body[1]
    assert kept(first, (1, 38), params) == answer(first, (1, 38), params) and len(found) == 2
    u = next(iter(first.providers))
    claimed = dataclasses.replace(first.providers[u], usages={"VCPU": 7})
    second = ProviderGraph({**first.providers, u: claimed}, GraphBasis(first, frozenset({u})))
    after = kept(second, (1, 39), params)
    assert after == answer(ProviderGraph(dict(second.providers)), (1, 39), params)
    assert after != body and len(found) == 3
    assert u not in json.loads(after[1])["provider_summaries"]
    assert kept(first, (1, 39), params)[1] is body[1]  # first's own is still first's


def test_a_kept_graph_is_handed_out_only_while_the_store_is_unchanged(tmp_path: Path) -> None:
    """`kept_graph` (what the server answers a warm candidates query from on
    its event loop) is the graph `graph()` hands out while nothing was written
    to the store since the snapshot caught up, and None as soon as anything
    was, by this store or another over the same file, even a write the
    snapshot does not follow, until a refresh; None too while another thread
    holds the snapshot, and over a store without a change mark."""
    path = f"sqlite:///{tmp_path}/h.db"
    store, replica = open_store(path), open_store(path)
    records = _providers(store, 5)
    snap = ProviderSnapshot.from_store(store)
    assert snap.kept_graph(store) is None  # never caught up: no mark to trust
    snap.refresh(store)
    assert snap.kept_graph(store) is None  # no graph made yet
    first = snap.graph()
    assert snap.kept_graph(store) is first
    claimed = records[2].model_copy(update={"spec": records[2].spec.model_copy(update={
        "allocations": {"c0": {"VCPU": 1}}, "generation": 2})})
    replica.update(claimed, "test")  # another replica's claim
    assert snap.kept_graph(store) is None
    snap.refresh(store)
    assert snap.kept_graph(store) is None  # the claim is applied: a new graph is due
    second = snap.graph()
    assert second is not first and snap.kept_graph(store) is second
    issue_token(store, "viewer", manager="test", now=datetime.now(UTC), ttl=None, name="v")
    assert snap.kept_graph(store) is None  # a write it does not follow: it cannot tell
    snap.refresh(store)
    assert snap.graph() is second and snap.kept_graph(store) is second
    with snap._lock:  # another thread catching up: no waiting on the event loop
        assert snap.kept_graph(store) is None
    assert snap.kept_graph(store) is second

    class NoMark:  # etcd's answer: only a round trip tells
        def change_mark(self) -> None:
            return None

    assert snap.kept_graph(NoMark()) is None  # type: ignore[arg-type]
    replica.close()
    store.close()


@settings(max_examples=400, deadline=None)
@given(total=st.integers(0, 10**22), reserved_part=st.floats(0, 1), used=st.integers(0, 10**22),
       ratio=st.sampled_from([1.0, 0.5, 16.0, 1000.0, 3.40282e38]), max_unit=st.integers(1, 10**22),
       step=st.one_of(st.integers(1, 10**6), st.integers(1, 10**22)), amount=st.integers(1, 10**400))
def test_the_capacity_clause_holds_at_every_magnitude_a_provider_or_a_query_may_carry(
        total: int, reserved_part: float, used: int, ratio: float, max_unit: int, step: int,
        amount: int) -> None:
    """Placement's clause (used + amount <= (total - reserved) * ratio,
    amount within the units) over one provider, whatever its numbers (a
    client's inventory at Placement's largest ratio, a Hypervisor's status at
    hvfleet's bounds) and whatever a query asks: never an exception (one
    provider's numbers once made every answer of the fleet a 500), and
    exactly Placement's integer answer wherever the numbers are ones float64
    holds exactly, as Placement's SQL compares them."""
    reserved = int(total * reserved_part)
    inv = Inventory(total=total, reserved=reserved, max_unit=max_unit, step_size=step,
                    allocation_ratio=ratio)
    graph = ProviderGraph({"p": Provider(uuid="p", name="p", generation=0, parent_uuid=None, root_uuid="p",
                                         inventories={"VCPU": inv}, usages={"VCPU": used},
                                         traits=frozenset(), aggregates=frozenset())})
    got = candidates._Index(graph).with_capacity("VCPU", amount, None) == {0}
    exact = all(x < 2**53 for x in (total, used + amount, max_unit, step)) and ratio in (1.0, 0.5, 16.0)
    if exact:
        assert got == (used + amount <= (total - reserved) * ratio and 1 <= amount <= max_unit
                       and amount % step == 0)
