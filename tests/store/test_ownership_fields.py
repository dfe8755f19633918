"""The field-set logic of server-side apply (hvfleet.store.ownership), pure:
what an apply sets, what it removes, and whose ownership moves."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hvfleet.model.hypervisor import Hypervisor, Resource
from hvfleet.store.apply import plan_one
from hvfleet.store.ownership import (
    applied_fields,
    from_fields_v1,
    owned_fields,
    prepare_create,
    prepare_update,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
KEYS = ["a", "b", "c", "hvfleet.io/d"]
VALUES = ["x", "y"]
RESOURCES = ["cpu", "memory"]

manifests = st.fixed_dictionaries(
    {},
    optional={
        "labels": st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=4),
        "annotations": st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=4),
        "overcommit": st.dictionaries(st.sampled_from(RESOURCES), st.sampled_from([1.0, 2.0]),
                                      max_size=2),
        "reserved": st.dictionaries(st.sampled_from(RESOURCES), st.sampled_from(["1Gi", "2Gi"]),
                                    max_size=2),
        "maintenance": st.just("drain"),
    },
)


def _manifest(parts: dict[str, Any]) -> Hypervisor:
    meta: dict[str, Any] = {"name": "hv1"}
    spec: dict[str, Any] = {}
    for key in ("labels", "annotations"):
        if key in parts:
            meta[key] = parts[key]
    for key in ("overcommit", "reserved", "maintenance"):
        if key in parts:
            spec[key] = parts[key]
    doc: dict[str, Any] = {"metadata": meta}
    if spec:
        doc["spec"] = spec
    return Hypervisor.model_validate(doc)


def _stored(obj: Resource, rv: int) -> Resource:
    return obj.model_copy(update={"metadata": obj.metadata.model_copy(
        update={"resource_version": str(rv)})})


def _apply(current: Resource, parts: dict[str, Any], manager: str, rv: int) -> Resource:
    write = plan_one(current, _manifest(parts), manager)
    out = prepare_update(current, write.object, manager, force=True, now=NOW,
                         applied=write.applied)
    return _stored(out, rv)


def _owned_by(obj: Resource, manager: str, operation: str) -> set[tuple[str, ...]]:
    return {p for e in obj.metadata.managed_fields
            if e.manager == manager and e.operation == operation
            for p in from_fields_v1(e.fields_v1)}


def _owned_by_others(obj: Resource, manager: str) -> set[tuple[str, ...]]:
    return {p for e in obj.metadata.managed_fields
            if (e.manager, e.operation) != (manager, "Apply")
            for p in from_fields_v1(e.fields_v1)}


@settings(max_examples=300, deadline=None)
@given(initial=manifests, theirs=manifests, first=manifests, second=manifests)
def test_a_second_apply_removes_exactly_what_the_applier_owned_and_dropped(
        initial: dict[str, Any], theirs: dict[str, Any], first: dict[str, Any],
        second: dict[str, Any]) -> None:
    """Created by one manager, applied by Y, then by X with M, then with M':
    the fields X owned after M and left out of M' are removed unless another
    entry holds them; every other field keeps its value; M' is set."""
    created = _stored(prepare_create(_manifest(initial), "creator", NOW), 1)
    state = _apply(created, theirs, "y", 2)
    state = _apply(state, first, "x", 3)
    before = owned_fields(state)
    x_applied = _owned_by(state, "x", "Apply")
    kept_by_others = _owned_by_others(state, "x")

    after_obj = _apply(state, second, "x", 4)
    after = owned_fields(after_obj)
    wanted = applied_fields(_manifest(second))
    desired = {p: v for p, v in owned_fields(_manifest(second)).items() if p in wanted}

    removed = {p for p in before if p not in after}
    assert removed == (x_applied - wanted - kept_by_others) & set(before)
    for path, value in after.items():
        assert value == desired.get(path, before.get(path)), path
    # X's Apply entry is exactly M', and nobody else lost a field X did not change.
    assert _owned_by(after_obj, "x", "Apply") == set(desired)
    changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
    for e in state.metadata.managed_fields:
        if e.manager == "x":
            continue
        had = from_fields_v1(e.fields_v1)
        now = _owned_by(after_obj, e.manager, e.operation)
        assert had - changed <= now, e.manager


@settings(max_examples=200, deadline=None)
@given(first=manifests)
def test_an_identical_apply_changes_nothing(first: dict[str, Any]) -> None:
    created = _stored(prepare_create(_manifest({}), "creator", NOW), 1)
    state = _apply(created, first, "x", 2)
    write = plan_one(state, _manifest(first), "x")
    assert prepare_update(state, write.object, "x", force=False, now=NOW,
                          applied=write.applied) is state


def test_an_agents_status_writes_move_only_its_status_entry() -> None:
    created = _stored(prepare_create(_manifest({"labels": {"a": "x"}}), "creator", NOW), 1)

    def with_heartbeat(obj: Resource, at: datetime) -> Resource:
        assert isinstance(obj, Hypervisor)
        return obj.model_copy(update={"status": obj.status.model_copy(
            update={"last_heartbeat_time": at})})

    first = _stored(prepare_update(created, with_heartbeat(created, NOW), "agent/hv1", force=False,
                                   now=NOW), 2)
    later = NOW.replace(hour=1)
    second = prepare_update(first, with_heartbeat(first, later), "agent/hv1", force=False, now=later)
    entries = {(e.manager, e.operation, e.subresource): (e.fields_v1, e.time)
               for e in second.metadata.managed_fields}
    assert entries == {
        ("agent/hv1", "Update", "status"): ({"f:status": {}}, later),
        ("creator", "Update", None): ({"f:metadata": {"f:labels": {"f:a": {}}}}, NOW),
    }
    assert second.metadata.generation == first.metadata.generation
    # The same status again: nothing to write.
    assert prepare_update(first, with_heartbeat(first, NOW), "agent/hv1", force=False,
                          now=later) is first
