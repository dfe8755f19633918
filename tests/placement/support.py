"""What the Placement API tests share: a real `hvfleet serve` over a store
with a token per role (`Placement`, `_serve`, `_served_sqlite` for a module's
`api` fixture), the two-host fleet they seed, and the concurrent clients of
the overbooking races. A support module, so no test module imports another."""

from __future__ import annotations

import json
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from hvfleet.scheduling.placement import provider_uuid
from hvfleet.server.app import create_app
from hvfleet.server.auth import RoleAuthorizer, TokenAuthenticator
from hvfleet.store import Store, open_store
from hvfleet.store.tokens import issue_token
from tests.scheduling.sched_fleet import host, put_host
from tests.server.running import ServerThread
from tests.server.tls_files import make_tls_files


@dataclass
class Placement:
    url: str
    store: Store
    ca: Path
    tokens: dict[str, str]

    def call(self, method: str, path: str, role: str = "admin", body: Any = None,
             version: str = "1.39") -> requests.Response:
        headers = {"X-Auth-Token": self.tokens[role], "OpenStack-API-Version": f"placement {version}",
                   "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        return requests.request(method, f"{self.url}/placement{path}", headers=headers,
                                data=None if body is None else json.dumps(body), verify=str(self.ca),
                                timeout=30)


def _serve(store: Store, directory: Path, tokens: dict[str, str] | None = None) -> Iterator[Placement]:
    """A server over `store` with a token per role (`tokens`: those of another
    replica over the same store)."""
    now = datetime.now(UTC)
    if tokens is None:
        tokens = {}
        for role, hv in [("admin", None), ("scheduler", None), ("viewer", None), ("operator", None),
                         ("agent", "hv1")]:
            _, tokens[role] = issue_token(store, role, manager="test", now=now, ttl=None,  # type: ignore[arg-type]
                                          name=None if hv else f"t-{role}", hypervisor=hv)
    app = create_app(store, TokenAuthenticator(store), RoleAuthorizer(), dashboard_pages=False)
    files = make_tls_files(directory / "tls")
    with ServerThread(app, files) as server:
        yield Placement(server.url, store, files.ca, tokens)


def _fleet(store: Store) -> None:
    beat = datetime.now(UTC)
    for name, cpu in [("hv1", 16), ("hv2", 8)]:
        h = host(name, {"cpu": cpu, "memory": "64Gi"}, overcommit={"cpu": 2.0}, beat=beat)
        put_host(store, h)


def _served_sqlite(*, seeded: bool = True) -> Iterator[Placement]:
    """A server over a new SQLite store (with the two-host `_fleet` when
    `seeded`), for a module's `api` fixture."""
    d = Path(tempfile.mkdtemp())
    store = open_store(f"sqlite:///{d}/hvfleet.db")
    if seeded:
        _fleet(store)
    yield from _serve(store, d)
    store.close()


def _uuid(store: Store, name: str) -> str:
    return provider_uuid(store.get_hypervisor(name))


def _claim(api: Placement, consumer: str, body: dict[str, Any], won: list[str],
           lock: threading.Lock) -> None:
    """PUT `consumer`'s allocations as a scheduler, again after a lost race
    (409 concurrent update), until it is taken (noted in `won`) or refused as
    full (409 exceeding capacity: not a race to retry)."""
    for _attempt in range(20):
        r = api.call("PUT", f"/allocations/{consumer}", "scheduler", body)
        if r.status_code == 204:
            with lock:
                won.append(consumer)
            return
        assert r.status_code == 409, r.text
        if "exceed the capacity" in r.text:
            return


def _race(api: Placement, provider: str, rc: str, capacity: int, clients: int = 8,
          per_client: int = 6) -> tuple[int, int]:
    """`clients` threads each PUT `per_client` allocations of 1 `rc` (fresh
    consumers, retrying Placement's 409 concurrent-update the way Nova does);
    returns (allocations that succeeded, usage Placement reports)."""
    won = []
    lock = threading.Lock()

    def client() -> None:
        for _ in range(per_client):
            consumer = str(uuid.uuid4())
            body = {"allocations": {provider: {"resources": {rc: 1}}}, "project_id": "p",
                    "user_id": "u", "consumer_generation": None, "consumer_type": "INSTANCE"}
            _claim(api, consumer, body, won, lock)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    usage = api.call("GET", f"/resource_providers/{provider}/usages").json()["usages"][rc]
    return len(won), usage


def _stored_provider(api: Placement, total: int) -> str:
    uid = str(uuid.uuid4())
    assert api.call("POST", "/resource_providers", body={"name": uid, "uuid": uid}).status_code == 200
    r = api.call("PUT", f"/resource_providers/{uid}/inventories",
                 body={"resource_provider_generation": 0, "inventories": {"DISK_GB": {"total": total}}})
    assert r.status_code == 200, r.text
    return uid
