"""Sealed stored values (hvfleet.store.encoding: `vouched`) and the follow path
that uses them: an etcd watch event whose stored bytes this model code sealed
reaches its consumers undecoded, and the API's watch line is those bytes with
the resourceVersion spliced in. Anything else (a value of an older model, one
put by hand, one changed since it was sealed) is decoded as before, so a
watch still skips an object this server cannot read.

The etcd tests use the session's real etcd (conftest.etcd_session).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.store.poison import HUGE, hypervisor_doc
from tests.support.etcd_local import EtcdCluster
from tests.support.loops import run_on_own_thread

from hvfleet.model import Hypervisor, Reservation
from hvfleet.model.lease import Lease, LeaseSpec
from hvfleet.model.meta import ObjectMeta
from hvfleet.model.resources import ResourceName
from hvfleet.server.watch import KindFanout
from hvfleet.store import encoding
from hvfleet.store.base import WatchEvent
from hvfleet.store.encoding import decode, encode, vouched, with_json_version, with_version
from hvfleet.store.etcd import EtcdStore
from hvfleet.store.etcd_transport import op_put

names = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
label_keys = st.from_regex(r"[a-z]([a-z0-9.-]{0,10}[a-z0-9])?", fullmatch=True)
label_values = st.from_regex(r"([A-Za-z0-9]([A-Za-z0-9_.-]{0,10}[A-Za-z0-9])?)?", fullmatch=True)
# Annotation values may hold anything, the splice's own marker and JSON whitespace included.
texts = st.one_of(st.text(max_size=30), st.just('"metadata":{'), st.just('}\n\t \r'), st.just("\u00e9\u2028"))
quantities = st.one_of(st.integers(1, 2**40).map(str), st.integers(1, 4096).map(lambda n: f"{n}Gi"),
                       st.integers(1, 999).map(lambda n: f"{n}m"))
resources = st.sampled_from(["cpu", "memory", "VGPU", "hugepages-2Mi"])
ratios = st.floats(0.05, 64, allow_nan=False).map(lambda f: round(f, 3))
Resource = Hypervisor | Reservation | Lease
times = st.datetimes(datetime(2000, 1, 1), datetime(2100, 1, 1), timezones=st.just(UTC))


@st.composite
def stored_objects(draw: st.DrawFn) -> Hypervisor | Reservation | Lease:
    """Objects of the three kinds a fleet writes most, over many of their fields."""
    meta = ObjectMeta(name=draw(names), labels=draw(st.dictionaries(label_keys, label_values, max_size=3)),
                      annotations=draw(st.dictionaries(label_keys, texts, max_size=3)),
                      generation=draw(st.integers(1, 2**40)),
                      uid=str(uuid.UUID(int=draw(st.integers(0, 2**64 - 1)))),
                      creation_timestamp=draw(times))
    kind = draw(st.sampled_from(["Hypervisor", "Reservation", "Lease"]))
    if kind == "Lease":
        return Lease(metadata=meta, spec=LeaseSpec(holder_identity=f"agent/{meta.name}",
                                                   renew_time=draw(times),
                                                   lease_duration_seconds=draw(st.integers(1, 3600))))
    res = draw(st.dictionaries(resources, quantities, min_size=1, max_size=3))
    if kind == "Reservation":
        return Reservation.model_validate({
            "metadata": meta.to_dict(), "spec": {"hypervisor": draw(names), "consumer": draw(names),
                                                 "resources": res}})
    return Hypervisor.model_validate({
        "metadata": meta.to_dict(),
        "spec": {"overcommit": draw(st.dictionaries(resources, ratios, max_size=2)),
                 "maintenance": draw(st.sampled_from(["", "drain"]))},
        "status": {"capacity": res, "allocation": draw(st.dictionaries(resources, quantities, max_size=2)),
                   "lastHeartbeatTime": draw(times).isoformat(),
                   "instances": [{"uuid": str(uuid.UUID(int=i)), "name": f"vm{i}", "state": "running"}
                                 for i in range(draw(st.integers(0, 3)))]}})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stored_objects(), st.integers(1, 2**62))
def test_the_line_from_sealed_bytes_is_the_decoded_objects_json(obj: Resource, rev: int) -> None:
    value = encode(with_version(obj, 3))
    raw = vouched(obj.kind, obj.metadata.name, value)
    assert raw is not None
    decoded = decode(obj.kind, value, rev)
    assert json.loads(with_json_version(raw, rev)) == json.loads(decoded.to_json())
    # The seal is whitespace: any JSON reader (an older hvfleet too) reads the object.
    assert json.loads(value) == json.loads(raw)



@given(stored_objects(), st.data())
@settings(max_examples=100, deadline=None)
def test_a_changed_or_moved_value_is_not_vouched_for(obj: Resource, data: st.DataObject) -> None:
    value = encode(obj)
    kind, name = obj.kind, obj.metadata.name
    assert vouched(kind, name, value) is not None
    assert vouched(kind, name + "x", value) is None  # put under another name
    assert vouched("Lease" if kind != "Lease" else "Hypervisor", name, value) is None
    raw = value[:-16]
    assert vouched(kind, name, raw) is None  # no seal: an older hvfleet's value
    assert vouched(kind, name, raw + b" " * 16) is None
    at = data.draw(st.integers(0, len(raw) - 2))  # one byte of the JSON changed, the seal kept
    changed = raw[:at] + bytes([raw[at] ^ data.draw(st.integers(1, 255))]) + raw[at + 1:]
    assert vouched(kind, name, changed + value[-16:]) is None


def test_a_value_sealed_by_other_model_code_is_not_vouched_for(
    make_hypervisor: Callable[..., Hypervisor]
) -> None:
    h = make_hypervisor("other-model")
    value = encode(h)
    raw = value[:-16]
    # The same object sealed under another fingerprint (another build of the model).
    crc = zlib.crc32(raw, zlib.crc32(b"Hypervisor/other-model", encoding._FINGERPRINT ^ 1))
    foreign = raw + bytes(b" \t\n\r"[(crc >> s) & 3] for s in range(30, -2, -2))
    assert vouched("Hypervisor", "other-model", value) == raw
    assert vouched("Hypervisor", "other-model", foreign) is None
    assert decode("Hypervisor", foreign, 5) == decode("Hypervisor", value, 5)


# -- the follow path ----------------------------------------------------------------------


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


def _put(store: EtcdStore, kind: str, name: str, value: bytes) -> int:
    """`value` stored as `kind` `name` behind hvfleet's back (as etcdctl would);
    the revision it was stored at."""
    return store.transport.txn([], [op_put(store._key(kind, name), value)], what="put by hand").revision


def _followed(store: EtcdStore, kind: str, since: int, count: int, seconds: float = 15) -> list[WatchEvent]:
    """`count` events of a long-lived watch (served by the shared feed), undecoded as they came."""
    stop = threading.Event()
    got: list[WatchEvent] = []

    def sink(events: list[WatchEvent]) -> None:
        got.extend(events)
        if len(got) >= count:
            stop.set()

    thread = threading.Thread(target=store.watch_into, args=(kind, since, sink, stop), daemon=True)
    thread.start()
    thread.join(seconds)
    stop.set()
    thread.join(5)
    return got


def test_a_followed_write_reaches_the_feeds_watches_undecoded_and_reads_as_the_store_does(
    etcd: EtcdStore, writer: EtcdStore, make_hypervisor: Callable[..., Hypervisor]
) -> None:
    since = etcd.revision()
    writer.create(make_hypervisor("f1", metadata={"labels": {"az": "a"}}), "op")
    written = writer.update_hypervisor("f1", lambda h: h.model_copy(update={"metadata": h.metadata.model_copy(
        update={"labels": {"az": "b"}})}), "op")
    writer.delete("Hypervisor", "f1")
    events = _followed(etcd, "Hypervisor", since, 3)
    assert [(e.type, e.name) for e in events] == [("ADDED", "f1"), ("MODIFIED", "f1"), ("DELETED", "f1")]
    assert not any(e.decoded for e in events)  # the watch took them without a decode
    for e in events:
        assert json.loads(e.object_json()) == json.loads(e.object.to_json())
    assert events[1].object == written
    assert events[2].object.metadata.resource_version == str(events[2].revision)


def test_a_stores_own_write_reaches_its_watches_with_the_object_it_wrote(
    etcd: EtcdStore, make_hypervisor: Callable[..., Hypervisor]
) -> None:
    """Its own writes a store has decoded already (the encoding check read them
    back): the event carries that object, and still the stored bytes for the line."""
    since = etcd.revision()
    written = etcd.create(make_hypervisor("own"), "op")
    events = _followed(etcd, "Hypervisor", since, 1)
    assert [(e.name, e.decoded) for e in events] == [("own", True)]
    assert events[0].object == written and events[0].stored is not None
    assert json.loads(events[0].object_json()) == json.loads(written.to_json())


def test_a_poisoned_value_under_a_copied_seal_is_still_skipped(
    etcd: EtcdStore, make_hypervisor: Callable[..., Hypervisor]
) -> None:
    """A sealed value changed by hand (a capacity no reader accepts), its seal
    left in place: the seal no longer matches, so it is decoded, and skipped."""
    good = encode(make_hypervisor("spoiled", status={"capacity": {"cpu": "8"}}))
    assert b'"cpu":"8"' in good
    spoiled = good.replace(b'"cpu":"8"', b'"cpu":"' + HUGE.encode() + b'"')
    since = etcd.revision()
    _put(etcd, "Hypervisor", "spoiled", spoiled)
    etcd.create(make_hypervisor("after"), "op")
    events = _followed(etcd, "Hypervisor", since, 1)
    assert [e.name for e in events] == ["after"]
    shared = etcd.watch("Hypervisor", since=since, timeout=2)  # a watch's own stream: the same
    assert [e.object.metadata.name for e in shared] == ["after"]


def test_an_object_of_an_older_model_reaches_watchers_with_the_new_defaults(etcd: EtcdStore) -> None:
    """Bytes without a seal (an older hvfleet's write) are decoded: the watch line
    is the model's JSON, with the fields the older model did not write."""
    old = hypervisor_doc("older", capacity={"cpu": "8"})
    del old["spec"]
    since = etcd.revision()
    rev = _put(etcd, "Hypervisor", "older", json.dumps(old, sort_keys=True, separators=(",", ":")).encode())
    events = _followed(etcd, "Hypervisor", since, 1)
    assert [(e.name, e.revision) for e in events] == [("older", rev)]
    assert events[0].decoded
    fanout = KindFanout(etcd, "Hypervisor", 10)
    try:
        line = json.loads(fanout.encoded(events[0]))
    finally:
        fanout.close()
    assert line["type"] == "ADDED"
    assert line["object"] == json.loads(events[0].object.to_json())
    assert "spec" in line["object"] and "allocation" in line["object"]["status"]  # the defaults
    assert line["object"]["metadata"]["resourceVersion"] == str(rev)


def test_the_fanouts_line_from_the_stored_bytes_is_the_line_from_the_object(
    etcd: EtcdStore, writer: EtcdStore, make_hypervisor: Callable[..., Hypervisor]
) -> None:
    """What an API watcher receives (KindFanout.encoded, shared by its clients)
    for an undecoded event equals, in content, the line of the decoded object."""
    fanout = KindFanout(etcd, "Hypervisor", 100)
    try:
        since = fanout.position

        async def follow() -> list[WatchEvent]:
            sub, replay, _ = fanout.subscribe(since, None, 100, asyncio.get_running_loop())
            got = list(replay)
            deadline = time.monotonic() + 15
            while len(got) < 2 and time.monotonic() < deadline:
                events, _ = await sub.next_batch(0.5)
                got += events
            fanout.unsubscribe(sub)
            return got

        writer.create(make_hypervisor("line1", metadata={"annotations": {"note": '"metadata":{ }\n'}}), "op")
        writer.update_hypervisor("line1", lambda h: h.model_copy(update={"spec": h.spec.model_copy(
            update={"overcommit": {ResourceName.parse("cpu"): 2.5}})}), "op")
        events = run_on_own_thread(follow())
        assert [e.type for e in events] == ["ADDED", "MODIFIED"]
        assert not any(e.decoded for e in events)
        for e in events:
            line = fanout.encoded(e)
            assert line.endswith(b"}\n") and b"\n" not in line[:-1]
            assert json.loads(line) == {"type": e.type, "object": json.loads(e.object.to_json())}
        assert events[1].object.spec.overcommit == {ResourceName.parse("cpu"): 2.5}
    finally:
        fanout.close()


def test_a_lease_renewal_is_sealed_on_every_write(etcd: EtcdStore) -> None:
    now = datetime.now(UTC)
    lease = Lease(metadata=ObjectMeta(name="sealed-lease"),
                  spec=LeaseSpec(holder_identity="agent/sealed-lease", renew_time=now))
    etcd.create(lease, "agent/sealed-lease")
    kvs, _, _ = etcd.transport.range(etcd._key("Lease", "sealed-lease"))
    assert vouched("Lease", "sealed-lease", kvs[0].value) is not None


def test_a_followed_write_stays_at_hand_for_the_next_write_naming_its_version(
    etcd: EtcdStore, writer: EtcdStore, make_hypervisor: Callable[..., Hypervisor]
) -> None:
    """A replica following another's write (undecoded) still has the object at
    hand when a client names that version to it (an agent that moved to this
    replica), as it had when the follow path decoded it: no read again."""
    since = etcd.revision()
    written = writer.create(make_hypervisor("moved"), "op")
    events = _followed(etcd, "Hypervisor", since, 1)
    assert [(e.name, e.decoded) for e in events] == [("moved", False)]
    assert etcd.at_hand("Hypervisor", "moved", written.metadata.resource_version) == written
