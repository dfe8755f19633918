"""What only the etcd backend has: URLs and prefixes, unreachable endpoints,
compaction, watch resumption across a restart, liveness leases.

Uses the session's real etcd (conftest.etcd_session) unless a test needs its
own member to stop and start.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.support.etcd_local import EtcdCluster, free_port

from hvfleet.model import Gone, Hypervisor, InvalidInput, NotFound, Unavailable
from hvfleet.model.lease import renewed
from hvfleet.store import etcd as etcd_backend
from hvfleet.store import open_store
from hvfleet.store.etcd import EtcdStore, parse_etcd_url
from hvfleet.store.ownership import agent_manager

MakeHv = Callable[..., Hypervisor]


@pytest.fixture
def etcd(etcd_session: EtcdCluster) -> Iterator[EtcdStore]:
    store = EtcdStore(etcd_session.endpoints, f"/t-{uuid.uuid4().hex[:12]}")
    yield store
    store.close()


def test_prefix_comes_from_argument_then_url_then_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HVFLEET_STORE_PREFIX", "/from-env")
    assert getattr(open_store("etcd://127.0.0.1:1"), "prefix", None) == "/from-env"
    assert getattr(open_store("etcd://127.0.0.1:1?prefix=/u"), "prefix", None) == "/u"
    assert getattr(open_store("etcd://127.0.0.1:1?prefix=/u", prefix="/arg"), "prefix", None) == "/arg"
    monkeypatch.delenv("HVFLEET_STORE_PREFIX")
    assert getattr(open_store("etcd://127.0.0.1:1"), "prefix", None) == "/hvfleet"


def test_urls_name_endpoints_prefix_and_timeout() -> None:
    assert parse_etcd_url("etcd://127.0.0.1:2379,10.0.0.2:2379?prefix=/fleet-a&timeout=3") == (
        ["127.0.0.1:2379", "10.0.0.2:2379"],
        {"prefix": "/fleet-a", "timeout": "3"},
    )
    for bad, what in [
        ("etcd://", "not an etcd URL"),
        ("etcd://host", "'host' in 'etcd://host' is not HOST:PORT"),
        ("etcd://h:99999", "not HOST:PORT"),
        ("etcd://h:1?colour=red", "unknown option 'colour'"),
        ("etcd://h:1?timeout=soon", "not a number of seconds"),
        ("etcd://h:1?prefix=/a/../b", "store prefix"),
    ]:
        with pytest.raises(InvalidInput, match=what):
            open_store(bad)
    store = open_store("etcd://127.0.0.1:1", prefix="fleet-b/")
    assert isinstance(store, EtcdStore) and store.prefix == "/fleet-b"
    assert store.url == "etcd://127.0.0.1:1?prefix=/fleet-b"


def test_prefixes_keep_fleets_apart(etcd_session: EtcdCluster, make_hypervisor: MakeHv) -> None:
    a = open_store(etcd_session.url(), prefix=f"/a-{uuid.uuid4().hex[:8]}")
    b = open_store(etcd_session.url(f"/b-{uuid.uuid4().hex[:8]}"))
    a.create(make_hypervisor("hv1"), "operator")
    assert [h.name for h in a.list_hypervisors()] == ["hv1"]
    assert b.list_hypervisors() == []
    with pytest.raises(NotFound):
        b.get("Hypervisor", "hv1")
    b.create(make_hypervisor("hv1"), "operator")  # the same name in another fleet
    a.close()
    b.close()


def test_resource_version_is_the_etcd_mod_revision(etcd: EtcdStore, make_hypervisor: MakeHv) -> None:
    h = etcd.create(make_hypervisor("hv1"), "operator")
    kvs, revision, _ = etcd._range(f"{etcd.prefix}/objects/Hypervisor/hv1")
    assert h.metadata.resource_version == str(kvs[0].mod_revision) == str(revision)
    assert b"resourceVersion" not in kvs[0].value  # stored once, by etcd itself
    assert etcd.revision() == revision


def test_list_pages_through_many_objects_at_one_revision(
    etcd: EtcdStore, make_hypervisor: MakeHv, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hvfleet.store import etcd as etcd_module

    monkeypatch.setattr(etcd_module, "LIST_PAGE", 7)
    for i in range(30):
        etcd.create(make_hypervisor(f"hv{i:02d}", metadata={"labels": {"odd": str(i % 2)}}), "op")
    listed = etcd.list("Hypervisor")
    assert [h.name for h in listed.items] == [f"hv{i:02d}" for i in range(30)]
    assert listed.revision == etcd.revision()
    assert len(etcd.list("Hypervisor", "odd=1").items) == 15


def _refused_port() -> int:
    return free_port()  # nothing listens there


@pytest.mark.timeout(60)
def test_unreachable_endpoint_is_unavailable_naming_it_in_bounded_time() -> None:
    port = _refused_port()
    store = open_store(f"etcd://127.0.0.1:{port}?timeout=2")
    t0 = time.monotonic()
    with pytest.raises(Unavailable, match=f"127.0.0.1:{port}.*connection refused"):
        store.list("Hypervisor")
    assert time.monotonic() - t0 < 4


@pytest.mark.timeout(60)
def test_endpoint_that_never_answers_is_unavailable_not_a_hang() -> None:
    # A socket that accepts connections (the kernel completes the handshake) but
    # never answers: the worst case, a wedged or half-dead member.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        store = open_store(f"etcd://127.0.0.1:{port}?timeout=2")
        t0 = time.monotonic()
        with pytest.raises(Unavailable, match=f"127.0.0.1:{port}.*no answer"):
            store.get("Hypervisor", "hv1")
        assert time.monotonic() - t0 < 4
        t0 = time.monotonic()
        with pytest.raises(Unavailable, match=f"127.0.0.1:{port}"):
            list(store.watch("Hypervisor"))
        assert time.monotonic() - t0 < 10


def test_default_bound_is_finite() -> None:
    store = open_store("etcd://127.0.0.1:1")
    assert isinstance(store, EtcdStore)
    assert 0 < store.unavailable_after <= 30 and 0 < store.request_timeout <= 10


def test_one_dead_endpoint_among_live_ones_is_skipped(
    etcd_session: EtcdCluster, make_hypervisor: MakeHv
) -> None:
    dead = f"127.0.0.1:{_refused_port()}"
    store = EtcdStore([dead, *etcd_session.endpoints], f"/t-{uuid.uuid4().hex[:8]}")
    store.create(make_hypervisor("hv1"), "operator")
    assert store.endpoint != dead
    store.close()


def test_watch_from_compacted_revision_is_gone(tmp_path: Path, make_hypervisor: MakeHv) -> None:
    # Its own member: compaction is cluster-wide and would take history from other tests.
    with EtcdCluster(tmp_path / "compact", size=1) as cluster:
        etcd = EtcdStore(cluster.endpoints, "/compact")
        _check_compaction_is_gone(etcd, make_hypervisor)
        etcd.close()


def _check_compaction_is_gone(etcd: EtcdStore, make_hypervisor: MakeHv) -> None:
    start = etcd.revision()
    for i in range(5):
        etcd.create(make_hypervisor(f"hv{i}"), "operator")
    etcd.compact(etcd.revision())
    with pytest.raises(Gone, match=f"revision {start} was compacted"):
        list(etcd.watch("Hypervisor", since=start, timeout=2))
    # Listing still works and its revision is a valid place to watch from.
    listed = etcd.list("Hypervisor")
    assert len(listed.items) == 5
    etcd.create(make_hypervisor("hv9"), "operator")
    assert [e.object.name for e in etcd.watch("Hypervisor", since=listed.revision, timeout=0.5)] == [
        "hv9"
    ]


def test_watch_stops_promptly_when_asked(etcd: EtcdStore) -> None:
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    t0 = time.monotonic()
    assert list(etcd.watch("Hypervisor", since=etcd.revision(), stop=stop)) == []
    assert time.monotonic() - t0 < 2


@pytest.mark.timeout(90)
def test_watch_resumes_across_a_restart_without_loss_or_repeat(
    tmp_path: Path, make_hypervisor: MakeHv
) -> None:
    with EtcdCluster(tmp_path / "one", size=1) as cluster:
        store = EtcdStore(cluster.endpoints, "/resume", unavailable_after=30)
        writer = EtcdStore(cluster.endpoints, "/resume", unavailable_after=30)
        since = store.revision()
        seen: list[tuple[str, int]] = []
        errors: list[BaseException] = []
        stop = threading.Event()

        def watch() -> None:
            try:
                for e in store.watch("Hypervisor", since=since, stop=stop):
                    seen.append((e.object.name, e.revision))
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=watch)
        t.start()
        for i in range(20):
            writer.create(make_hypervisor(f"before{i}"), "op")
        time.sleep(0.3)
        cluster.members[0].kill()  # the watch connection drops mid-stream
        cluster.start()
        for i in range(20):
            writer.create(make_hypervisor(f"after{i}"), "op")
        deadline = time.monotonic() + 20
        while len(seen) < 40 and time.monotonic() < deadline and not errors:
            time.sleep(0.05)
        stop.set()
        t.join(10)
        assert not errors, errors
        names = [n for n, _ in seen]
        assert names == [f"before{i}" for i in range(20)] + [f"after{i}" for i in range(20)]
        revs = [r for _, r in seen]
        assert revs == sorted(set(revs))
        store.close()
        writer.close()


def test_object_over_etcds_request_limit_is_invalid_input_naming_it(
    etcd: EtcdStore, make_hypervisor: MakeHv
) -> None:
    # Inside every bound of the model (docs/security.md), past etcd's: 2,100
    # guests with long domain names in the status its agent writes.
    huge = make_hypervisor("hv-huge", status={"instances": [
        {"uuid": f"u-{i}", "name": "x" * 1000, "state": "running"} for i in range(2100)]})
    with pytest.raises(InvalidInput, match=r"create Hypervisor hv-huge: \d+ bytes is more than etcd"):
        etcd.create(huge, "agent/hv-huge")
    with pytest.raises(NotFound):
        etcd.get("Hypervisor", "hv-huge")


def test_a_batch_over_etcds_transaction_limit_is_too_large_and_writes_nothing(
    etcd: EtcdStore, make_hypervisor: MakeHv
) -> None:
    from hvfleet.model.errors import TooLarge
    from hvfleet.store.base import Write

    # etcd's --max-txn-ops is 128 by default: 129 puts cannot be one transaction.
    batch = [Write("create", make_hypervisor(f"hv{i:03d}")) for i in range(129)]
    with pytest.raises(TooLarge, match="max-txn-ops"):
        etcd.write_all(batch, "operator")
    assert etcd.list_hypervisors() == []
    assert len(etcd.write_all(batch[:128], "operator")) == 128


def test_one_batch_is_one_revision_and_a_watch_delivers_all_of_it(
    etcd: EtcdStore, make_hypervisor: MakeHv
) -> None:
    from hvfleet.store.base import Write

    start = etcd.revision()
    out = etcd.write_all([Write("create", make_hypervisor(f"hv{i}")) for i in range(3)], "op")
    assert len({o.metadata.resource_version for o in out}) == 1
    events = list(etcd.watch("Hypervisor", since=start, timeout=0.5))
    assert [e.object.metadata.name for e in events] == ["hv0", "hv1", "hv2"]
    assert [e.last_of_revision for e in events] == [False, False, True]


def _posts_of(etcd: EtcdStore) -> list[str]:
    """The gateway paths `etcd` posts to from now on, in order (kept in the list returned)."""
    posts: list[str] = []
    real = etcd.transport.post

    def counted(path: str, body: dict, what: str) -> tuple[dict, bool]:  # type: ignore[type-arg]
        posts.append(path)
        return real(path, body, what)

    etcd.transport.post = counted  # type: ignore[method-assign]
    return posts


def test_a_lease_renewal_is_one_request(etcd: EtcdStore) -> None:
    etcd.keepalive("hv1", 30)
    posts = _posts_of(etcd)
    etcd.keepalive("hv1", 30)
    assert posts == ["kv/txn"]  # the CAS update, no read before it
    # Another store of the same agent renewed it: the next renewal reads, then writes.
    other = EtcdStore(etcd.endpoints, etcd.prefix)
    other.keepalive("hv1", 30)
    other.close()
    posts.clear()
    renewed = etcd.keepalive("hv1", 30)
    assert posts == ["kv/txn", "kv/range", "kv/txn"]
    assert etcd.get("Lease", "hv1") == renewed


def test_a_batch_naming_versions_this_store_holds_is_one_request_and_still_compared(
    etcd: EtcdStore, make_hypervisor: MakeHv
) -> None:
    """A batch of creates and of updates naming the versions this store last
    wrote (a server rewriting the same provider records) is written without
    a read first; its compares still refuse what moved on since."""
    from hvfleet.model.errors import AlreadyExists, Conflict
    from hvfleet.store.base import Write

    def labelled(obj: Hypervisor, value: str) -> Hypervisor:
        return obj.model_copy(update={"metadata": obj.metadata.model_copy(update={"labels": {"x": value}})})

    hv1, hv2 = etcd.write_all([Write("create", make_hypervisor("hv1")),
                               Write("create", make_hypervisor("hv2"))], "op")
    assert isinstance(hv1, Hypervisor) and isinstance(hv2, Hypervisor)
    posts = _posts_of(etcd)
    etcd.write_all([Write("update", labelled(hv1, "1")), Write("create", make_hypervisor("hv3"))], "op")
    assert posts == ["kv/txn"]
    assert etcd.get_hypervisor("hv1").metadata.labels == {"x": "1"}
    # Another store moves hv2 on: a write naming the version this store holds is refused.
    other = EtcdStore(etcd.endpoints, etcd.prefix)
    other.update(labelled(hv2, "theirs"), "op")
    other.close()
    with pytest.raises(Conflict, match="hv2"):
        etcd.write_all([Write("update", labelled(hv2, "mine"))], "op")
    assert etcd.get_hypervisor("hv2").metadata.labels == {"x": "theirs"}
    # A create over an existing object refuses the batch: nothing of it is written.
    current = etcd.get_hypervisor("hv1")
    posts.clear()
    with pytest.raises(AlreadyExists, match="hv3"):
        etcd.write_all([Write("update", labelled(current, "2")),
                        Write("create", make_hypervisor("hv3"))], "op")
    assert posts == ["kv/txn"]
    assert etcd.get_hypervisor("hv1").metadata.labels == {"x": "1"}


def test_a_writers_own_watch_events_equal_what_another_process_decodes(
    etcd: EtcdStore, etcd_session: EtcdCluster, make_hypervisor: MakeHv
) -> None:
    """A write hands its watches the object its encoding check read back
    instead of decoding the same bytes again: that object must be exactly
    what any other reader decodes from etcd at that revision."""
    since = etcd.revision()
    hv = etcd.create(make_hypervisor("shared-decode"), "agent/shared-decode")
    status = hv.status.model_validate({"allocation": {"cpu": "3", "memory": "1536Mi"}})
    etcd.update(hv.model_copy(update={"status": status}), "agent/shared-decode")
    other = EtcdStore(etcd_session.endpoints, etcd.prefix)
    try:
        mine = list(etcd.watch("Hypervisor", since=since, timeout=1.0))
        theirs = list(other.watch("Hypervisor", since=since, timeout=1.0))
    finally:
        other.close()
    assert [e.type for e in mine] == ["ADDED", "MODIFIED"]
    assert [(e.type, e.revision, e.object) for e in mine] == \
        [(e.type, e.revision, e.object) for e in theirs]
    assert [e.object.to_json() for e in mine] == [e.object.to_json() for e in theirs]


def test_a_renewal_naming_the_stores_own_last_write_is_one_transaction_that_decodes_nothing(
    etcd: EtcdStore, etcd_session: EtcdCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent renews its Lease naming the version its last renewal was
    answered: the backend holds that object decoded already (its encoding
    check read the bytes back), so the renewal reads nothing, decodes nothing
    and is one etcd transaction; what it answers is what any reader decodes."""
    holder, start = agent_manager("hv-renew"), datetime.now(UTC)
    lease = etcd.create(renewed(None, "hv-renew", holder, 30, start), holder)
    posts: list[str] = []
    decodes: list[Any] = []
    post, decode = etcd.transport.post, etcd_backend.decode

    def counted_post(path: str, *args: Any, **kwargs: Any) -> Any:
        posts.append(path)
        return post(path, *args, **kwargs)

    def counted_decode(*args: Any, **kwargs: Any) -> Any:
        decodes.append(args[:2])
        return decode(*args, **kwargs)

    # The real requests and decodes, counted.
    monkeypatch.setattr(etcd.transport, "post", counted_post)
    monkeypatch.setattr(etcd_backend, "decode", counted_decode)
    for i in range(1, 4):
        current = etcd.get_for_write("Lease", "hv-renew", lease.metadata.resource_version)
        assert current == lease
        lease = etcd.update(renewed(current, "hv-renew", holder, 30, start + timedelta(seconds=10 * i)),
                            holder)
    assert posts == ["kv/txn"] * 3
    assert decodes == []
    other = EtcdStore(etcd_session.endpoints, etcd.prefix)
    try:
        stored = other.get("Lease", "hv-renew")
    finally:
        other.close()
    assert stored == lease and stored.to_json() == lease.to_json()


def test_an_update_awaited_on_an_event_loop_is_the_same_write_as_update(etcd: EtcdStore) -> None:
    """`update_on_loop` (a server's Lease renewal with no thread crossed) over
    the object `at_hand` answers: the same stored object as `update` would
    answer and any reader decodes, a watch event, the store's own rules
    (only the Lease's agent writes it) and its compare-and-swap (a version
    that moved on is StaleVersion, nothing written)."""
    from tests.support.loops import run_on_own_thread

    from hvfleet.model.errors import Forbidden
    from hvfleet.store.base import StaleVersion

    holder, start = agent_manager("hv-loop"), datetime.now(UTC)
    first = etcd.create(renewed(None, "hv-loop", holder, 30, start), holder)
    assert etcd.writes_on_loop
    assert etcd.at_hand("Lease", "hv-loop", first.metadata.resource_version) == first
    assert etcd.at_hand("Lease", "hv-loop", "999999") is None  # never seen: not at hand
    since = etcd.revision()

    async def renew(current: Any, at: datetime, manager: str = holder) -> Any:
        return await etcd.update_on_loop(current, renewed(current, "hv-loop", holder, 30, at), manager)

    second = run_on_own_thread(renew(first, start + timedelta(seconds=10)))
    assert second == etcd.get("Lease", "hv-loop")
    assert int(second.metadata.resource_version) > int(first.metadata.resource_version)
    assert second.spec.renew_time is not None and first.spec.renew_time is not None
    assert second.spec.renew_time > first.spec.renew_time
    with pytest.raises(Forbidden, match="written only by 'agent/hv-loop'"):
        run_on_own_thread(renew(second, start + timedelta(seconds=20), manager=agent_manager("hv-other")))
    # The version the first renewal replaced is still at hand (the store wrote
    # it), but it moved on: the transaction refuses it.
    with pytest.raises(StaleVersion, match="is stale"):
        run_on_own_thread(renew(first, start + timedelta(seconds=30)))
    assert etcd.get("Lease", "hv-loop") == second  # neither refusal wrote
    events = list(etcd.watch("Lease", since=since, timeout=1.0))
    assert [(e.type, e.object.metadata.resource_version) for e in events] == [
        ("MODIFIED", second.metadata.resource_version)]
