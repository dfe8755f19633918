"""Object lifecycle on every backend (hvfleet.store.lifecycle): generated names,
deletion that waits for finalizers, owner references and the garbage
collector that deletes dependents once their owners are gone."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import pytest
from tests.store.hosts import ready_host

from hvfleet.model import Hypervisor, Reservation
from hvfleet.model.errors import AlreadyExists, InvalidInput, NotFound
from hvfleet.model.hypervisor import Resource
from hvfleet.store import Store, lifecycle

OPS = "operator"


def _hv(name: str = "", **meta: object) -> Hypervisor:
    return Hypervisor.model_validate({"metadata": {"name": name, **meta}})


def _gone(store: Store, kind: str, name: str) -> bool:
    try:
        store.get(kind, name)
    except NotFound:
        return True
    return False


def _write(store: Store) -> Callable[[Resource], Resource]:
    return lambda obj: store.update(obj, OPS)


def _eventually(test: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not test():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


def test_generate_name_creates_with_a_random_suffix_and_retries_a_collision(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    made = lifecycle.create_named(_hv(generateName="hv-"), lambda o: store.create(o, OPS))
    assert made.metadata.name.startswith("hv-") and len(made.metadata.name) == len("hv-") + 5
    assert made.metadata.generate_name == "hv-"
    # The first name tried is taken: the next one is used.
    names = iter([made.metadata.name, "hv-zzzzz"])
    monkeypatch.setattr(lifecycle, "generated_name", lambda prefix: next(names))
    again = lifecycle.create_named(_hv(generateName="hv-"), lambda o: store.create(o, OPS))
    assert again.metadata.name == "hv-zzzzz"
    monkeypatch.setattr(lifecycle, "generated_name", lambda prefix: "hv-zzzzz")
    with pytest.raises(AlreadyExists, match="no unused name"):
        lifecycle.create_named(_hv(generateName="hv-"), lambda o: store.create(o, OPS))
    monkeypatch.undo()
    # Nothing is ever stored under an empty name: a local store refuses it (names
    # are generated above it); the remote store's server generates one, as
    # kube-apiserver does.
    try:
        out = store.create(_hv(generateName="hv-"), OPS)
    except InvalidInput as exc:
        assert "metadata.name" in str(exc)
    else:
        assert out.metadata.name.startswith("hv-") and len(out.metadata.name) == len("hv-") + 5


def test_finalizers_hold_a_deletion_until_they_are_removed(store: Store) -> None:
    store.create(_hv("hv1", finalizers=["example.com/drain"]), OPS)
    current = store.get("Hypervisor", "hv1")
    marked, gone = lifecycle.delete(store, current, OPS)
    assert not gone
    assert marked.metadata.deletion_timestamp is not None
    stored = store.get("Hypervisor", "hv1")
    assert stored.metadata.deletion_timestamp == marked.metadata.deletion_timestamp
    # Deleting again changes nothing.
    again, gone = lifecycle.delete(store, stored, OPS)
    assert not gone and again.metadata.deletion_timestamp == marked.metadata.deletion_timestamp
    # No new finalizer once deleting; the deletionTimestamp cannot be taken away.
    more = stored.model_copy(update={"metadata": stored.metadata.model_copy(
        update={"finalizers": ["example.com/drain", "example.com/more"]})})
    with pytest.raises(InvalidInput, match="no new finalizers"):
        lifecycle.update(store, stored, more, _write(store))
    undeleted = stored.model_copy(update={"metadata": stored.metadata.model_copy(
        update={"deletion_timestamp": None, "labels": {"a": "b"}})})
    kept = lifecycle.update(store, stored, undeleted, _write(store))
    assert kept.metadata.deletion_timestamp == marked.metadata.deletion_timestamp
    # Removing the last finalizer deletes it.
    done = kept.model_copy(update={"metadata": kept.metadata.model_copy(update={"finalizers": []})})
    lifecycle.update(store, kept, done, _write(store))
    assert _gone(store, "Hypervisor", "hv1")


def test_an_object_without_finalizers_is_deleted_at_once(store: Store) -> None:
    store.create(_hv("hv1"), OPS)
    _, gone = lifecycle.delete(store, store.get("Hypervisor", "hv1"), OPS)
    assert gone and _gone(store, "Hypervisor", "hv1")


def _owned_by(owner: Resource, name: str) -> Reservation:
    ref = {"apiVersion": "hvfleet.io/v1", "kind": owner.kind, "name": owner.metadata.name,
           "uid": owner.metadata.uid}
    return Reservation.model_validate({
        "metadata": {"name": name, "ownerReferences": [ref]},
        "spec": {"hypervisor": owner.metadata.name, "resources": {"cpu": 1}, "consumer": name}})


def test_owner_references_are_stored_and_checked(store: Store) -> None:
    owner = ready_host(store, "hv1", 8)
    made = store.create(_owned_by(owner, "r1"), OPS)
    (ref,) = made.metadata.owner_references or []
    assert (ref.kind, ref.name, ref.uid) == ("Hypervisor", "hv1", owner.metadata.uid)
    bad = _hv("hv2", ownerReferences=[{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}])
    with pytest.raises(InvalidInput, match="ownerReferences"):
        store.create(bad, OPS)
    assert _gone(store, "Hypervisor", "hv2")


def test_dependents_are_collected_when_their_owner_is_gone(store: Store) -> None:
    collector = lifecycle.GarbageCollector(store).start()
    try:
        owner = ready_host(store, "hv1", 8)
        other = ready_host(store, "hv2", 8)
        store.create(_owned_by(owner, "r1"), OPS)
        store.create(_owned_by(other, "r2"), OPS)
        held = _owned_by(owner, "r3")
        held = held.model_copy(update={"metadata": held.metadata.model_copy(
            update={"finalizers": ["example.com/keep"]})})
        store.create(held, OPS)
        lifecycle.delete(store, store.get("Hypervisor", "hv1"), OPS)
        _eventually(lambda: _gone(store, "Reservation", "r1"))
        # A dependent with a finalizer is marked, not removed; another owner's stays.
        _eventually(lambda: store.get("Reservation", "r3").metadata.deletion_timestamp is not None)
        assert not _gone(store, "Reservation", "r2")
    finally:
        collector.close()


def test_the_collectors_sweep_reads_the_followed_kinds_not_the_dashboards_history(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep at start indexes the kinds the collector follows. The history
    series (never followed, never owned, and large: a day of history at 1,000
    hosts decoded at once took a server from 0.1 to 2.3 GB) are not read; an
    orphan is still collected beside them."""
    from hvfleet.model.dashboard import HistoryPoint
    from hvfleet.model.kinds import strategy
    from hvfleet.server.dashboard.history import Tier, host_series, write_point

    for i in range(3):
        with contextlib.suppress(NotFound):  # the remote store: the API serves no history
            write_point(store, host_series(f"hv{i}"), Tier("10s", 10, 3600),
                        HistoryPoint(t=1_000_000, v={"cpu": ["1", "0", "8"]}))
    owner = ready_host(store, "hv1", 8)
    store.create(_owned_by(owner, "r1"), OPS)
    store.delete("Hypervisor", "hv1")  # not through lifecycle: the dependent is left behind
    listed: list[str] = []
    real_list = store.list

    def spying(kind: str, *args: object, **kwargs: object) -> object:
        listed.append(kind)
        return real_list(kind, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "list", spying)
    collector = lifecycle.GarbageCollector(store).start()
    try:
        _eventually(lambda: _gone(store, "Reservation", "r1"))
    finally:
        collector.close()
    assert "HistorySeries" not in listed
    assert {"Hypervisor", "Reservation"} <= set(listed)
    assert all(strategy(k).followed for k in listed)


@pytest.mark.parametrize("propagation", ["Orphan", "Foreground"])
def test_an_orphan_or_foreground_deletion_is_finished_by_the_collector_even_one_started_later(
        store: Store, propagation: lifecycle.Propagation) -> None:
    """An owner deleted with Orphan: its dependents stay, without its
    reference; with Foreground: they are deleted, then it. The deletion holds
    the owner with kube's finalizer (`orphan`, `foregroundDeletion`), so a
    collector that was not running then (a server restarted) finishes it at
    its start. A store behind an API server refuses the option it cannot send."""
    owner = ready_host(store, "hv1", 8)
    other = ready_host(store, "hv2", 8)
    store.create(_owned_by(owner, "r1"), OPS)
    both = _owned_by(owner, "r2")
    refs = [*(both.metadata.owner_references or []), *(_owned_by(other, "x").metadata.owner_references or [])]
    store.create(both.model_copy(update={"metadata": both.metadata.model_copy(
        update={"owner_references": refs})}), OPS)
    if store.finalizes_on_delete:
        with pytest.raises(InvalidInput, match="propagationPolicy"):
            lifecycle.delete(store, store.get("Hypervisor", "hv1"), OPS, propagation=propagation)
        assert not _gone(store, "Hypervisor", "hv1")
        return
    marked, gone = lifecycle.delete(store, store.get("Hypervisor", "hv1"), OPS, propagation=propagation)
    assert not gone and marked.metadata.deletion_timestamp is not None
    assert marked.metadata.finalizers == ["orphan" if propagation == "Orphan" else "foregroundDeletion"]
    time.sleep(0.2)
    assert not _gone(store, "Reservation", "r1")  # no collector yet: nothing happens
    collector = lifecycle.GarbageCollector(store).start()
    try:
        _eventually(lambda: _gone(store, "Hypervisor", "hv1"))
        if propagation == "Orphan":
            assert store.get("Reservation", "r1").metadata.owner_references is None
            assert [r.name for r in store.get("Reservation", "r2").metadata.owner_references or []] == ["hv2"]
        else:
            assert _gone(store, "Reservation", "r1") and _gone(store, "Reservation", "r2")
        assert not _gone(store, "Hypervisor", "hv2")
    finally:
        collector.close()
