"""`seen_through`, property-tested against the store itself: a client that
listed with a label selector at any revision R and then applies the events
of a watch from R, as the selector sees them, holds exactly what a list with
that selector returns at the end — whatever objects were created, relabelled
into and out of the selection, modified or deleted, and with the store's
history compacted (SQLite keeping each object's last write below its floor),
on SQLite and on etcd."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvfleet.model import Hypervisor, ObjectMeta
from hvfleet.model.hypervisor import Resource
from hvfleet.model.selectors import parse_selector
from hvfleet.server.watch import seen_through
from hvfleet.store import Store, open_store
from hvfleet.store import sqlite as sqlite_backend
from hvfleet.store.base import WatchEvent
from hvfleet.store.sqlite import SqliteStore
from tests.support.etcd_local import EtcdCluster

NAMES = ["a", "b", "c"]
RACKS = ["x", "y"]
SELECTORS = ["rack=x", "rack!=x", "rack in (x,y)", "!rack", "rack"]

# One step: (name, op, rack) with op create-or-relabel, modify (spec only), delete.
steps = st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(["label", "spec", "delete"]),
                           st.sampled_from([*RACKS, None])), min_size=1, max_size=25)


def apply_step(store: Store, name: str, op: str, rack: str | None) -> None:
    labels = {} if rack is None else {"rack": rack}
    try:
        current = store.get_hypervisor(name)
    except Exception:
        if op != "delete":
            store.create(Hypervisor(metadata=ObjectMeta(name=name, labels=labels)), "ops")
        return
    if op == "delete":
        store.delete("Hypervisor", name)
    elif op == "label":
        meta = current.metadata.model_copy(update={"labels": labels})
        store.update(current.model_copy(update={"metadata": meta}), "ops")
    else:
        spec = current.spec.model_copy(update={"maintenance": "" if current.spec.maintenance else "drain"})
        store.update(current.model_copy(update={"spec": spec}), "ops")


def view(objects: list[Resource]) -> dict[str, tuple[str | None, dict[str, str]]]:
    return {o.metadata.name: (o.metadata.resource_version, dict(o.metadata.labels)) for o in objects}


def follow(held: dict[str, tuple[str | None, dict[str, str]]], events: list[WatchEvent],
           selector: str) -> list[str]:
    """Apply the events as a client would; returns the event types it got."""
    sel = parse_selector(selector)
    got = []
    for ev in events:
        seen = seen_through(ev, sel)
        if seen is None:
            continue
        kind, obj = seen
        got.append(kind)
        name = obj.metadata.name
        if kind == "DELETED":
            assert name in held, f"DELETED for {name}, which the client does not hold"
            assert int(obj.metadata.resource_version or 0) == ev.revision
            del held[name]
        elif kind == "ADDED":
            assert name not in held, f"ADDED for {name}, which the client holds"
            held[name] = (obj.metadata.resource_version, dict(obj.metadata.labels))
        else:
            assert name in held, f"MODIFIED for {name}, which the client does not hold"
            held[name] = (obj.metadata.resource_version, dict(obj.metadata.labels))
    return got


def check_every_start(store: Store, steps: list[tuple[str, str, str | None]], selector: str,
                      floor: Callable[[], int], idle: float) -> None:
    """Run `steps`, keeping the selected list at each revision; then a watch
    from every revision at or above `floor()` must lead from that list to the last."""
    lists = {store.revision(): view(store.list("Hypervisor", selector).items)}
    for step in steps:
        apply_step(store, *step)
        lists[store.revision()] = view(store.list("Hypervisor", selector).items)
    starts = sorted(r for r in lists if r >= floor())  # every revision a watch may use
    # A watch from R yields exactly the events after R (the store contract), so
    # one watch from the earliest serves every start.
    everything = list(store.watch("Hypervisor", since=starts[0], timeout=idle))
    assert all(e.knows_previous for e in everything)
    for since in starts:
        held = dict(lists[since])
        follow(held, [e for e in everything if e.revision > since], selector)
        assert held == lists[store.revision()], f"watch from {since}"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps, selector=st.sampled_from(SELECTORS), history=st.sampled_from([100_000, 4]))
def test_a_selected_watch_from_any_revision_ends_where_a_selected_list_does(
    steps: list[tuple[str, str, str | None]], selector: str, history: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp, \
            mock.patch.object(sqlite_backend, "EVENT_HISTORY", history), \
            mock.patch.object(sqlite_backend, "_COMPACT_EVERY", 2):
        store = SqliteStore(str(Path(tmp) / "db"))
        check_every_start(store, steps, selector, lambda: int(store._read(
            lambda db: db.execute("SELECT value FROM meta WHERE key = 'compacted'").fetchone()[0])), 0)
        store.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps, selector=st.sampled_from(SELECTORS))
def test_the_same_on_etcd(etcd_session: EtcdCluster, steps: list[tuple[str, str, str | None]],
                          selector: str) -> None:
    store = open_store(etcd_session.url(prefix=f"/test-{uuid.uuid4().hex[:12]}"))
    try:
        check_every_start(store, steps, selector, lambda: 0, 0.05)
    finally:
        store.close()
