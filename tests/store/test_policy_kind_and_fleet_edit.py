"""OvercommitPolicy is stored like every kind, and a fleet-wide spec edit is all
or nothing, on every backend (SQLite and a real etcd)."""

from __future__ import annotations

import pytest

from hvfleet.model import Hypervisor, ResourceName
from hvfleet.model.hypervisor import OvercommitPolicy
from hvfleet.model.spec_edits import SpecEdit
from hvfleet.scheduling.fleet_edit import edit_hosts
from hvfleet.store import Store
from hvfleet.store.base import OwnershipConflict, StaleVersion, kind_of

CPU = ResourceName("cpu")


def policy(name: str, cpu: float) -> OvercommitPolicy:
    return OvercommitPolicy.model_validate(
        {
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"role": "compute"}}, "overcommit": {"cpu": cpu}},
        }
    )


def test_policies_are_stored_listed_updated_watched_and_deleted(store: Store) -> None:
    assert kind_of("overcommitpolicies") == kind_of("OvercommitPolicy") == "OvercommitPolicy"
    since = store.revision()
    created = store.create(policy("p", 2.0), "operator")
    assert isinstance(created, OvercommitPolicy) and created.metadata.generation == 1
    assert [p.name for p in store.list_overcommit_policies()] == ["p"]
    changed = created.model_copy(update={"spec": created.spec.model_copy(update={"priority": 5})})
    updated = store.update(changed, "operator")
    assert updated.metadata.generation == 2
    with pytest.raises(StaleVersion):
        store.update(changed, "operator")
    # Another manager's update takes the field (conflicts are for applies).
    other = updated.model_copy(update={"spec": updated.spec.model_copy(update={"priority": 1})})
    taken = store.update(other, "cortex")
    assert {e.manager for e in taken.metadata.managed_fields
            if "f:priority" in e.fields_v1.get("f:spec", {})} == {"cortex"}
    store.delete("OvercommitPolicy", "p")
    events = [(e.type, e.object.kind) for e in store.watch("OvercommitPolicy", since=since, timeout=0.5)]
    assert events == [
        ("ADDED", "OvercommitPolicy"),
        ("MODIFIED", "OvercommitPolicy"),
        ("MODIFIED", "OvercommitPolicy"),
        ("DELETED", "OvercommitPolicy"),
    ]
    assert store.list_overcommit_policies() == []


def test_fleet_edit_is_all_or_nothing_on_every_backend(store: Store, make_hypervisor) -> None:  # type: ignore[no-untyped-def]
    for name in ("c-1", "c-2", "c-3"):
        h: Hypervisor = make_hypervisor(name, metadata={"labels": {"role": "compute"}})
        store.create(h, "operator")
    store.create(make_hypervisor("g-1", metadata={"labels": {"role": "gpu"}}), "operator")
    store.update_hypervisor("c-3", lambda h: SpecEdit("overcommit", {CPU: 2.0}).apply(h), "cortex")
    before = {h.name: h.metadata.resource_version for h in store.list_hypervisors()}
    # The conflict is structured on every backend (over the API it comes back from
    # the batch's FieldManagerConflict causes, in the server's words).
    with pytest.raises(OwnershipConflict, match="cortex") as conflict:
        edit_hosts(store, SpecEdit("overcommit", {CPU: 4.0}), "operator", selector="role=compute")
    assert conflict.value.conflicts == [("spec.overcommit.cpu", "cortex")]
    assert {h.name: h.metadata.resource_version for h in store.list_hypervisors()} == before
    out = edit_hosts(
        store, SpecEdit("overcommit", {CPU: 4.0}), "operator", selector="role=compute", force=True
    )
    assert [(h.name, h.spec.overcommit[CPU]) for h in out] == [("c-1", 4.0), ("c-2", 4.0), ("c-3", 4.0)]
    assert store.get_hypervisor("g-1").spec.overcommit == {}
