"""The Store contract for stored objects that do not decode, on every backend:
one such object (written by an older hvfleet, or straight into SQLite or etcd)
is skipped by lists, watches and the fleet index, a get names it and why, and
it can still be deleted or replaced (hvfleet.store.undecodable)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.store.hosts import ready_host
from tests.store.poison import hypervisor_doc

from hvfleet.model import Hypervisor, InvalidInput, NotFound
from hvfleet.scheduling.index import FleetIndex
from hvfleet.scheduling.request import parse_request
from hvfleet.store import Store
from hvfleet.store.base import StaleVersion
from hvfleet.store.undecodable import Undecodable

Poison = Callable[..., int]


def test_a_list_skips_an_object_that_does_not_decode_and_a_get_names_it(
    store: Store, poison_store: Poison
) -> None:
    ready_host(store, "good", cpu=8)
    bad_rev = poison_store("Hypervisor", "bad", hypervisor_doc("bad"))
    listed = store.list("Hypervisor")
    assert [h.metadata.name for h in listed.items] == ["good"]
    assert listed.revision >= bad_rev
    if not store.url.startswith("https://"):  # the remote store sees the server's list
        assert [(e.name, e.revision) for e in listed.undecodable] == [("bad", bad_rev)]
        assert store.list("Hypervisor", "az=a").undecodable[0].name == "bad"
        assert store.list("Hypervisor", "az=b").undecodable == []
    with pytest.raises(Undecodable) as got:
        store.get("Hypervisor", "bad")
    assert got.value.revision == bad_rev
    assert "status.capacity.cpu" in str(got.value) and "bad" in str(got.value)


def test_a_watch_skips_it_and_goes_on(store: Store, poison_store: Poison) -> None:
    ready_host(store, "good", cpu=8)
    since = store.revision()
    poison_store("Hypervisor", "bad", hypervisor_doc("bad"))
    after = store.update_hypervisor("good", lambda h: h.model_copy(update={"metadata": h.metadata.model_copy(
        update={"labels": {"seen": "yes"}})}), "operator")
    names = []
    for event in store.watch("Hypervisor", since=since, timeout=3):
        names.append(event.object.metadata.name)
        if event.revision >= int(after.metadata.resource_version or 0):
            break
    assert names == ["good"]


def test_the_fleet_index_builds_and_fits_without_it(store: Store, poison_store: Poison) -> None:
    ready_host(store, "good", cpu=8)
    index = FleetIndex.from_store(store)
    poison_store("Hypervisor", "bad", hypervisor_doc("bad"))
    poison_store("Hypervisor", "bad2", b'{"not": "a hypervisor"')
    assert index.refresh(store) >= 0
    fresh = FleetIndex.from_store(store)
    for idx in (index, fresh):
        assert idx.host("bad") is None
        result = idx.fit(parse_request("2", None))
        assert result.names == ["good"]


def test_a_following_index_drops_a_host_whose_new_state_does_not_decode(
    store: Store, poison_store: Poison
) -> None:
    ready_host(store, "good", cpu=8)
    ready_host(store, "spoiled", cpu=8)
    index = FleetIndex.from_store(store)
    assert index.fit(parse_request("2", None)).names == ["good", "spoiled"]
    rev = poison_store("Hypervisor", "spoiled", hypervisor_doc("spoiled"))
    index.refresh(store)
    if store.url.startswith("https://"):
        return  # the remote store's server skips it; its watch cannot tell
    assert index.revision >= rev
    assert index.host("spoiled") is None
    assert index.fit(parse_request("2", None)).names == ["good"]


def test_it_can_be_deleted(store: Store, poison_store: Poison) -> None:
    bad_rev = poison_store("Hypervisor", "bad", hypervisor_doc("bad"))
    with pytest.raises(StaleVersion):
        store.delete("Hypervisor", "bad", str(bad_rev - 1))
    store.delete("Hypervisor", "bad", str(bad_rev))
    with pytest.raises(NotFound):
        store.get("Hypervisor", "bad")
    poison_store("Hypervisor", "bad", hypervisor_doc("bad"))
    store.delete("Hypervisor", "bad")
    assert store.list("Hypervisor").items == []


def test_it_can_be_replaced_at_its_version(store: Store, poison_store: Poison) -> None:
    bad_rev = poison_store("Hypervisor", "bad", hypervisor_doc("bad"))
    new = Hypervisor.model_validate({"metadata": {"name": "bad", "resourceVersion": str(bad_rev - 1)},
                                     "spec": {"overcommit": {"cpu": 2.0}}})
    with pytest.raises(StaleVersion):
        store.update(new, "operator")
    at_version = new.model_copy(update={"metadata": new.metadata.model_copy(
        update={"resource_version": str(bad_rev)})})
    out = store.update(at_version, "operator")
    assert out.spec == new.spec
    back = store.get_hypervisor("bad")
    # What could still be read of the stored object is kept: its identity.
    assert back.metadata.uid == "uid-bad"
    assert back.metadata.generation == 4
    assert back.spec.overcommit == {"cpu": 2.0}
    assert [e.manager for e in back.metadata.managed_fields] == ["operator"]


def test_its_agent_replaces_its_status(store: Store, poison_store: Poison) -> None:
    bad_rev = poison_store("Hypervisor", "bad", hypervisor_doc("bad"))
    new = Hypervisor.model_validate({"metadata": {"name": "bad", "resourceVersion": str(bad_rev)},
                                     "status": {"capacity": {"cpu": "16"}}})
    store.update(new, "agent/bad")
    assert str(store.get_hypervisor("bad").status.capacity["cpu"]) == "16"


def test_a_write_past_a_bound_is_refused_before_anything_is_stored(store: Store) -> None:
    """Code that copies a model without validation (model_copy) cannot store what
    a reader would refuse: the store reads its own bytes back first."""
    host = ready_host(store, "good", cpu=8)
    before = store.revision()
    current = store.get_hypervisor("good")
    bad = current.model_copy(update={"status": current.status.model_copy(
        update={"capacity": {"cpu": int("1" + "0" * 4000)}})})
    with pytest.raises(InvalidInput) as got:
        store.update(bad, "agent/good")
    assert got.value.field == "status.capacity.cpu"
    assert store.revision() == before
    assert store.get_hypervisor("good").status.capacity == host.status.capacity
