"""The dashboard's live picture over a real SQLite store, without a browser:
running totals equal adding every host up again after any sequence of changes
(hypothesis), changed rows are noted for the history, and rows follow the store's watch."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvfleet.model import Hypervisor
from hvfleet.model.errors import NotFound
from hvfleet.model.selectors import parse_selector
from hvfleet.server.dashboard.feed import same_figures, shown_alike, totals_document, totals_of
from hvfleet.server.dashboard.live import FleetState, Follower
from hvfleet.server.dashboard.pages.overview import overview_document
from hvfleet.server.dashboard.view import View
from hvfleet.server.watch import WatchHub, WatchLimits
from hvfleet.store import open_store
from hvfleet.store.base import Store
from hvfleet.store.ownership import agent_manager
from tests.support.loops import run_on_own_thread


def _host(name: str, cpu: int, used: int, az: str) -> Hypervisor:
    return Hypervisor.model_validate({
        "metadata": {"name": name, "labels": {"az": az}},
        "status": {"capacity": {"cpu": cpu, "memory": "64Gi"}, "allocation": {"cpu": used, "memory": "1Gi"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })


def _change(store: Store, i: int, cpu: int, used: int, az: str, delete: bool) -> None:
    """One drawn change to host hv{i}: deleted (if there), created (if not),
    else its status written as its agent would (its labels kept)."""
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
        store.update(current.model_copy(update={"status": _host(name, cpu, used, az).status}),
                     agent_manager(name))


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
            _change(store, i, cpu, used, az, delete)
            since = _follow(state, store, since)
        rows = state.sorted_rows()
        assert state.totals_for(parse_selector(""), rows) == totals_document(totals_of(rows))
        for az in ("a", "b"):
            members = [x for x in rows if x.labels.get("az") == az]
            if members:
                got = state.totals_for(parse_selector(""), members, ("az", az))
                assert got == totals_document(totals_of(members))
        # The overview of the whole fleet from the running sums (label values, their
        # totals, resources) is the one added up from every host.
        assert overview_document(state, View()) == overview_document(state, View(), frozenset(state.rows))
    db.unlink(missing_ok=True)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(change, st.booleans()), min_size=1, max_size=10))
def test_rows_left_pending_while_no_page_follows_equal_a_fresh_load(
        tmp_path: Path, steps: list[tuple[tuple[int, int, int, str, bool], bool]]) -> None:
    """With no page open, a followed write leaves its host's row to be computed
    when something reads the rows (most replicas have no dashboard open); what
    is read then, whenever it is, equals a state loaded afresh from the store."""
    db = tmp_path / f"pending-{abs(hash(tuple(steps)))}.db"
    with open_store(f"sqlite:///{db}") as store:
        state = FleetState(store)
        since = state.load()
        for (i, cpu, used, az, delete), read in steps:
            _change(store, i, cpu, used, az, delete)
            version = state._version
            events = list(store.watch(since=since, timeout=0.2))
            assert state.try_apply(events) is not None  # no page open: applied at once
            since = events[-1].revision if events else since
            assert state._version == version  # ... and no row computed for it yet
            if read:
                state.sorted_rows()
        fresh = FleetState(store)
        fresh.load()
        assert set(state.rows) == set(fresh.rows)
        for n, row in fresh.rows.items():
            assert shown_alike(state.rows[n], row) and same_figures(state.rows[n], row)
        assert state.totals_for(parse_selector(""), state.sorted_rows()) == \
            fresh.totals_for(parse_selector(""), fresh.sorted_rows())
    db.unlink(missing_ok=True)


def test_rows_are_computed_at_once_while_a_page_follows(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path}/f.db") as store:
        state = FleetState(store)
        since = state.load()
        state.listen()
        store.create(_host("hv", 8, 2, "a"), agent_manager("hv"))
        events = list(store.watch(since=since, timeout=0.2))
        assert state.try_apply(events) is None  # a page follows: computed on a worker thread
        version = state._version
        assert state.apply(events) == {"hv"}
        assert state._version > version and "hv" in state._rows


def test_a_changed_row_is_noted_for_the_history_once(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path}/h.db") as store:
        state = FleetState(store)
        since = state.load()
        state.take_touched()
        store.create(_host("hv", 8, 0, "a"), agent_manager("hv"))
        since = _follow(state, store, since)
        assert state.take_touched() == {"hv"}
        assert state.take_touched() == set()
        store.delete("Hypervisor", "hv")
        _follow(state, store, since)
        assert state.take_touched() == {"hv"}  # gone: its history goes too


def test_a_readiness_change_alone_is_not_noted_for_the_history(tmp_path: Path) -> None:
    """A host whose heartbeat ages (Ready -> Stale) changes its row but not its
    figures: the history has nothing to write (at 10k hosts, every host going
    stale at once wrote 10,000 host series per tier). The pass that finds it
    is the one after its heartbeat's fresh_until."""
    from datetime import UTC, datetime

    from hvfleet.model.readiness import DEFAULT_STALENESS

    with open_store(f"sqlite:///{tmp_path}/h.db") as store:
        beat = datetime.now(UTC) - DEFAULT_STALENESS + timedelta(seconds=1)
        h = _host("hv", 8, 1, "a")
        aged = h.status.model_copy(update={"last_heartbeat_time": beat})
        store.create(h.model_copy(update={"status": aged}), agent_manager("hv"))
        state = FleetState(store)
        state.load()
        state.take_touched()
        assert state.rows["hv"].capacity.readiness.state == "Ready"  # type: ignore[union-attr]
        version = state.version
        state._refreshed = 0.0
        assert state.fresh() == set() and state.version == version  # not stale yet
        time.sleep(1.2)
        state._refreshed = 0.0
        assert state.fresh() == {"hv"}
        assert state.rows["hv"].capacity.readiness.state == "Stale"  # type: ignore[union-attr]
        assert state.version > version  # the page redraws it ...
        assert state.take_touched() == set()  # ... and the history writes nothing
        # A second later its message says the heartbeat is a second older: not a
        # change, but a page asking for the row sees its age.
        version, said = state.version, state.rows["hv"].doc["readiness"]["message"]
        time.sleep(1.1)
        state._refreshed = 0.0
        assert state.fresh() == set() and state.version == version
        assert state.current([state.rows["hv"]])[0].doc["readiness"]["message"] != said
        doc = overview_document(state, View())
        assert doc["hosts"][0]["readiness"]["message"] != said


def test_a_pass_over_a_quiet_fleet_judges_no_host_again(tmp_path: Path) -> None:
    """Readiness moves with the clock, but a pass judges only the hosts whose
    moment came (a heartbeat turning stale, a reservation expiring) or whose
    lease changed: at 10,000 hosts a full pass every 5 s was most of an idle
    server's CPU. 2,000 fresh hosts: ten passes cost next to nothing (a full
    pass is about 40 ms here), and a host whose heartbeat then ages is found."""
    from datetime import UTC, datetime

    from hvfleet.model.readiness import DEFAULT_STALENESS

    with open_store(f"sqlite:///{tmp_path}/h.db") as store:
        state = FleetState(store)
        state.load()
        hosts = {}
        for i in range(2000):
            h = _host(f"hv{i:04d}", 8, 1, "a")
            hosts[h.name] = h.model_copy(update={"status": h.status.model_copy(
                update={"last_heartbeat_time": datetime.now(UTC)})})
        # hv0007's heartbeat turns stale in 3 s.
        stale_at = datetime.now(UTC) + timedelta(seconds=3)
        aged = hosts["hv0007"].status.model_copy(update={"last_heartbeat_time": stale_at - DEFAULT_STALENESS})
        hosts["hv0007"] = hosts["hv0007"].model_copy(update={"status": aged})
        with state.lock:
            state.hosts = hosts
            state._recompute_all(force=True)
        before = dict(state.rows)
        t0 = time.process_time()
        for _ in range(10):
            state._refreshed = 0.0
            assert state.fresh() == set()
        spent = time.process_time() - t0
        assert spent < 0.05, spent
        assert all(state.rows[n] is before[n] for n in before)
        assert state.rows["hv0007"].capacity.readiness.state == "Ready"  # type: ignore[union-attr]
        time.sleep(max(0.0, (stale_at - datetime.now(UTC)).total_seconds()) + 0.1)
        state._refreshed = 0.0
        assert state.fresh() == {"hv0007"}


def test_loading_the_fleet_again_notes_only_what_changed(tmp_path: Path) -> None:
    """A reload (a watch that lost events) recomputes every row but tells the
    pages and the history only about the hosts whose row differs."""
    with open_store(f"sqlite:///{tmp_path}/h.db") as store:
        for i in range(3):
            store.create(_host(f"hv{i}", 8, i, "a"), agent_manager(f"hv{i}"))
        state = FleetState(store)
        state.load()
        state.take_touched()
        version = state.version
        h = store.get_hypervisor("hv1")
        store.update(h.model_copy(update={"status": _host("hv1", 8, 5, "a").status}), agent_manager("hv1"))
        state.load()
        assert state.changed_since(version) == {"hv1"}
        assert state.take_touched() == {"hv1"}


def test_the_follower_loads_the_fleet_once_when_the_store_moves_during_the_first_load(tmp_path: Path) -> None:
    """Writes between the first load's list and the start of following (a token
    issued, a history point) are replayed from the watch fan-out, not answered
    by loading the fleet again (at 10k hosts, one reload per kind held the CPU
    for tens of seconds after start-up)."""
    with open_store(f"sqlite:///{tmp_path}/h.db") as store:
        store.create(_host("hv0", 8, 1, "a"), agent_manager("hv0"))
        loads: list[int] = []

        class CountingLoads(FleetState):
            def load(self) -> int:
                revision = super().load()
                loads.append(revision)
                if len(loads) == 1:  # the store moves on before the follower subscribes
                    store.create(_host("hv1", 8, 2, "b"), agent_manager("hv1"))
                return revision

        state = CountingLoads(store)
        hub = WatchHub(store, WatchLimits())

        async def follow() -> None:
            follower = Follower(state, hub)
            await follower.start()
            try:
                for _ in range(200):
                    if "hv1" in state.rows:
                        break
                    await asyncio.sleep(0.05)
            finally:
                await follower.stop()

        try:
            run_on_own_thread(follow())  # not asyncio.run: see tests/support/loops.py
        finally:
            hub.close()
        assert "hv1" in state.rows  # the write after the list came from the watch ...
        assert len(loads) == 1, loads  # ... and the fleet was listed once


def test_the_fleet_index_built_from_the_dashboards_hosts_answers_as_from_the_store(tmp_path: Path) -> None:
    """A server's first fit builds its index from the hosts its dashboard
    follows (FleetState.hosts_snapshot) instead of listing and decoding the
    fleet again; what the dashboard has not followed yet (a host changed,
    added or deleted, a reservation) is caught up from the store's watch, so
    every answer is the one of an index built from the store."""
    from datetime import UTC, datetime

    from hvfleet.scheduling.claims import reserve
    from hvfleet.scheduling.index import FleetIndex
    from hvfleet.scheduling.request import parse_request

    def beating(h: Hypervisor) -> Hypervisor:
        status = h.status.model_copy(update={"last_heartbeat_time": datetime.now(UTC)})
        return h.model_copy(update={"status": status})

    def allocate(store: Store, name: str, cpu: int) -> None:
        h = store.get_hypervisor(name)
        status = h.status.model_copy(update={"allocation": {**h.status.allocation, "cpu": cpu}})
        store.update(h.model_copy(update={"status": status}), agent_manager(name))

    with open_store(f"sqlite:///{tmp_path}/h.db") as store:
        for i in range(5):
            store.create(beating(_host(f"hv{i}", 8, i, "a")), agent_manager(f"hv{i}"))
        state = FleetState(store)
        since = state.load()
        allocate(store, "hv0", 6)
        since = _follow(state, store, since)
        state.followed("Hypervisor", since)
        # Not followed by the dashboard:
        allocate(store, "hv1", 7)
        store.create(beating(_host("hv9", 16, 0, "b")), agent_manager("hv9"))
        store.delete("Hypervisor", "hv2")
        reserve(store, "hv3", parse_request("4", None), "vm-1")
        snapshot = state.hosts_snapshot()
        assert snapshot is not None and snapshot[1] == since
        assert sorted(h.name for h in snapshot[0]) == ["hv0", "hv1", "hv2", "hv3", "hv4"]
        from_state = FleetIndex.from_store(store, hosts=snapshot)
        from_state.refresh(store)
        from_store = FleetIndex.from_store(store)
        from_store.refresh(store)
        for cpu in ("1", "2", "4", "8", "12"):
            request = parse_request(cpu, None)
            a, b = from_state.fit(request, why=True), from_store.fit(request, why=True)
            assert (a.names, a.scores, a.fitting) == (b.names, b.scores, b.fitting)
            assert a.considered == b.considered
            assert {n: [str(r) for r in rs] for n, rs in a.rejected.items()} == \
                {n: [str(r) for r in rs] for n, rs in b.rejected.items()}
        assert "hv9" in from_state.fit(parse_request("12", None)).names
        assert from_state.free("hv3") == from_store.free("hv3")


def _allocated(state: FleetState, name: str) -> int | None:
    """Host `name`'s allocated CPUs as the dashboard's state has it."""
    got = state.hosts_snapshot()
    assert got is not None
    cpu = {h.metadata.name: h.status.allocation.get("cpu") for h in got[0]}.get(name)
    return None if cpu is None else int(str(cpu))


def _write_used(store: Store, used: int) -> None:
    """hv0's status written as its agent would, `used` CPUs allocated."""
    current = store.get_hypervisor("hv0")
    store.update(current.model_copy(update={"status": _host("hv0", 8, used, "a").status}),
                 agent_manager("hv0"))


@contextlib.asynccontextmanager
async def _following(state: FleetState, hub: WatchHub) -> AsyncIterator[None]:
    """The dashboard's follower running (loaded and subscribed) in the body."""
    follower = Follower(state, hub)
    await follower.start()
    try:
        for _ in range(200):
            if state.loaded.is_set() and len(follower.tasks) > 1:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # subscribed
        yield
    finally:
        await follower.stop()


def test_a_followed_write_is_applied_without_the_event_loop_until_a_page_follows(tmp_path: Path) -> None:
    """While no page follows, the follower's events are applied on the watch
    fan-out's thread (no wake-up of the event loop per followed write): a
    write is in the state while the loop is blocked. Once a page listens, its
    events go through the loop again, which tells the page."""

    def seen_within(state: FleetState, used: int, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if _allocated(state, "hv0") == used:
                return True
            time.sleep(0.02)
        return False

    with open_store(f"sqlite:///{tmp_path}/h.db") as store:
        store.create(_host("hv0", 8, 1, "a"), agent_manager("hv0"))
        state = FleetState(store)
        hub = WatchHub(store, WatchLimits())
        seen: dict[str, bool] = {}
        told: list[set[str]] = []

        async def follow() -> None:
            async with _following(state, hub):
                # The loop blocked (this thread waits): the write still comes in.
                _write_used(store, 5)
                seen["blocked loop, no page"] = seen_within(state, 5, 5.0)
                queue = state.listen()
                _write_used(store, 6)
                # A page follows: not applied while the loop is blocked ...
                seen["blocked loop, a page"] = seen_within(state, 6, 1.0)
                # ... but once the loop runs, and the page is told.
                names = await asyncio.wait_for(queue.get(), 5.0)
                told.append(names)
                seen["loop running, a page"] = _allocated(state, "hv0") == 6
                state.unlisten(queue)

        try:
            run_on_own_thread(follow())
        finally:
            hub.close()
        assert seen == {"blocked loop, no page": True, "blocked loop, a page": False,
                        "loop running, a page": True}
        assert told == [{"hv0"}]


def test_a_busy_dashboard_never_holds_up_the_watch_fan_out(tmp_path: Path) -> None:
    """The fan-out's thread serves every watch of the kind: while something
    holds the dashboard's lock (a page being drawn), a followed write still
    reaches the other watchers at once; the dashboard takes it through its
    loop once the lock is free."""
    with open_store(f"sqlite:///{tmp_path}/h.db") as store:
        store.create(_host("hv0", 8, 1, "a"), agent_manager("hv0"))
        state = FleetState(store)
        hub = WatchHub(store, WatchLimits())
        got: dict[str, float] = {}

        async def follow() -> None:
            loop = asyncio.get_running_loop()
            async with _following(state, hub):
                fanout = hub.fanout("Hypervisor")
                sub, _, _ = fanout.subscribe(store.revision(), None, 100, loop)
                held = threading.Event()

                def hold() -> None:
                    with state.lock:
                        held.set()
                        time.sleep(2.0)

                holder = threading.Thread(target=hold)
                holder.start()
                held.wait(5)
                began = time.monotonic()
                _write_used(store, 7)
                events, _ = await sub.next_batch(5.0)
                got["watcher"] = time.monotonic() - began
                fanout.unsubscribe(sub)
                await loop.run_in_executor(None, holder.join)
                for _ in range(100):
                    if _allocated(state, "hv0") == 7:
                        got["dashboard"] = time.monotonic() - began
                        break
                    await asyncio.sleep(0.05)
                assert [e.name for e in events] == ["hv0"]

        try:
            run_on_own_thread(follow())
        finally:
            hub.close()
        assert got["watcher"] < 1.0, got  # not after the 2 s the lock was held
        assert got["dashboard"] >= 1.5, got  # applied after the lock was let go
