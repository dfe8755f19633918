"""The dashboard's live picture over a real SQLite store, without a browser:
running totals equal adding every host up again after any sequence of changes
(hypothesis), the history rings stay bounded, and rows follow the store's watch."""

from __future__ import annotations

import threading
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvfleet.model import Hypervisor
from hvfleet.model.errors import NotFound
from hvfleet.model.selectors import parse_selector
from hvfleet.server.dashboard.feed import totals_document, totals_of
from hvfleet.server.dashboard.live import FleetState, HistoryLimits
from hvfleet.store import open_store
from hvfleet.store.base import Store
from hvfleet.store.ownership import agent_manager


def _host(name: str, cpu: int, used: int, az: str) -> Hypervisor:
    return Hypervisor.model_validate({
        "metadata": {"name": name, "labels": {"az": az}},
        "status": {"capacity": {"cpu": cpu, "memory": "64Gi"}, "allocation": {"cpu": used, "memory": "1Gi"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })


def _follow(state: FleetState, store: Store, since: int) -> int:
    stop = threading.Event()
    events = list(store.watch(since=since, stop=stop, timeout=0.2))
    state.apply(events)
    return events[-1].revision if events else since


change = st.tuples(st.integers(0, 5), st.integers(1, 64), st.integers(0, 80), st.sampled_from(["a", "b"]),
                   st.booleans())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(change, min_size=1, max_size=12))
def test_running_totals_equal_a_fresh_sum_after_any_changes(
        tmp_path: Path, changes: list[tuple[int, int, int, str, bool]]) -> None:
    db = tmp_path / f"live-{abs(hash(tuple(changes)))}.db"
    with open_store(f"sqlite:///{db}") as store:
        state = FleetState(store)
        since = state.load()
        for i, cpu, used, az, delete in changes:
            name = f"hv{i}"
            try:
                current = store.get_hypervisor(name)
            except NotFound:
                current = None
            if delete and current is not None:
                store.delete("Hypervisor", name)
            elif current is None:
                store.create(_host(name, cpu, used, az), agent_manager(name))
            else:
                new = _host(name, cpu, used, current.metadata.labels["az"])
                status = new.status.model_copy()
                store.update(current.model_copy(update={"status": status}), agent_manager(name))
            since = _follow(state, store, since)
        rows = state.sorted_rows()
        assert state.totals_for(parse_selector(""), rows) == totals_document(totals_of(rows))
        for az in ("a", "b"):
            members = [x for x in rows if x.labels.get("az") == az]
            if members:
                got = state.totals_for(parse_selector(""), members, ("az", az))
                assert got == totals_document(totals_of(members))
    db.unlink(missing_ok=True)


def test_history_rings_are_bounded_and_hold_the_latest_state(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path}/h.db") as store:
        state = FleetState(store, history=HistoryLimits(host_samples=3, min_gap=0.0))
        since = state.load()
        store.create(_host("hv", 8, 0, "a"), agent_manager("hv"))
        for used in range(1, 7):
            since = _follow(state, store, since)
            h = store.get_hypervisor("hv")
            status = _host("hv", 8, used, "a").status
            store.update(h.model_copy(update={"status": status}), agent_manager("hv"))
        _follow(state, store, since)
        ring = state.history["hv"]
        assert len(ring) == 3
        assert [s["allocation"]["cpu"] for s in ring] == ["4", "5", "6"]
        assert state.rows["hv"].doc["resources"]["cpu"]["allocation"] == "6"
