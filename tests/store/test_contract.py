"""The Store contract, run against every backend (see conftest.STORE_BACKENDS)."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from tests.store.hosts import ready_host

from hvfleet.model import (
    AlreadyExists,
    Forbidden,
    Hypervisor,
    InvalidInput,
    NotFound,
    Quantity,
    Reservation,
)
from hvfleet.model.resources import ResourceName
from hvfleet.scheduling.claims import claim_reservation, new_reservation, reserve
from hvfleet.scheduling.errors import DoesNotFit
from hvfleet.scheduling.request import Request
from hvfleet.store import Store, open_store
from hvfleet.store.base import OwnershipConflict, StaleVersion, Write

MakeHv = Callable[..., Hypervisor]
CPU = ResourceName.parse("cpu")


def reservation(name: str, host: str, cpu: int = 1) -> Reservation:
    return Reservation.model_validate(
        {
            "metadata": {"name": name},
            "spec": {"hypervisor": host, "resources": {"cpu": cpu}, "consumer": f"uuid-{name}"},
        }
    )


def test_create_sets_identity_and_get_returns_it(store: Store, make_hypervisor: MakeHv) -> None:
    created = store.create(make_hypervisor("hv1", metadata={"labels": {"az": "a"}}), "operator")
    assert created.metadata.uid
    assert created.metadata.creation_timestamp is not None
    assert created.metadata.generation == 1
    assert created.metadata.resource_version
    got = store.get("Hypervisor", "hv1")
    assert got == created
    assert store.get("hypervisors", "hv1") == created


def test_create_twice_is_refused(store: Store, make_hypervisor: MakeHv) -> None:
    store.create(make_hypervisor("hv1"), "operator")
    with pytest.raises(AlreadyExists, match="hv1"):
        store.create(make_hypervisor("hv1"), "operator")


def test_get_and_delete_of_missing_object_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound, match="nope"):
        store.get("Hypervisor", "nope")
    with pytest.raises(NotFound):
        store.delete("Hypervisor", "nope")


def test_list_filters_by_label_selector(store: Store, make_hypervisor: MakeHv) -> None:
    for name, labels in [
        ("a1", {"az": "a", "gen": "skylake"}),
        ("a2", {"az": "a", "gen": "icelake"}),
        ("b1", {"az": "b", "gen": "icelake", "gpu": "yes"}),
        ("c1", {"az": "c"}),
    ]:
        store.create(make_hypervisor(name, metadata={"labels": labels}), "operator")

    def names(sel: str | None) -> list[str]:
        return [h.name for h in store.list_hypervisors(sel)]

    assert names(None) == ["a1", "a2", "b1", "c1"]
    assert names("az=a") == ["a1", "a2"]
    assert names("az!=a") == ["b1", "c1"]
    assert names("gen in (icelake, skylake)") == ["a1", "a2", "b1"]
    assert names("gen notin (icelake)") == ["a1", "c1"]
    assert names("gpu") == ["b1"]
    assert names("!gpu,az in (b,c)") == ["c1"]
    assert names("az=a,gen=icelake") == ["a2"]
    with pytest.raises(InvalidInput, match="selector"):
        store.list("Hypervisor", "az in (")


def test_update_is_compare_and_swap(store: Store, make_hypervisor: MakeHv) -> None:
    v1 = store.create(make_hypervisor("hv1"), "operator")
    v2 = store.update(
        v1.model_copy(update={"spec": v1.spec.model_copy(update={"overcommit": {"cpu": 2.0}})}),
        "operator",
    )
    assert int(v2.metadata.resource_version or 0) > int(v1.metadata.resource_version or 0)
    assert v2.metadata.generation == 2
    stale = v1.model_copy(update={"spec": v1.spec.model_copy(update={"overcommit": {"cpu": 9.0}})})
    with pytest.raises(StaleVersion, match="stale"):
        store.update(stale, "operator")
    assert store.get_hypervisor("hv1").spec.overcommit == {"cpu": 2.0}


def test_update_without_resource_version_is_invalid(store: Store, make_hypervisor: MakeHv) -> None:
    store.create(make_hypervisor("hv1"), "operator")
    with pytest.raises(InvalidInput, match="resourceVersion"):
        store.update(make_hypervisor("hv1"), "operator")


def test_generation_moves_with_spec_not_labels(store: Store, make_hypervisor: MakeHv) -> None:
    v1 = store.create(make_hypervisor("hv1"), "operator")
    meta = v1.metadata.model_copy(update={"labels": {"az": "x"}})
    v2 = store.update(v1.model_copy(update={"metadata": meta}), "operator")
    assert v2.metadata.generation == 1
    assert v2.metadata.labels == {"az": "x"}


def test_delete_with_stale_version_keeps_the_object(store: Store, make_hypervisor: MakeHv) -> None:
    v1 = store.create(make_hypervisor("hv1"), "operator")
    store.update(v1.model_copy(update={"metadata": v1.metadata.model_copy(
        update={"labels": {"x": "y"}})}), "operator")
    with pytest.raises(StaleVersion):
        store.delete("Hypervisor", "hv1", v1.metadata.resource_version)
    store.get("Hypervisor", "hv1")
    store.delete("Hypervisor", "hv1")
    with pytest.raises(NotFound):
        store.get("Hypervisor", "hv1")


def _set_ratio(h: Hypervisor, resource: str, ratio: float) -> Hypervisor:
    oc = dict(h.spec.overcommit)
    oc[resource] = ratio  # type: ignore[index]
    return h.model_copy(update={"spec": h.spec.model_copy(update={"overcommit": oc})})


def _apply_ratio(store: Store, name: str, resource: str, ratio: float, manager: str,
                 force: bool = False) -> Hypervisor:
    """A person's edit, written as an apply (as the CLI's and the dashboard's are)."""
    return store.update_hypervisor(name, lambda h: _set_ratio(h, resource, ratio), manager,
                                   force=force, as_apply=True)


def test_an_apply_of_a_field_another_manager_owns_conflicts(
        store: Store, make_hypervisor: MakeHv) -> None:
    store.create(make_hypervisor("hv1"), "operator")
    store.update_hypervisor("hv1", lambda h: _set_ratio(h, "cpu", 4.0), "cortex")
    with pytest.raises(OwnershipConflict) as conflict:
        _apply_ratio(store, "hv1", "cpu", 2.0, "operator")
    assert conflict.value.conflicts == [("spec.overcommit.cpu", "cortex")]
    assert store.get_hypervisor("hv1").spec.overcommit["cpu"] == 4.0  # type: ignore[index]
    # A field nobody owns is free to take, and the owner can change its own field.
    _apply_ratio(store, "hv1", "memory", 1.5, "operator")
    _apply_ratio(store, "hv1", "cpu", 3.0, "cortex")
    # Forcing moves ownership.
    h = _apply_ratio(store, "hv1", "cpu", 2.0, "operator", force=True)
    owners = {(e.manager, e.operation): e.fields_v1 for e in h.metadata.managed_fields}
    assert owners[("operator", "Apply")] == {"f:spec": {"f:overcommit": {"f:cpu": {}, "f:memory": {}}}}
    assert [m for m, _ in owners] == ["operator"]
    with pytest.raises(OwnershipConflict, match="operator"):
        _apply_ratio(store, "hv1", "cpu", 8.0, "cortex")


def test_an_update_of_a_field_another_manager_owns_succeeds_and_takes_it(
        store: Store, make_hypervisor: MakeHv) -> None:
    """As in Kubernetes: conflicts are for apply; an update (PUT, patch, edit)
    takes ownership of exactly what it changes, from every other entry."""
    store.create(make_hypervisor("hv1"), "operator")
    _apply_ratio(store, "hv1", "cpu", 4.0, "cortex")
    _apply_ratio(store, "hv1", "memory", 2.0, "cortex")
    h = store.update_hypervisor("hv1", lambda h: _set_ratio(h, "cpu", 2.0), "operator")
    assert h.spec.overcommit == {"cpu": 2.0, "memory": 2.0}
    owners = {(e.manager, e.operation): e.fields_v1 for e in h.metadata.managed_fields}
    assert owners == {
        ("cortex", "Apply"): {"f:spec": {"f:overcommit": {"f:memory": {}}}},
        ("operator", "Update"): {"f:spec": {"f:overcommit": {"f:cpu": {}}}},
    }


def test_status_is_written_only_by_the_hosts_agent(store: Store, make_hypervisor: MakeHv) -> None:
    store.create(make_hypervisor("hv1"), "operator")

    def with_capacity(h: Hypervisor) -> Hypervisor:
        status = h.status.model_copy(update={"capacity": {"cpu": Quantity(8)}})
        return h.model_copy(update={"status": status})

    with pytest.raises(Forbidden, match="agent/hv1"):
        store.update_hypervisor("hv1", with_capacity, "operator")
    with pytest.raises(Forbidden):
        store.update_hypervisor("hv1", with_capacity, "agent/hv2")
    h = store.update_hypervisor("hv1", with_capacity, "agent/hv1")
    assert h.status.capacity == {"cpu": 8}
    with pytest.raises(Forbidden, match="agents do not write spec"):
        store.update_hypervisor("hv1", lambda h: _set_ratio(h, "cpu", 2.0), "agent/hv1")


def test_status_in_a_create_by_a_non_agent_is_ignored(store: Store, make_hypervisor: MakeHv) -> None:
    h = store.create(make_hypervisor("hv1", status={"capacity": {"cpu": 99}}), "operator")
    assert h.status.capacity == {}
    h2 = store.create(make_hypervisor("hv2", status={"capacity": {"cpu": 4}}), "agent/hv2")
    assert h2.status.capacity == {"cpu": 4}


def test_watch_delivers_every_event_in_order(store: Store, make_hypervisor: MakeHv) -> None:
    start = store.revision()
    store.create(make_hypervisor("hv1"), "operator")
    store.update_hypervisor("hv1", lambda h: _set_ratio(h, "cpu", 2.0), "operator")
    store.create(make_hypervisor("hv2"), "operator")
    store.delete("Hypervisor", "hv1")
    store.keepalive("hv2", 30)  # an event of another kind (a Lease)
    events = list(store.watch("Hypervisor", since=start, timeout=1.0))
    assert [(e.type, e.object.metadata.name) for e in events] == [
        ("ADDED", "hv1"), ("MODIFIED", "hv1"), ("ADDED", "hv2"), ("DELETED", "hv1"),
    ]
    revs = [e.revision for e in events]
    assert revs == sorted(revs) and len(set(revs)) == len(revs)
    # Resuming after any event yields exactly the rest.
    rest = list(store.watch("Hypervisor", since=revs[1], timeout=1.0))
    assert [e.revision for e in rest] == revs[2:]
    all_kinds = list(store.watch(None, since=start, timeout=1.0))
    assert [(e.object.kind, e.type) for e in all_kinds] == [
        ("Hypervisor", "ADDED"), ("Hypervisor", "MODIFIED"), ("Hypervisor", "ADDED"),
        ("Hypervisor", "DELETED"), ("Lease", "ADDED")]
    assert [e.revision for e in all_kinds] == sorted(e.revision for e in all_kinds)


def test_watch_objects_streams_every_stored_kind_up_to_the_stores_revision(
        store: Store, make_hypervisor: MakeHv) -> None:
    """One stream of the public kinds and the others (a Placement record
    here): a reader catching up to `store.revision()` finds that revision's
    event in it, whatever kind was written last. The remote store has none."""
    from hvfleet.model.meta import ObjectMeta
    from hvfleet.model.placement import PlacementName, PlacementNameSpec

    start = store.revision()
    try:
        store.watch_objects(start, timeout=0.1)
    except NotImplementedError:
        assert store.url.startswith("https://")
        return
    store.create(make_hypervisor("hv1"), "operator")
    store.keepalive("hv1", 30)
    store.create(PlacementName(metadata=ObjectMeta(name="trait.custom-x"), spec=PlacementNameSpec(
        of="trait", placement_name="CUSTOM_X", created_at="t", updated_at="t")), "placement")
    events = list(store.watch_objects(start, timeout=0.5))
    assert [(e.object.kind, e.type) for e in events] == [
        ("Hypervisor", "ADDED"), ("Lease", "ADDED"), ("PlacementName", "ADDED")]
    assert [e.revision for e in events] == sorted(e.revision for e in events)
    assert events[-1].revision == store.revision() and events[-1].last_of_revision
    assert [e.object.kind for e in store.watch_objects(events[0].revision, timeout=0.3)] == [
        "Lease", "PlacementName"]


def test_watch_events_tell_the_objects_previous_state(store: Store, make_hypervisor: MakeHv) -> None:
    """Each event carries the object as it was just before it (a label-selected
    watch needs it to tell an object leaving its selection from one never in
    it), or says the backend cannot tell (only the remote one, whose API sends
    no previous states)."""
    start = store.revision()
    made = store.create(make_hypervisor("hv1"), "operator")
    relabelled = store.update(made.model_copy(update={"metadata": made.metadata.model_copy(
        update={"labels": {"rack": "b"}})}), "operator")
    store.delete("Hypervisor", "hv1")
    events = list(store.watch("Hypervisor", since=start, timeout=0.5))
    assert [e.type for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert events[0].knows_previous and events[0].previous() is None
    if not events[1].knows_previous:
        assert store.url.startswith("https://")
        return
    assert events[1].previous() == made
    assert events[2].previous() == relabelled
    # Resumed from between the writes: the same previous states.
    (deleted,) = store.watch("Hypervisor", since=events[1].revision, timeout=0.3)
    assert deleted.previous() == relabelled


def test_watch_by_name_sees_only_that_object(store: Store, make_hypervisor: MakeHv) -> None:
    start = store.revision()
    for name in ("hv1", "hv10", "hv2"):  # hv10 shares hv1's prefix
        store.create(make_hypervisor(name), "operator")
    store.update_hypervisor("hv1", lambda h: _set_ratio(h, "cpu", 2.0), "operator")
    store.delete("Hypervisor", "hv10")
    events = list(store.watch("Hypervisor", since=start, name="hv1", timeout=0.5))
    assert [(e.type, e.object.metadata.name) for e in events] == [("ADDED", "hv1"), ("MODIFIED", "hv1")]
    with pytest.raises(InvalidInput, match="needs a kind"):
        list(store.watch(None, since=start, name="hv1", timeout=0.1))


def test_watch_from_list_revision_sees_later_writes(store: Store, make_hypervisor: MakeHv) -> None:
    store.create(make_hypervisor("hv1"), "operator")
    listed = store.list("Hypervisor")
    seen: list[str] = []
    stop = threading.Event()

    def consume() -> None:
        for e in store.watch("Hypervisor", since=listed.revision, stop=stop, timeout=5):
            seen.append(e.object.metadata.name)
            if len(seen) == 2:
                stop.set()

    t = threading.Thread(target=consume)
    t.start()
    store.create(make_hypervisor("hv2"), "operator")
    store.create(make_hypervisor("hv3"), "operator")
    t.join(10)
    assert seen == ["hv2", "hv3"]


def test_claim_writes_only_when_the_check_passes(store: Store) -> None:
    # Through the scheduler's own claim (the check every backend runs the same
    # way; a remote store's server runs it itself).
    ready_host(store, "hv1", cpu=4)
    first = reserve(store, "hv1", Request({CPU: Quantity(3)}), "vm-1")
    assert first.status.phase == "Active" and first.spec.hypervisor == "hv1"
    with pytest.raises(DoesNotFit, match="cpu"):
        reserve(store, "hv1", Request({CPU: Quantity(2)}), "vm-2")
    assert [r.name for r in store.list_reservations()] == [first.name]
    second = reserve(store, "hv1", Request({CPU: Quantity(1)}), "vm-2")
    assert sorted(r.name for r in store.list_reservations()) == sorted([first.name, second.name])
    with pytest.raises(NotFound):
        reserve(store, "missing", Request({CPU: Quantity(1)}), "vm-3")


def test_dry_runs_check_as_the_writes_do_and_write_nothing(store: Store, make_hypervisor: MakeHv) -> None:
    made = store.create(make_hypervisor("hv1"), "operator")
    ready_host(store, "hv3", cpu=4)
    at = store.revision()
    planned = store.dry_run(Write("create", make_hypervisor("hv2")), "operator")
    assert planned.metadata.resource_version is None and planned.metadata.generation == 1
    with pytest.raises(AlreadyExists):
        store.dry_run(Write("create", make_hypervisor("hv1")), "operator")
    changed = _set_ratio(made, "cpu", 2.0)
    planned = store.dry_run(Write("update", changed), "operator")
    assert planned.metadata.resource_version == made.metadata.resource_version
    assert planned.metadata.generation == 2 and planned.spec.overcommit == changed.spec.overcommit
    with pytest.raises(NotFound):
        store.dry_run(Write("update", changed.model_copy(update={"metadata": changed.metadata.model_copy(
            update={"name": "nope"})})), "operator")
    assert store.revision() == at
    real = store.update(changed, "operator")
    assert real.model_copy(update={"metadata": real.metadata.model_copy(update={
        "resource_version": planned.metadata.resource_version,
        "managed_fields": planned.metadata.managed_fields})}) == planned
    at = store.revision()
    with pytest.raises(StaleVersion):
        store.dry_run(Write("update", _set_ratio(made, "cpu", 3.0)), "operator")
    with pytest.raises(OwnershipConflict):
        store.dry_run(Write("update", _set_ratio(real, "cpu", 3.0),
                            frozenset({("spec", "overcommit", "cpu")})), "someone-else")
    status = real.status.model_copy(update={"capacity": {CPU: Quantity(8)}})
    with pytest.raises(Forbidden):
        store.dry_run(Write("update", real.model_copy(update={"status": status})), "operator")
    assert store.dry_run_delete("Hypervisor", "hv1") == real
    with pytest.raises(StaleVersion):
        store.dry_run_delete("Hypervisor", "hv1", made.metadata.resource_version)
    with pytest.raises(NotFound):
        store.dry_run_delete("Hypervisor", "nope")
    # A claim's dry run: would it fit?
    def reservation(name: str, cpu: int) -> Reservation:
        return new_reservation("hv3", Request({CPU: Quantity(cpu)}), name, None, datetime.now(UTC))
    fits = claim_reservation(store, reservation("vm-1", 3), "scheduler", dry_run=True)
    assert fits.status.phase == "Active" and fits.metadata.resource_version is None
    with pytest.raises(DoesNotFit, match="cpu"):
        claim_reservation(store, reservation("vm-2", 5), "scheduler", dry_run=True)
    assert store.revision() == at and store.list_reservations() == []


def _increment(url: str, n: int) -> None:
    store = open_store(url)
    for _ in range(n):
        def bump(h: Hypervisor) -> Hypervisor:
            count = int(h.metadata.annotations.get("count", "0")) + 1
            meta = h.metadata.model_copy(update={"annotations": {"count": str(count)}})
            return h.model_copy(update={"metadata": meta})

        store.update_hypervisor("counter", bump, "incrementer")
    store.close()


@pytest.mark.timeout(240)
def test_concurrent_read_modify_write_loses_no_update(
    store: Store, store_url: str, make_hypervisor: MakeHv
) -> None:
    store.create(make_hypervisor("counter"), "operator")
    # spawn, not fork: a fork copies only this thread, so a lock another thread of
    # the test session held at that moment stays held in the child for ever (one
    # full run hung here, and the child's copy of Playwright's pipe then held up
    # the session's teardown). The workers import this module by name, as
    # tests/store/test_etcd_claims.py's do.
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_increment, args=(store_url, 200)) for _ in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(200)
        assert p.exitcode == 0
    assert store.get_hypervisor("counter").metadata.annotations["count"] == "1600"


def test_timestamps_are_utc(store: Store, make_hypervisor: MakeHv) -> None:
    h = store.create(make_hypervisor("hv1"), "operator")
    ts = h.metadata.creation_timestamp
    assert ts is not None and ts.utcoffset() is not None
    assert abs((datetime.now(UTC) - ts).total_seconds()) < 60
