"""`FleetTotals`, the one fleet-totals implementation: followed one host at a
time (the dashboard's live totals) it equals the totals added up anew (the
dashboard's filtered views, `hvfleet capacity`'s TOTAL row)."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from hvfleet import views
from hvfleet.model import Hypervisor, Quantity, ResourceName
from hvfleet.model.capacity import add

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
RESOURCES = [ResourceName("cpu"), ResourceName("memory"), ResourceName("vgpu")]

amounts = st.dictionaries(st.sampled_from(RESOURCES), st.integers(-10**6, 10**12), max_size=3)
hosts = st.lists(st.tuples(amounts, amounts, amounts, amounts), max_size=12)


def _host(i: int, eff: dict[ResourceName, int], alloc: dict[ResourceName, int],
          free: dict[ResourceName, int]) -> views.HostCapacity:
    q = lambda d: {r: Quantity(v) for r, v in d.items()}  # noqa: E731
    return views.HostCapacity(f"h{i}", None, q(eff), q(alloc), q(free))


def _same(a: dict[ResourceName, Quantity], b: dict[ResourceName, Quantity]) -> bool:
    return all(a.get(r, Quantity(0)) == b.get(r, Quantity(0)) for r in set(a) | set(b))


@settings(max_examples=60, deadline=None)
@given(hosts, st.data())
def test_totals_followed_host_by_host_equal_the_totals_added_up_anew(
    spec: list[tuple[dict[ResourceName, int], ...]], data: st.DataObject
) -> None:
    rows = [(_host(i, e, a, f), {r: Quantity(v) for r, v in h.items()})
            for i, (e, a, f, h) in enumerate(spec)]
    gone = data.draw(st.sets(st.integers(0, max(len(rows) - 1, 0))))
    live = views.FleetTotals()
    for x, held in rows:
        live.add(x, held)
    for i in sorted(gone):
        if i < len(rows):
            live.remove(*rows[i])
    kept = [row for i, row in enumerate(rows) if i not in gone]
    held_of = {x.name: held for x, held in kept}
    anew = views.FleetTotals.of([x for x, _ in kept], lambda x: held_of[x.name])
    for which in ("effective", "allocation", "free", "held"):
        assert _same(getattr(live, which), getattr(anew, which)), which
    assert (live.hosts, live.states) == (anew.hosts, anew.states) == (
        len(kept), {"Unknown": len(kept)} if kept else {})


def test_the_capacity_total_row_is_the_sum_of_the_hosts() -> None:
    a = Hypervisor.model_validate({"metadata": {"name": "a"}, "status": {
        "capacity": {"cpu": "8", "memory": "16Gi"}, "allocation": {"cpu": "2"}}})
    b = Hypervisor.model_validate({"metadata": {"name": "b"}, "status": {
        "capacity": {"cpu": "4", "memory": "8Gi"}, "allocation": {"memory": "1Gi"}}})
    summary = views.fleet_summary([a, b], [], {}, NOW)
    total = summary.total
    assert (total.name, total.readiness) == ("TOTAL", None)
    for which in ("effective", "allocation", "free"):
        assert getattr(total, which) == add(getattr(x, which) for x in summary.hosts)
    assert total.effective == {ResourceName("cpu"): Quantity(12),
                               ResourceName("memory"): Quantity.parse("24Gi")}
    assert views.capacity_rows(summary)[-1].cells[:4] == ["TOTAL", "", "", "2/12"]
