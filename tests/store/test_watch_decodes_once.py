"""A watch event's object is decoded at most once per store, on both local
backends (SQLite and etcd; hvfleet.store.decoded): a value this model code
sealed reaches the watches undecoded (a watch that forwards its JSON, looks
at its key or passes it by never decodes it), the first watch that needs the
model decodes it for every other watch of the store, and a store's own write
is at hand already (the object its encoding check read back). What the
watches see is what another store decodes, at the same revision, also after
a write that was rolled back and whose revision the next write took (SQLite
numbers its revisions inside the transaction).

The etcd backend uses the session's real etcd (conftest.etcd_session), each
test under its own prefix."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.store.conftest import etcd_backend, sqlite_backend

from hvfleet.model import AlreadyExists, Hypervisor
from hvfleet.model.dashboard import HistoryPoint, HistorySeries, HistorySeriesSpec
from hvfleet.model.meta import ObjectMeta
from hvfleet.store import Store, open_store
from hvfleet.store.base import WatchEvent, Write

MakeHv = Callable[..., Hypervisor]


@pytest.fixture(params=["sqlite", "etcd"])
def local_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    backend = {"sqlite": sqlite_backend, "etcd": etcd_backend}[request.param]
    with backend(request, tmp_path) as url:
        yield url


def _opened(url: str) -> Iterator[Store]:
    s = open_store(url)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def reader(local_url: str) -> Iterator[Store]:
    yield from _opened(local_url)


@pytest.fixture
def writer(local_url: str) -> Iterator[Store]:
    """Another store over the same data: another process's writes."""
    yield from _opened(local_url)


def _events(store: Store, since: int, count: int) -> list[WatchEvent]:
    out: list[WatchEvent] = []
    for e in store.watch("Hypervisor", since=since, timeout=3):
        out.append(e)
        if len(out) == count:
            break
    return out


def _labelled(h: Hypervisor, value: str) -> Hypervisor:
    return h.model_copy(update={"metadata": h.metadata.model_copy(update={"labels": {"x": value}})})


def test_another_writers_writes_reach_the_watches_undecoded_and_read_as_a_get_does(
    reader: Store, writer: Store, make_hypervisor: MakeHv
) -> None:
    since = reader.revision()
    writer.create(make_hypervisor("w1"), "op")
    written = writer.update_hypervisor("w1", lambda h: _labelled(h, "1"), "op")
    writer.delete("Hypervisor", "w1")
    events = _events(reader, since, 3)
    assert [(e.type, e.name) for e in events] == [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]
    assert not any(e.decoded for e in events)
    for e in events:
        assert json.loads(e.object_json()) == json.loads(e.object.to_json())
        assert e.object.metadata.resource_version == str(e.revision)
    assert events[1].object == written


def test_two_watches_of_a_store_share_one_decode(
    reader: Store, writer: Store, make_hypervisor: MakeHv
) -> None:
    since = reader.revision()
    writer.create(make_hypervisor("w2"), "op")
    first, second = _events(reader, since, 1), _events(reader, since, 1)
    assert not first[0].decoded and not second[0].decoded
    assert second[0].object is first[0].object  # one decode, for both
    third = _events(reader, since, 1)
    assert third[0].decoded and third[0].object is first[0].object  # at hand from the start


def test_a_stores_own_write_reaches_its_watches_as_another_store_decodes_it(
    reader: Store, writer: Store, make_hypervisor: MakeHv
) -> None:
    since = reader.revision()
    hv = reader.create(make_hypervisor("own"), "agent/own")
    status = hv.status.model_validate({"allocation": {"cpu": "3", "memory": "1536Mi"}})
    reader.update(hv.model_copy(update={"status": status}), "agent/own")
    mine = _events(reader, since, 2)
    theirs = _events(writer, since, 2)
    assert [e.type for e in mine] == ["ADDED", "MODIFIED"]
    assert all(e.decoded and e.stored is not None for e in mine)  # no decode, the bytes kept
    assert not any(e.decoded for e in theirs)
    assert [(e.type, e.revision, e.object) for e in mine] == [(e.type, e.revision, e.object) for e in theirs]
    assert [e.object.to_json() for e in mine] == [e.object.to_json() for e in theirs]


def test_a_write_rolled_back_leaves_nothing_at_its_revision_for_the_watches(
    reader: Store, writer: Store, make_hypervisor: MakeHv
) -> None:
    """A batch whose second write fails is rolled back after its first was put:
    the next write, another process's of the same object, may carry the
    revision the first was given (SQLite's), and the watches must see that
    write, not the one rolled back."""
    reader.create(make_hypervisor("rb1"), "op")
    reader.create(make_hypervisor("rb2"), "op")
    since = reader.revision()
    current = reader.get_hypervisor("rb1")
    with pytest.raises(AlreadyExists, match="rb2"):
        reader.write_all([Write("update", _labelled(current, "rolled-back")),
                          Write("create", make_hypervisor("rb2"))], "op")
    assert reader.revision() == since
    kept = writer.update_hypervisor("rb1", lambda h: _labelled(h, "kept"), "op")
    assert kept.metadata.resource_version == str(since + 1)
    events = _events(reader, since, 1)
    assert [(e.name, e.revision) for e in events] == [("rb1", since + 1)]
    assert events[0].object.metadata.labels == {"x": "kept"}
    assert json.loads(events[0].object_json())["metadata"]["labels"] == {"x": "kept"}


def test_a_kind_no_follower_decodes_is_not_kept_from_the_stores_own_write(
    reader: Store, make_hypervisor: MakeHv
) -> None:
    """The dashboard's history series (large, read by a get, never followed):
    the store's own write is not kept decoded for its watches, a host's is."""
    series = HistorySeries(metadata=ObjectMeta(name="hist-fleet-10s"), spec=HistorySeriesSpec(
        series="fleet", tier="10s", points=[HistoryPoint(t=10 * i, v={"cpu": ["1", "0", "8"]})
                                            for i in range(50)]))
    since = reader.revision()
    reader.create(series, "hvfleet-history")
    reader.create(make_hypervisor("kept"), "op")
    events = [e for e in reader.watch(None, since=since, timeout=1) if e.name == "kept"]
    everything = list(reader.watch_objects(since, timeout=1))
    assert [(e.kind, e.decoded) for e in everything] == [("HistorySeries", False), ("Hypervisor", True)]
    assert everything[0].object.spec.points == series.spec.points  # decoded when asked
    assert [e.decoded for e in events] == [True]
