"""hvfleet's Placement API (`/placement` of `hvfleet serve`) next to a real
OpenStack Placement 16.0 (its own WSGI app under wsgiref on SQLite, as
tests/scheduling/real_placement.py runs it), measured in the same run.

hvfleet is the real server: `python -m hvfleet.server` in its own process,
HTTPS with the CA it makes, token authentication (an admin token in
`X-Auth-Token`) and the role checks, over SQLite.

1. Claims: `--clients` threads each PUT /allocations/{new consumer} for 1
   DISK_GB on one provider, `--claims` in all, each thread on its own
   keep-alive connection; claims/s and p50. Then a contended round: capacity
   for half of the attempts; the figure that matters is 0 overbooked (usage
   equals the claims that succeeded, and never passes the capacity).
2. `GET /allocation_candidates?resources=VCPU:1,MEMORY_MB:1024&limit=1000`
   (what Nova's scheduler asks, with its default limit) at each of `--sizes`
   providers (each with VCPU, MEMORY_MB and DISK_GB inventories), p50 of
   `--queries`. hvfleet's providers are seeded as stored provider records
   straight into its store (10,000 API calls would measure the seeding);
   real Placement's through its API.

    .venv/bin/python bench/placement_api.py [--sizes 1000,10000] [--claims 400] [--clients 8]
"""

from __future__ import annotations

import argparse
import http.client
import json
import ssl
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "scheduling"))

from api import Server, make_token
from real_placement import RealPlacement

from hvfleet.model.meta import ObjectMeta
from hvfleet.model.placement import (
    PlacementInventory,
    ResourceProvider,
    ResourceProviderSpec,
)
from hvfleet.store import Store, open_store
from hvfleet.store.base import Write

VERSION = "placement 1.39"


class Endpoint:
    """One Placement (hvfleet's or the real one): a connection per thread."""

    def __init__(self, name: str, host: str, port: int, prefix: str, token: str,
                 context: ssl.SSLContext | None) -> None:
        self.name, self.host, self.port, self.prefix = name, host, port, prefix
        self.token, self.context = token, context

    def connection(self) -> http.client.HTTPConnection:
        if self.context is None:
            return http.client.HTTPConnection(self.host, self.port, timeout=120)
        return http.client.HTTPSConnection(self.host, self.port, timeout=120, context=self.context)

    def call(self, conn: http.client.HTTPConnection, method: str, path: str,
             body: Any = None) -> tuple[int, Any]:
        headers = {"X-Auth-Token": self.token, "OpenStack-API-Version": VERSION,
                   "Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body)
        conn.request(method, self.prefix + path, body=data, headers=headers)
        r = conn.getresponse()
        raw = r.read()
        return r.status, (json.loads(raw) if raw else None)


def provider(ep: Endpoint, conn: http.client.HTTPConnection, total: int) -> str:
    uid = str(uuid.uuid4())
    status, _ = ep.call(conn, "POST", "/resource_providers", {"name": uid, "uuid": uid})
    assert status == 200, status
    status, doc = ep.call(conn, "PUT", f"/resource_providers/{uid}/inventories", {
        "resource_provider_generation": 0, "inventories": {"DISK_GB": {"total": total}}})
    assert status == 200, doc
    return uid


def claims(ep: Endpoint, clients: int, n: int, capacity: int) -> tuple[float, float, int, int]:
    """(claims/s, p50 s, claims that succeeded, usage) for `n` attempts."""
    conn = ep.connection()
    rp = provider(ep, conn, capacity)
    won: list[float] = []
    lock = threading.Lock()
    go = threading.Barrier(clients + 1)

    def worker(k: int) -> None:
        c = ep.connection()
        mine: list[float] = []
        go.wait()
        for _ in range(k, n, clients):
            body = {"allocations": {rp: {"resources": {"DISK_GB": 1}}}, "project_id": "p",
                    "user_id": "u", "consumer_generation": None, "consumer_type": "INSTANCE"}
            consumer = str(uuid.uuid4())
            t = time.perf_counter()
            for _attempt in range(50):
                status, doc = ep.call(c, "PUT", f"/allocations/{consumer}", body)
                if status == 204:
                    mine.append(time.perf_counter() - t)
                    break
                if "exceed the capacity" in json.dumps(doc):
                    break  # full: nothing to retry
        with lock:
            won.extend(mine)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    go.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    _, usage = ep.call(conn, "GET", f"/resource_providers/{rp}/usages")
    return len(won) / elapsed, statistics.median(won), len(won), usage["usages"].get("DISK_GB", 0)


INVENTORY = {"VCPU": {"total": 64, "allocation_ratio": 4.0},
             "MEMORY_MB": {"total": 262144, "max_unit": 262144},
             "DISK_GB": {"total": 2000}}


def seed_hvfleet(store: Store, n: int, start: int) -> None:
    batch: list[Write] = []
    for i in range(start, n):
        uid = str(uuid.UUID(int=i + 1))
        spec = ResourceProviderSpec(
            provider_name=f"cn{i:05d}", root_uuid=uid, generation=1,
            inventories={rc: PlacementInventory(**inv) for rc, inv in INVENTORY.items()})
        batch.append(Write("create", ResourceProvider(metadata=ObjectMeta(name=uid), spec=spec)))
        if len(batch) == 500:
            store.write_all(batch, "bench")
            batch = []
    if batch:
        store.write_all(batch, "bench")


def seed_real(ep: Endpoint, n: int, start: int) -> None:
    conn = ep.connection()
    for i in range(start, n):
        uid = str(uuid.UUID(int=i + 1))
        status, _ = ep.call(conn, "POST", "/resource_providers", {"name": f"cn{i:05d}", "uuid": uid})
        assert status == 200, status
        status, doc = ep.call(conn, "PUT", f"/resource_providers/{uid}/inventories",
                              {"resource_provider_generation": 0, "inventories": INVENTORY})
        assert status == 200, doc


def candidates(ep: Endpoint, queries: int) -> tuple[float, int]:
    conn = ep.connection()
    path = "/allocation_candidates?resources=VCPU:1,MEMORY_MB:1024&limit=1000"
    status, doc = ep.call(conn, "GET", path)  # the first builds hvfleet's index: not measured
    assert status == 200, doc
    times = []
    for _ in range(queries):
        t = time.perf_counter()
        status, doc = ep.call(conn, "GET", path)
        times.append(time.perf_counter() - t)
    return statistics.median(times), len(doc["allocation_requests"])


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--claims", type=int, default=400)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--queries", type=int, default=20)
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    work = Path(tempfile.mkdtemp(prefix="bench-placement-"))
    store = open_store(f"sqlite:///{work}/hvfleet.db")
    token = make_token(store, "admin", name="bench-admin")
    server = Server(store.url, work / "server")
    assert server.ca is not None
    ours = Endpoint("hvfleet", "127.0.0.1", server.port, "/placement", token,
                    ssl.create_default_context(cafile=str(server.ca)))
    real = RealPlacement().start()
    port = int(real.url.rsplit(":", 1)[1])
    theirs = Endpoint("placement", "127.0.0.1", port, "", "admin", None)
    try:
        print(f"PUT /allocations, {args.clients} clients, {args.claims} claims of 1 DISK_GB on one provider")
        for ep in (ours, theirs):
            rate, p50, won, usage = claims(ep, args.clients, args.claims, 10 * args.claims)
            print(f"  {ep.name:9} {rate:7.1f} claims/s  p50 {ms(p50)}  succeeded {won}  usage {usage}")
        print(f"contended: capacity {args.claims // 2} for {args.claims} attempts")
        for ep in (ours, theirs):
            rate, p50, won, usage = claims(ep, args.clients, args.claims, args.claims // 2)
            over = max(0, usage - args.claims // 2) + abs(usage - won)
            print(f"  {ep.name:9} {rate:7.1f} claims/s  succeeded {won}  usage {usage}  overbooked {over}")
        have = 0
        for size in [int(s) for s in args.sizes.split(",")]:
            t = time.perf_counter()
            seed_hvfleet(store, size, have)
            seeded_ours = time.perf_counter() - t
            t = time.perf_counter()
            seed_real(theirs, size, have)
            seeded_real = time.perf_counter() - t
            have = size
            print(f"GET /allocation_candidates at {size} providers "
                  f"(seeded in {seeded_ours:.1f} s / {seeded_real:.1f} s)")
            results: dict[str, float] = {}
            for ep in (ours, theirs):
                p50, n = candidates(ep, args.queries)
                results[ep.name] = p50
                print(f"  {ep.name:9} p50 {ms(p50)}  ({n} allocation requests)")
            print(f"  ratio     {results['placement'] / results['hvfleet']:.1f}x")
    finally:
        server.stop()
        real.stop()
        store.close()




if __name__ == "__main__":
    main()
