"""Contract: field ownership of labels and annotations, Apply kept apart from
Update, and writes that change nothing, on every backend (sqlite, etcd,
remote; tests/store/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hvfleet.model.hypervisor import Hypervisor, Resource
from hvfleet.store import Store
from hvfleet.store.apply import apply_manifests, load_manifests
from hvfleet.store.base import OwnershipConflict, Write

MakeHv = Callable[..., Hypervisor]


def _apply(store: Store, manager: str, text: str, force: bool = False) -> Hypervisor:
    doc = "apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata: {name: hv1" + text
    (done,) = apply_manifests(store, load_manifests(doc, "m.yaml"), manager, force=force)
    assert isinstance(done.object, Hypervisor)
    return done.object


def _entries(obj: Resource) -> dict[tuple[str, str], dict[str, object]]:
    return {(e.manager, e.operation): e.fields_v1 for e in obj.metadata.managed_fields}


def test_an_apply_without_labels_keeps_the_labels_it_does_not_own(store: Store) -> None:
    _apply(store, "operator", ", labels: {az: a, role: compute}}\n")
    h = _apply(store, "cortex", "}\nspec: {overcommit: {cpu: 2}}\n")
    assert h.metadata.labels == {"az": "a", "role": "compute"}
    assert _entries(h)[("operator", "Apply")] == {
        "f:metadata": {"f:labels": {"f:az": {}, "f:role": {}}}}
    # The owner's own apply without `role` removes exactly that label.
    h = _apply(store, "operator", ", labels: {az: a}}\n")
    assert h.metadata.labels == {"az": "a"}
    assert h.spec.overcommit == {"cpu": 2.0}


def test_a_label_two_managers_applied_stays_until_both_drop_it(store: Store) -> None:
    _apply(store, "operator", ", labels: {az: a}}\n")
    h = _apply(store, "cortex", ", labels: {az: a}}\n")  # same value: co-owners, no conflict
    assert {m for (m, _), f in _entries(h).items() if "f:metadata" in f} == {"cortex", "operator"}
    h = _apply(store, "operator", "}\n")
    assert h.metadata.labels == {"az": "a"}
    h = _apply(store, "cortex", "}\n")
    assert h.metadata.labels == {}
    _apply(store, "operator", ", labels: {az: a}}\n")
    with pytest.raises(OwnershipConflict) as conflict:
        _apply(store, "cortex", ", labels: {az: b}}\n")
    assert conflict.value.conflicts == [("metadata.labels.az", "operator")]
    assert _apply(store, "cortex", ", labels: {az: b}}\n", force=True).metadata.labels == {"az": "b"}


def test_an_apply_keeps_what_the_same_manager_set_by_update(store: Store) -> None:
    h = _apply(store, "operator", "}\nspec: {overcommit: {cpu: 2}}\n")
    # The same manager sets another field by update (a merge patch, say) ...
    store.update(h.model_copy(update={"spec": h.spec.model_copy(
        update={"reserved": {"memory": "1Gi"}})}), "operator")
    # ... and its next apply of the same manifest leaves it alone.
    h = _apply(store, "operator", "}\nspec: {overcommit: {cpu: 2}}\n")
    assert str(h.spec.reserved["memory"]) == "1Gi"  # type: ignore[index]
    assert set(_entries(h)) == {("operator", "Apply"), ("operator", "Update")}


def test_an_update_takes_a_label_from_its_applier(store: Store) -> None:
    h = _apply(store, "operator", ", labels: {az: a}}\n")
    meta = h.metadata.model_copy(update={"labels": {"az": "b"}})
    h = store.update(h.model_copy(update={"metadata": meta}), "cortex")
    assert _entries(h) == {("cortex", "Update"): {"f:metadata": {"f:labels": {"f:az": {}}}}}
    # Not the applier's any more: its apply without it does not remove it.
    h = _apply(store, "operator", "}\n")
    assert h.metadata.labels == {"az": "b"}


def test_a_write_that_changes_nothing_is_not_written(store: Store, make_hypervisor: MakeHv) -> None:
    made = store.create(make_hypervisor("hv1", metadata={"labels": {"az": "a"}}), "operator")
    applied = _apply(store, "operator", ", labels: {az: a}}\nspec: {overcommit: {cpu: 2}}\n")
    other = store.create(make_hypervisor("hv2"), "operator")
    at = store.revision()
    # An identical update, an identical apply, a batch of both.
    same = store.update(applied, "operator")
    again = _apply(store, "operator", ", labels: {az: a}}\nspec: {overcommit: {cpu: 2}}\n")
    batch = store.write_all([Write("update", applied), Write("update", other)], "operator")
    for out in (same, again, *batch):
        assert out.metadata.resource_version in (applied.metadata.resource_version,
                                                 other.metadata.resource_version)
    assert same == applied and again == applied and batch == [applied, other]
    assert again.metadata.generation == applied.metadata.generation == made.metadata.generation + 1
    assert store.revision() == at
    assert list(store.watch("Hypervisor", since=at, timeout=0.3)) == []
    # A batch of one no-op and one change writes only the change.
    changed = other.model_copy(update={"metadata": other.metadata.model_copy(
        update={"labels": {"x": "y"}})})
    kept, written = store.write_all([Write("update", applied), Write("update", changed)], "operator")
    assert kept == applied
    assert written.metadata.resource_version != other.metadata.resource_version
    events = list(store.watch("Hypervisor", since=at, timeout=0.3))
    assert [(e.type, e.object.metadata.name) for e in events] == [("MODIFIED", "hv2")]
