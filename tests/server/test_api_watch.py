"""Watch over HTTP: events in order, bookmarks, 410 Expired after compaction,
timeoutSeconds, Table events, the per-token cap, and a slow watcher that never
delays the others."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from hvfleet.server.context import Limits
from hvfleet.server.watch import WatchLimits
from hvfleet.store import sqlite as sqlite_backend
from tests.server.conftest import Api
from tests.server.objects import HV, TABLE, hypervisor, status_of
from tests.server.watching import Watcher, names


def test_watch_from_a_list_sees_every_change_in_order(api: Api) -> None:
    c = api.client()
    c.post(HV, json=hypervisor("hv0"))
    rv = c.get(HV).json()["metadata"]["resourceVersion"]
    w = Watcher(api, {"resourceVersion": rv})
    c.post(HV, json=hypervisor("hv1"))
    c.patch(f"{HV}/hv1", {"spec": {"maintenance": "drain"}})
    c.delete(f"{HV}/hv0")
    w.wait_for(lambda ev: len(ev) >= 3)
    assert names(w.kinds()) == [("ADDED", "hv1"), ("MODIFIED", "hv1"), ("DELETED", "hv0")]
    revisions = [int(e["object"]["metadata"]["resourceVersion"]) for e in w.kinds()]
    assert revisions == sorted(revisions) and revisions[0] > int(rv)
    w.close()


def test_watch_without_version_starts_with_the_current_objects(api: Api) -> None:
    c = api.client()
    for n in ("hv0", "hv1", "hv2"):
        c.post(HV, json=hypervisor(n))
    w = Watcher(api, {"fieldSelector": "metadata.name=hv1"})
    c.patch(f"{HV}/hv2", {"spec": {"maintenance": "drain"}})
    c.patch(f"{HV}/hv1", {"spec": {"maintenance": "drain"}})
    w.wait_for(lambda ev: len(ev) >= 2)
    assert names(w.kinds()) == [("ADDED", "hv1"), ("MODIFIED", "hv1")]
    w.close()


def test_bookmarks_carry_a_version_every_event_up_to_has_been_sent(make_api: Callable[..., Api]) -> None:
    api = make_api(Limits(watch=WatchLimits(bookmark_interval=0.2)))
    c = api.client()
    c.post(HV, json=hypervisor("hv0"))
    w = Watcher(api, {"resourceVersion": "1", "allowWatchBookmarks": "true"})
    c.post(HV, json=hypervisor("hv1"))
    w.wait_for(lambda ev: any(e["type"] == "BOOKMARK" for e in ev) and len(names(ev)) >= 1)
    bookmark = next(e for e in w.kinds() if e["type"] == "BOOKMARK")
    assert bookmark["object"]["kind"] == "Hypervisor"
    assert int(bookmark["object"]["metadata"]["resourceVersion"]) >= 2
    w.close()
    # Without allowWatchBookmarks, none.
    w = Watcher(api, {"resourceVersion": "2", "timeoutSeconds": "1"})
    assert w.done.wait(30)
    assert all(e["type"] != "BOOKMARK" for e in w.kinds())


def test_timeout_seconds_ends_the_watch(api: Api) -> None:
    start = time.monotonic()
    w = Watcher(api, {"resourceVersion": "0", "timeoutSeconds": "1"})
    assert w.done.wait(30)
    assert 0.9 <= time.monotonic() - start < 5


def test_watch_from_a_compacted_version_is_410_expired(
    make_api: Callable[..., Api], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_backend, "EVENT_HISTORY", 5)
    monkeypatch.setattr(sqlite_backend, "_COMPACT_EVERY", 5)
    api = make_api()
    c = api.client()
    for i in range(12):
        c.post(HV, json=hypervisor(f"hv{i}"))
    w = Watcher(api, {"resourceVersion": "1"})
    assert w.done.wait(30)
    (event,) = w.kinds()
    assert event["type"] == "ERROR"
    status_of(410, "Expired", event["object"])
    # A version still in the store's history is served, though older than the fan-out's.
    w = Watcher(api, {"resourceVersion": str(api.store.revision() - 2), "timeoutSeconds": "1"})
    assert w.done.wait(30)
    assert names(w.kinds()) == [("ADDED", "hv10"), ("ADDED", "hv11")]


def test_table_watch_events_are_tables(api: Api) -> None:
    c = api.client()
    w = Watcher(api, {"resourceVersion": "0"}, headers={"Accept": TABLE})
    c.post(HV, json=hypervisor("hv1"))
    w.wait_for(lambda ev: len(ev) >= 1)
    event = w.kinds()[0]
    assert event["type"] == "ADDED" and event["object"]["kind"] == "Table"
    assert event["object"]["rows"][0]["cells"][0] == "hv1"
    w.close()


def test_watches_per_token_are_capped(make_api: Callable[..., Api]) -> None:
    api = make_api(Limits(watch=WatchLimits(per_token=2)))
    first = [Watcher(api, {"resourceVersion": "0"}) for _ in range(2)]
    time.sleep(0.3)
    r = api.client().get(HV, params={"watch": "true"}, timeout=5)
    status_of(429, "TooManyRequests", r.json())
    # Another token has its own slots.
    other = Watcher(api, {"resourceVersion": "0", "timeoutSeconds": "1"}, token="viewer-token")
    assert other.done.wait(30) and other.status == 200
    for w in first:
        w.close()
    deadline = time.monotonic() + 10
    while api.server.server.started and time.monotonic() < deadline:
        r = api.client().get(HV, params={"watch": "true", "timeoutSeconds": "1"}, timeout=5)
        if r.status_code == 200:
            break
        time.sleep(0.1)
    assert r.status_code == 200


def test_a_slow_watcher_never_delays_the_others_and_is_dropped(make_api: Callable[..., Api]) -> None:
    # A fan-out that waited for the slow client would hold every event for the
    # whole send timeout before dropping it: 5 s, far above what the fast
    # watcher may see even on a loaded machine.
    api = make_api(Limits(watch=WatchLimits(queue=20, send_timeout=5.0)))
    c = api.client()
    # The slow client: asks for a watch and then never reads its socket.
    slow = socket.create_connection(("127.0.0.1", api.server.port))
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.sendall(f"GET {HV}?watch=true&resourceVersion=0 HTTP/1.1\r\nHost: x\r\n"
                 "Authorization: Bearer viewer-token\r\n\r\n".encode())
    fast = Watcher(api, {"resourceVersion": "0"})
    time.sleep(0.3)
    payload = "x" * 30_000
    written: dict[str, float] = {}
    n = 300
    for i in range(n):
        doc = hypervisor(f"hv{i}")
        doc["metadata"]["annotations"] = {"pad": payload}
        written[f"hv{i}"] = time.monotonic()
        assert c.post(HV, json=doc).status_code == 201
    fast.wait_for(lambda ev: len(ev) >= n, timeout=60)
    delays = sorted(t - written[e["object"]["metadata"]["name"]] for t, e in fast.events)
    # Every event reached the fast watcher promptly, whatever the slow one did.
    assert delays[-1] < 4.0, delays[-5:]
    assert names(fast.kinds()) == [("ADDED", f"hv{i}") for i in range(n)]
    # The slow one was dropped: its watch slot is free again ...
    deadline = time.monotonic() + 30
    while api.server.server.started and time.monotonic() < deadline:
        if _open_watches(api, "t-viewer") == 0:
            break
        time.sleep(0.1)
    assert _open_watches(api, "t-viewer") == 0
    # ... and only the fast watcher is still subscribed to the fan-out.
    assert _ctx(api).hub.fanout("Hypervisor").watchers() == 1
    fast.close()
    slow.close()


def _ctx(api: Api) -> Any:
    return api.server.server.config.app.state.ctx


def _open_watches(api: Api, token_id: str) -> int:
    return int(_ctx(api).hub.open_watches(token_id))
