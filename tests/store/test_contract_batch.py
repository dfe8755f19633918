"""Atomic batches (`Store.write_all`) and apply on top of them, on every backend
(see conftest.STORE_BACKENDS): all or nothing, and never seen half-written."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from tests.store.hosts import ready_host

from hvfleet.model import AlreadyExists, Forbidden, Hypervisor, InvalidInput, NotFound, Reservation
from hvfleet.model.hypervisor import Resource
from hvfleet.scheduling.claims import claim_reservation
from hvfleet.scheduling.errors import DoesNotFit
from hvfleet.store import Store, open_store
from hvfleet.store.apply import ClaimRequired, apply_manifests, load_manifests, plan_one
from hvfleet.store.base import OwnershipConflict, StaleVersion, Write

MakeHv = Callable[..., Hypervisor]


def _labelled(h: Resource, **labels: str) -> Resource:
    meta = h.metadata.model_copy(update={"labels": {**h.metadata.labels, **labels}})
    return h.model_copy(update={"metadata": meta})


def _ratio(h: Hypervisor, cpu: float) -> Hypervisor:
    return h.model_copy(update={"spec": h.spec.model_copy(update={"overcommit": {"cpu": cpu}})})


def _state(store: Store) -> list[tuple[str, str | None, dict[str, str]]]:
    return [(h.name, h.metadata.resource_version, h.metadata.labels)
            for h in store.list_hypervisors()]


def test_a_batch_is_written_whole_and_each_object_as_update_would(
    store: Store, make_hypervisor: MakeHv
) -> None:
    old = store.create(make_hypervisor("hv1"), "operator")
    start = store.revision()
    out = store.write_all(
        [Write("update", _ratio(old, 2.0)), Write("create", make_hypervisor("hv2")),
         Write("create", make_hypervisor("hv3", status={"capacity": {"cpu": 4}}))],
        "operator",
    )
    assert [o.metadata.name for o in out] == ["hv1", "hv2", "hv3"]
    assert [store.get("Hypervisor", n) for n in ("hv1", "hv2", "hv3")] == out
    assert out[0].metadata.generation == 2 and out[1].metadata.generation == 1
    assert out[2].status.capacity == {}  # as create: status from a non-agent is dropped
    assert {e.manager for e in out[0].metadata.managed_fields} == {"operator"}
    events = list(store.watch("Hypervisor", since=start, timeout=0.5))
    assert [(e.type, e.object.metadata.name) for e in events] == [
        ("MODIFIED", "hv1"), ("ADDED", "hv2"), ("ADDED", "hv3")]
    assert events[-1].last_of_revision
    assert store.write_all([], "operator") == []


@pytest.mark.parametrize("last", ["stale", "exists", "missing", "owned", "status"])
def test_a_batch_whose_last_write_fails_writes_nothing(
    store: Store, make_hypervisor: MakeHv, last: str
) -> None:
    a = store.create(make_hypervisor("a"), "operator")
    b = store.create(make_hypervisor("b"), "operator")
    b = store.update_hypervisor("b", lambda h: _ratio(h, 4.0), "cortex")
    before, revision = _state(store), store.revision()
    failing: dict[str, tuple[Write, type[Exception]]] = {
        "stale": (Write("update", _labelled(b.model_copy(update={"metadata": b.metadata.model_copy(
            update={"resource_version": a.metadata.resource_version})}), x="1")), StaleVersion),
        "exists": (Write("create", make_hypervisor("b")), AlreadyExists),
        "missing": (Write("update", _labelled(a.model_copy(update={"metadata": a.metadata.model_copy(
            update={"name": "nope"})}))), NotFound),
        "owned": (Write("update", _ratio(b, 8.0), frozenset({("spec", "overcommit", "cpu")})),
                  OwnershipConflict),
        "status": (Write("update", b.model_copy(update={"status": b.status.model_copy(
            update={"capacity": {"cpu": 8}})})), Forbidden),
    }
    write, error = failing[last]
    with pytest.raises(error):
        store.write_all(
            [Write("update", _labelled(a, batch="1")), Write("create", make_hypervisor("c")), write],
            "operator",
        )
    assert _state(store) == before
    assert store.revision() == revision
    assert list(store.watch("Hypervisor", since=revision, timeout=0.3)) == []


def test_a_batch_names_each_object_once(store: Store, make_hypervisor: MakeHv) -> None:
    with pytest.raises(InvalidInput, match="more than once"):
        store.write_all([Write("create", make_hypervisor("a")),
                         Write("create", make_hypervisor("a"))], "operator")
    assert store.list_hypervisors() == []


def _apply_rounds(url: str, writer: str, rounds: int, errors: list[BaseException]) -> None:
    s = open_store(url)
    try:
        for i in range(rounds):
            docs = "---\n".join(
                f"apiVersion: hvfleet.io/v1\nkind: Hypervisor\n"
                f"metadata: {{name: hv{n}, labels: {{round: {writer}-{i}}}}}\n"
                for n in range(4)
            )
            apply_manifests(s, load_manifests(docs, writer), "operator")
    except BaseException as exc:
        errors.append(exc)
        raise
    finally:
        s.close()


@pytest.mark.timeout(240)
def test_concurrent_applies_are_never_seen_half_written(
    store: Store, store_url: str, make_hypervisor: MakeHv
) -> None:
    for n in range(4):
        store.create(make_hypervisor(f"hv{n}", metadata={"labels": {"round": "start"}}), "operator")
    errors: list[BaseException] = []
    writers = [
        threading.Thread(target=_apply_rounds, args=(store_url, w, 25, errors)) for w in ("a", "b")
    ]
    for t in writers:
        t.start()
    snapshots = 0
    mixed: list[list[str]] = []
    while any(t.is_alive() for t in writers):
        rounds = [h.metadata.labels["round"] for h in store.list_hypervisors()]
        snapshots += 1
        if len(set(rounds)) != 1:
            mixed.append(rounds)
    for t in writers:
        t.join()
    assert not errors
    assert not mixed, f"{len(mixed)} of {snapshots} lists saw a half-written apply: {mixed[:3]}"
    final = {h.metadata.labels["round"] for h in store.list_hypervisors()}
    assert final in ({"a-24"}, {"b-24"})


def test_apply_plans_like_server_side_apply_and_writes_all_or_nothing(
    store: Store, make_hypervisor: MakeHv
) -> None:
    store.create(make_hypervisor("hv1"), "operator")
    store.update_hypervisor("hv1", lambda h: _ratio(h, 4.0), "cortex")
    before = _state(store)
    docs = load_manifests(
        "apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata: {name: new}\n---\n"
        "apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata: {name: hv1}\n"
        "spec: {overcommit: {cpu: 2}}\n",
        "m.yaml",
    )
    with pytest.raises(OwnershipConflict, match="cortex"):
        apply_manifests(store, docs, "operator")
    assert _state(store) == before
    applied = apply_manifests(store, docs, "operator", force=True)
    assert [(a.action, a.object.metadata.name) for a in applied] == [
        ("created", "new"), ("configured", "hv1")]
    assert store.get_hypervisor("hv1").spec.overcommit == {"cpu": 2.0}


def test_apply_never_creates_a_reservation_around_the_claim(store: Store) -> None:
    ready_host(store, "hv1", cpu=4)
    docs = load_manifests(
        "apiVersion: hvfleet.io/v1\nkind: Reservation\nmetadata: {name: r1}\n"
        "spec: {hypervisor: hv1, consumer: c, resources: {cpu: 1}}\n",
        "r.yaml",
    )
    with pytest.raises(ClaimRequired, match="claimed"):
        apply_manifests(store, docs, "operator")
    assert store.list_reservations() == []
    # An existing reservation is updated, status included (the scheduler's phase).
    r = Reservation.model_validate({"metadata": {"name": "r1"}, "spec": docs[0].spec.to_dict()})
    stored = claim_reservation(store, r, "scheduler")
    planned = plan_one(stored, docs[0], "scheduler")
    assert planned.action == "update"
    assert planned.object.metadata.resource_version == stored.metadata.resource_version


def test_an_ownership_conflict_lists_every_field_and_owner(store: Store, make_hypervisor: MakeHv) -> None:
    store.create(make_hypervisor("hv1"), "operator")

    def two(h: Hypervisor) -> Hypervisor:
        spec = h.spec.model_copy(update={"overcommit": {"cpu": 4.0, "memory": 1.5}})
        return h.model_copy(update={"spec": spec})

    store.update_hypervisor("hv1", two, "cortex")
    docs = load_manifests("apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata: {name: hv1}\n"
                          "spec: {overcommit: {cpu: 2, memory: 2}}\n", "m.yaml")
    with pytest.raises(OwnershipConflict) as caught:
        apply_manifests(store, docs, "operator")
    assert caught.value.conflicts == [("spec.overcommit.cpu", "cortex"),
                                      ("spec.overcommit.memory", "cortex")]


def _claimed_cpu(store: Store, name: str, host: str, cpu: int) -> Reservation:
    r = Reservation.model_validate({
        "metadata": {"name": name},
        "spec": {"hypervisor": host, "consumer": name, "resources": {"cpu": cpu}},
        "status": {"phase": "Active"},
    })
    out = store.claim(r, "scheduler", lambda h, others: None)
    assert isinstance(out, Reservation)
    return out


def _released(r: Reservation) -> Reservation:
    return r.model_copy(update={"status": r.status.model_copy(update={"phase": "Released"})})


def test_a_batch_may_hold_several_reservations_of_one_host(store: Store, make_hypervisor: MakeHv) -> None:
    # Both bump the host's reservation set key on etcd: one txn must name it once.
    ready_host(store, "hv1", 8)
    a, b = _claimed_cpu(store, "r1", "hv1", 2), _claimed_cpu(store, "r2", "hv1", 2)
    out = store.write_all([Write("update", _released(a)), Write("update", _released(b))], "scheduler")
    assert [o.status.phase for o in out if isinstance(o, Reservation)] == ["Released", "Released"]
    assert [r.status.phase for r in store.list_reservations()] == ["Released", "Released"]


def _new_cpu(name: str, host: str, cpu: int) -> Reservation:
    return Reservation.model_validate({
        "metadata": {"name": name},
        "spec": {"hypervisor": host, "consumer": name, "resources": {"cpu": cpu}},
        "status": {"phase": "Active"},
    })


def _batch_with_claims(store: Store) -> bool:
    """The remote store sends a batch to its server, which takes creates and
    updates only (a claim's check cannot travel): it refuses the others whole."""
    return not store.url.startswith("https://")


def test_a_batch_deletes_a_claim_and_makes_another_whose_check_sees_the_host_as_the_batch_leaves_it(
    store: Store, make_hypervisor: MakeHv
) -> None:
    ready_host(store, "hv1", 8)
    old, kept = _claimed_cpu(store, "r1", "hv1", 2), _claimed_cpu(store, "r0", "hv1", 1)
    seen: list[list[str]] = []

    def check(h: Hypervisor, others: list[Reservation]) -> None:
        seen.append(sorted(o.name for o in others))

    writes = [Write("delete", old), Write("create", _new_cpu("r2", "hv1", 3), check=check),
              Write("create", make_hypervisor("hv2"))]
    if not _batch_with_claims(store):
        with pytest.raises(InvalidInput):
            store.write_all(writes, "scheduler")
        assert sorted(r.name for r in store.list_reservations()) == ["r0", "r1"]
        return
    store.write_all(writes, "scheduler")
    assert seen == [[kept.name]]
    assert sorted(r.name for r in store.list_reservations()) == ["r0", "r2"]
    assert store.get("Hypervisor", "hv2").metadata.name == "hv2"


@pytest.mark.parametrize("refused", ["check", "stale delete"])
def test_a_batch_whose_claim_is_refused_or_whose_delete_is_stale_writes_nothing(
    store: Store, make_hypervisor: MakeHv, refused: str
) -> None:
    ready_host(store, "hv1", 8)
    old = _claimed_cpu(store, "r1", "hv1", 2)
    hv = store.get("Hypervisor", "hv1")
    before = (sorted((r.name, r.metadata.resource_version) for r in store.list_reservations()),
              hv.metadata.resource_version)

    def full(h: Hypervisor, others: list[Reservation]) -> None:
        raise DoesNotFit(h.name, [])

    delete = old
    if refused == "stale delete":
        store.update(_released(old), "scheduler")  # `old`'s resourceVersion is now stale
        before = (sorted((r.name, r.metadata.resource_version) for r in store.list_reservations()),
                  hv.metadata.resource_version)
    writes = [Write("delete", delete),
              Write("create", _new_cpu("r2", "hv1", 3), check=full if refused == "check" else None),
              Write("update", _ratio(hv, 2.0))]  # type: ignore[arg-type]
    expected: type[Exception] = DoesNotFit if refused == "check" else StaleVersion
    with pytest.raises(expected if _batch_with_claims(store) else InvalidInput):
        store.write_all(writes, "scheduler")
    after = (sorted((r.name, r.metadata.resource_version) for r in store.list_reservations()),
             store.get("Hypervisor", "hv1").metadata.resource_version)
    assert after == before
