"""The API over etcd while etcd is down: 503 ServiceUnavailable Statuses (no
other 5xx), and after etcd is back the same server serves again and a watch
opened before the outage sees writes made after it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tests.server.conftest import Api
from tests.server.objects import HV, hypervisor, status_of
from tests.server.watching import Watcher, names
from tests.support.etcd_local import EtcdCluster


def test_etcd_outage_is_503_and_the_server_recovers(make_api: Callable[..., Api], tmp_path: Path) -> None:
    # Its own member: stopping the shared one would take other tests down.
    with EtcdCluster(tmp_path / "etcd", size=1) as cluster:
        api = make_api(store_url=cluster.url(prefix="/outage"))
        c = api.client()
        assert c.post(HV, json=hypervisor("hv0")).status_code == 201
        rv = c.get(HV).json()["metadata"]["resourceVersion"]
        w = Watcher(api, {"resourceVersion": rv})
        cluster.kill_all()
        for call in (lambda: c.get(f"{HV}/hv0"), lambda: c.get(HV),
                     lambda: c.post(HV, json=hypervisor("hv1")),
                     lambda: c.patch(f"{HV}/hv0", {"spec": {"maintenance": "drain"}})):
            r = call()
            status_of(503, "ServiceUnavailable", r.json())
            # The store's address (etcd's endpoints, the key prefix) is not any caller's.
            assert api.store.url not in r.text and "/outage" not in r.text, r.text  # type: ignore[attr-defined]
            assert "the store" in r.json()["message"]
        cluster.start()
        deadline = time.monotonic() + 60
        while True:
            r = c.post(HV, json=hypervisor("hv2"))
            if r.status_code == 201:
                break
            assert r.status_code in (503, 409) and time.monotonic() < deadline, r.text
            time.sleep(0.5)
        w.wait_for(lambda ev: ("ADDED", "hv2") in names(ev), timeout=60)
        w.close()


def test_a_watch_outlives_an_etcd_outage_and_readyz_says_the_store_is_gone(tmp_path: Path) -> None:
    """With store-backed tokens (as `hvfleet serve`), the watch's token re-check
    every 2 s met the outage as an error that cut the stream without an
    event (and a traceback); and /readyz said ok while every request was 503.
    Now the re-check is put off while the store cannot answer, the watch goes
    on and sees the writes after it, and /readyz is 500 until etcd is back."""
    from datetime import UTC, datetime

    import requests

    from hvfleet.server.app import create_app
    from hvfleet.server.auth import RoleAuthorizer, TokenAuthenticator
    from hvfleet.store import open_store
    from hvfleet.store.tokens import issue_token
    from tests.server.running import ServerThread

    with EtcdCluster(tmp_path / "etcd", size=1) as cluster:
        store = open_store(cluster.url(prefix="/watch-outage"))
        _, token = issue_token(store, "operator", manager="test", now=datetime.now(UTC), ttl=None,
                               name="t-ops")
        app = create_app(store, TokenAuthenticator(store), RoleAuthorizer(), dashboard_pages=False)
        with ServerThread(app) as server:
            api = Api(server.url, store, None, server, None)  # type: ignore[arg-type]
            auth = {"Authorization": f"Bearer {token}"}
            c = requests.Session()
            c.headers.update(auth)
            assert c.post(server.url + HV, json=hypervisor("hv0"), timeout=30).status_code == 201
            rv = c.get(server.url + HV, timeout=30).json()["metadata"]["resourceVersion"]
            w = Watcher(api, {"resourceVersion": rv}, token=token)
            assert requests.get(server.url + "/readyz", timeout=10).text == "ok"
            cluster.kill_all()
            time.sleep(5)  # two token re-checks (every 2 s) while etcd is down
            assert not w.done.is_set(), "the watch ended during the outage"
            ready = requests.get(server.url + "/readyz", timeout=10)
            assert ready.status_code == 500 and "store failed" in ready.text
            assert requests.get(server.url + "/healthz", timeout=10).status_code == 500
            assert requests.get(server.url + "/livez", timeout=10).text == "ok"
            cluster.start()
            deadline = time.monotonic() + 60
            while c.post(server.url + HV, json=hypervisor("hv2"), timeout=30).status_code != 201:
                assert time.monotonic() < deadline
                time.sleep(0.5)
            w.wait_for(lambda ev: ("ADDED", "hv2") in names(ev), timeout=60)
            assert not any(e["type"] == "ERROR" for e in w.kinds()), w.kinds()
            assert requests.get(server.url + "/readyz", timeout=10).text == "ok"
            w.close()
        store.close()


def test_readyz_is_not_queued_behind_a_write_waiting_for_sqlites_lock(make_api: Callable[..., Api]) -> None:
    """Probe 14: /readyz read the revision through the store's one connection,
    queued behind a PATCH waiting (up to the 30 s busy timeout) for a lock
    another process held: 500 "store failed" while the store was readable."""
    import sqlite3
    import threading

    import requests

    api = make_api()
    c = api.client()
    assert c.post(HV, json=hypervisor("hv0")).status_code == 201
    path = api.store.url.removeprefix("sqlite:///")  # type: ignore[attr-defined]
    other = sqlite3.connect(path, timeout=1, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's write (a CLI write, a backup)
    try:
        patched: list[int] = []
        writer = threading.Thread(target=lambda: patched.append(
            c.patch(f"{HV}/hv0", {"spec": {"maintenance": "drain"}}).status_code))
        writer.start()
        time.sleep(0.5)  # the PATCH now waits for the lock, holding the store's connection
        t = time.monotonic()
        ready = requests.get(api.url + "/readyz", timeout=10)
        assert ready.status_code == 200 and ready.text == "ok", ready.text
        assert time.monotonic() - t < 1.5
    finally:
        other.execute("ROLLBACK")
        other.close()
    writer.join(30)
    assert patched == [200]
