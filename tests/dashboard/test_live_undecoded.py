"""The dashboard following undecoded events (server/dashboard/live.py): a
Hypervisor event whose stored bytes the store vouched for is applied without a
decode, its recent change told from the stored JSON, and the host decoded when
read. What a page shows must not tell the two ways apart: the same hosts, rows
and recent changes as from decoded events (hypothesis over sequences of
writes, through the real etcd feed), and the field list from the JSON equals
the one from the models (hypothesis over pairs of hosts)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvfleet.model import Hypervisor
from hvfleet.model.errors import NotFound
from hvfleet.server.dashboard.live import (
    FleetState,
    _changed_fields,
    _changed_fields_stored,
    _last_writer,
    _last_writer_stored,
)
from hvfleet.store.base import WatchEvent
from hvfleet.store.encoding import encode, vouched
from hvfleet.store.etcd import EtcdStore
from hvfleet.store.ownership import agent_manager
from tests.support.etcd_local import EtcdCluster

quantities = st.one_of(st.integers(1, 512), st.sampled_from(["1Gi", "1024Mi", "64Gi", "500m"]))
times = st.datetimes(datetime(2020, 1, 1), datetime(2030, 1, 1), timezones=st.just(UTC))


@st.composite
def hosts(draw: st.DrawFn) -> Hypervisor:
    managed = [{"manager": draw(st.sampled_from(["operator", "agent/h", "kubectl"])), "operation": "Update",
                "apiVersion": "hvfleet.io/v1", "time": draw(times).isoformat(), "fieldsType": "FieldsV1",
                "fieldsV1": {}} for _ in range(draw(st.integers(0, 3)))]
    return Hypervisor.model_validate({
        "metadata": {"name": "h", "labels": draw(st.dictionaries(st.sampled_from(["az", "rack"]),
                                                                st.sampled_from(["a", "b"]), max_size=2)),
                     "managedFields": managed},
        "spec": {"overcommit": draw(st.dictionaries(st.sampled_from(["cpu", "memory"]),
                                                    st.sampled_from([1.0, 1.5, 2.0, 4.0]), max_size=2)),
                 "maintenance": draw(st.sampled_from(["", "drain"]))},
        "status": {"capacity": draw(st.dictionaries(st.sampled_from(["cpu", "memory"]), quantities,
                                                    max_size=2)),
                   "allocation": draw(st.dictionaries(st.sampled_from(["cpu", "memory"]), quantities,
                                                      max_size=2)),
                   "lastHeartbeatTime": draw(st.one_of(st.none(), times.map(datetime.isoformat))),
                   "observedGeneration": draw(st.one_of(st.none(), st.integers(1, 5))),
                   "conditions": draw(st.sampled_from([[], [{"type": "Ready", "status": "True"}]]))},
    })


@settings(max_examples=300, deadline=None)
@given(hosts(), hosts())
def test_the_changed_fields_told_from_the_stored_json_are_the_models(a: Hypervisor, b: Hypervisor) -> None:
    doc_a = json.loads(vouched("Hypervisor", "h", encode(a)) or b"")
    doc_b = json.loads(vouched("Hypervisor", "h", encode(b)) or b"")
    assert _changed_fields_stored(doc_a, doc_b) == _changed_fields(a, b)
    assert _changed_fields_stored(None, doc_b) == _changed_fields(None, b)
    assert _last_writer_stored(doc_b) == _last_writer(b)


@settings(max_examples=300, deadline=None)
@given(hosts(), hosts(), st.sets(st.sampled_from(["overcommit", "maintenance", "capacity", "allocation",
                                                 "lastHeartbeatTime", "observedGeneration", "conditions"])))
def test_a_write_that_moves_a_few_fields_is_told_as_the_models_tell_it(a: Hypervisor, other: Hypervisor,
                                                                     moved: set[str]) -> None:
    """Most followed writes move the heartbeat and little else: the stored-JSON
    diff's quick path (equal but for the heartbeat) must agree with the models."""
    doc_a = json.loads(vouched("Hypervisor", "h", encode(a)) or b"")
    doc_o = json.loads(vouched("Hypervisor", "h", encode(other)) or b"")
    doc_b = json.loads(json.dumps(doc_a))
    for part in ("spec", "status"):
        for k in moved:
            if k in doc_o.get(part, {}) or k in doc_b.get(part, {}):
                doc_b.setdefault(part, {})[k] = doc_o.get(part, {}).get(k)
                if doc_b[part][k] is None:
                    del doc_b[part][k]
    b = Hypervisor.model_validate(doc_b)
    assert _changed_fields_stored(doc_a, doc_b) == _changed_fields(a, b)


@pytest.fixture
def etcd(etcd_session: EtcdCluster) -> Iterator[EtcdStore]:
    store = EtcdStore(etcd_session.endpoints, f"/t-{uuid.uuid4().hex[:12]}")
    store.share_watches()
    yield store
    store.close()


@pytest.fixture
def writer(etcd: EtcdStore, etcd_session: EtcdCluster) -> Iterator[EtcdStore]:
    """Another replica's store over the same objects: what it writes, `etcd`
    follows without having it decoded (its own writes it has at hand)."""
    store = EtcdStore(etcd_session.endpoints, etcd.prefix)
    yield store
    store.close()


def _followed(store: EtcdStore, since: int, until: int) -> list[WatchEvent]:
    """The Hypervisor events after `since` up to revision `until`, as the feed hands them over."""
    stop = threading.Event()
    got: list[WatchEvent] = []

    def sink(events: list[WatchEvent]) -> None:
        got.extend(events)
        if events[-1].revision >= until:
            stop.set()

    thread = threading.Thread(target=store.watch_into, args=("Hypervisor", since, sink, stop), daemon=True)
    thread.start()
    thread.join(20)
    stop.set()
    thread.join(5)
    return got


def _shown(state: FleetState) -> tuple[object, ...]:
    with state.lock:
        hosts = {n: h.to_dict() for n, h in state.hosts.items()}
        recent = {n: [{**c.to_dict(), "at": ""} for c in ring] for n, ring in state.recent.items()}
        rows = {n: x.doc for n, x in state.rows.items()}
    return hosts, recent, rows


writes = st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["status", "label", "delete"]),
                            st.integers(1, 64)), min_size=1, max_size=12)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=writes)
def test_undecoded_events_leave_the_same_hosts_rows_and_changes_as_decoded_ones(
    etcd: EtcdStore, writer: EtcdStore, steps: list[tuple[int, str, int]]
) -> None:
    prefix = uuid.uuid4().hex[:6]
    lazy, eager = FleetState(etcd), FleetState(etcd)
    since = lazy.load()
    eager.load()
    for i, what, cpu in steps:
        name = f"{prefix}-{i}"
        try:
            h = writer.get_as(Hypervisor, name)
        except NotFound:
            writer.create(Hypervisor.model_validate({"metadata": {"name": name}}), "operator")
            continue
        if what == "delete":
            writer.delete("Hypervisor", name)
        elif what == "label":
            writer.update(h.model_copy(update={"metadata": h.metadata.model_copy(
                update={"labels": {"cpu": str(cpu)}})}), "operator")
        else:
            beat = datetime.now(UTC) - timedelta(seconds=cpu)
            writer.update(h.model_copy(update={"status": h.status.model_copy(update={
                "capacity": {**h.status.capacity, **Hypervisor.model_validate(
                    {"metadata": {"name": "x"}, "status": {"capacity": {"cpu": cpu}}}).status.capacity},
                "last_heartbeat_time": beat})}), agent_manager(name))
    events = _followed(etcd, since, etcd.revision())
    assert events and not any(e.decoded for e in events)
    lazy.apply(events)
    assert not any(e.decoded for e in events)  # following decoded nothing: reading does
    eager.apply([WatchEvent(e.type, e.object, e.revision, e.last_of_revision) for e in events])
    assert _shown(lazy) == _shown(eager)
