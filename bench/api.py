"""Fleet API figures, each next to a peer measured in the same run.

1. Status writes/s through the API (JSON merge patch of /status, one agent
   identity per host, keep-alive connections from `--clients` threads) over
   SQLite and over etcd; peer: the same writes straight into the same kind of
   store (`Store.update`, no HTTP), with p50/p99 latency of each.
2. Watch delivery to `--watchers` watch streams: time from just before a
   write is sent to its event arriving at each watcher, p50/p99; peer: the
   same writes seen through one direct `Store.watch` in this process.

The server runs in its own process (uvicorn over `create_app`), so client and
server do not share an interpreter. It trusts a bench-only token table
(`agent-<host>` → that host's agent identity) and allows every call: what is
measured is the API path, not the role table.

    .venv/bin/python bench/api.py [--hosts 2000] [--writes 4000] [--clients 16] [--watchers 50]
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hvfleet.model import Hypervisor
from hvfleet.store import Store, open_store
from hvfleet.store.etcd_local import EtcdCluster
from hvfleet.store.ownership import agent_manager

HV = "/apis/hvfleet.io/v1/hypervisors"


# -- the server process --------------------------------------------------------------------

class BenchTokens:
    """Bench-only authenticator: `Bearer agent-<host>` is that host's agent."""

    def authenticate(self, authorization: str | None) -> Any:
        from hvfleet.model.errors import Unauthorized
        from hvfleet.server.identity import Identity

        token = (authorization or "").removeprefix("Bearer ")
        if token.startswith("agent-"):
            host = token.removeprefix("agent-")
            return Identity(agent_manager(host), "agent", hypervisor=host, token_id=token)
        if token in ("viewer", "operator"):
            return Identity(token, token, token_id=token)
        raise Unauthorized("unknown bench token")


class AllowAll:
    """Bench-only authorizer: every call allowed (the store's own rules still hold)."""

    def authorize(self, who: Any, action: Any, current: Any, new: Any) -> None:
        return None


def serve(store_url: str, port: int) -> None:
    import uvicorn

    from hvfleet.server.app import create_app
    from hvfleet.server.context import Limits
    from hvfleet.server.watch import WatchLimits

    store = open_store(store_url)
    app = create_app(store, BenchTokens(), AllowAll(),
                     limits=Limits(watch=WatchLimits(per_token=1000, queue=100_000)))
    # proto=IPPROTO_TCP: asyncio then sets TCP_NODELAY on every connection.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1)).run(
        sockets=[sock])


class ServerProcess:
    def __init__(self, store_url: str) -> None:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", store_url, str(self.port)])
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the API server did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


# -- measuring -------------------------------------------------------------------------------

def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def seed(store: Store, hosts: int) -> None:
    for i in range(hosts):
        name = f"hv{i:05d}"
        store.create(Hypervisor.model_validate({"metadata": {"name": name}}), agent_manager(name))


def status_body(i: int) -> dict[str, Any]:
    return {"status": {"allocation": {"cpu": str(i % 64)},
                       "lastHeartbeatTime": datetime.now(UTC).isoformat()}}


def run_clients(clients: int, writes: int, one: Callable[[int, Any], None],
                make_state: Callable[[], Any]) -> tuple[float, list[float]]:
    latencies: list[float] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        state = make_state()
        mine: list[float] = []
        for i in range(k, writes, clients):
            t = time.perf_counter()
            one(i, state)
            mine.append(time.perf_counter() - t)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return writes / (time.perf_counter() - start), latencies


def api_writes(port: int, hosts: int, writes: int, clients: int) -> tuple[float, list[float]]:
    def one(i: int, conn: http.client.HTTPConnection) -> None:
        name = f"hv{i % hosts:05d}"
        conn.request("PATCH", f"{HV}/{name}/status", body=json.dumps(status_body(i)),
                     headers={"Authorization": f"Bearer agent-{name}",
                              "Content-Type": "application/merge-patch+json"})
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            raise RuntimeError(f"status write answered {r.status}")

    return run_clients(clients, writes, one, lambda: http.client.HTTPConnection("127.0.0.1", port))


def direct_writes(store_url: str, hosts: int, writes: int, clients: int) -> tuple[float, list[float]]:
    def one(i: int, store: Store) -> None:
        name = f"hv{i % hosts:05d}"
        status = status_body(i)["status"]

        def mutate(h: Hypervisor) -> Hypervisor:
            return h.model_copy(update={"status": h.status.model_validate(
                {**h.status.model_dump(by_alias=True), **status})})

        store.update_hypervisor(name, mutate, agent_manager(name))

    return run_clients(clients, writes, one, lambda: open_store(store_url))


def watch_delivery(
    port: int, store_url: str, watchers: int, writes: int
) -> tuple[list[float], list[float]]:
    """Seconds from just before each write to its arrival: per API watcher, and
    through one direct store watch."""
    rv = str(open_store(store_url).revision())
    api_delays: list[float] = []
    direct_delays: list[float] = []
    sent: dict[str, float] = {}
    lock = threading.Lock()
    ready = threading.Barrier(watchers + 2)

    def api_watcher() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("GET", f"{HV}?watch=true&resourceVersion={rv}&timeoutSeconds=120",
                     headers={"Authorization": "Bearer viewer"})
        resp = conn.getresponse()
        ready.wait()
        seen = 0
        while seen < writes and (line := resp.readline()):
            now = time.perf_counter()
            ev = json.loads(line)
            mark = ev["object"]["metadata"]["annotations"].get("bench/mark")
            if mark in sent:
                with lock:
                    api_delays.append(now - sent[mark])
                seen += 1
        conn.close()

    def direct_watcher() -> None:
        store = open_store(store_url)
        ready.wait()
        seen = 0
        for ev in store.watch("Hypervisor", since=int(rv), timeout=60):
            now = time.perf_counter()
            mark = ev.object.metadata.annotations.get("bench/mark")
            if mark in sent:
                direct_delays.append(now - sent[mark])
                seen += 1
                if seen >= writes:
                    break

    threads = [threading.Thread(target=api_watcher) for _ in range(watchers)]
    threads.append(threading.Thread(target=direct_watcher))
    for t in threads:
        t.start()
    ready.wait()
    time.sleep(0.5)
    conn = http.client.HTTPConnection("127.0.0.1", port)
    for i in range(writes):
        name = f"hv{i % 50:05d}"
        mark = f"m{i}"
        sent[mark] = time.perf_counter()
        body = json.dumps({"metadata": {"annotations": {"bench/mark": mark}}})
        conn.request("PATCH", f"{HV}/{name}", body=body,
                     headers={"Authorization": "Bearer operator",
                              "Content-Type": "application/merge-patch+json"})
        r = conn.getresponse()
        r.read()
        time.sleep(0.01)  # a steady stream, not one burst
    for t in threads:
        t.join(timeout=180)
    return api_delays, direct_delays


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def bench_store(label: str, store_url: str, args: argparse.Namespace) -> None:
    with open_store(store_url) as s:
        seed(s, args.hosts)
    server = ServerProcess(store_url)
    try:
        rate, lat = api_writes(server.port, args.hosts, args.writes, args.clients)
        print(f"[{label}] status writes through the API: {rate:.0f}/s, p50 {ms(pct(lat, 50))}, "
              f"p99 {ms(pct(lat, 99))} ({args.writes} writes, {args.clients} clients, {args.hosts} hosts)")
        rate, lat = direct_writes(store_url, args.hosts, args.writes, args.clients)
        print(f"[{label}] peer, the same writes into the store directly: {rate:.0f}/s, "
              f"p50 {ms(pct(lat, 50))}, p99 {ms(pct(lat, 99))}")
        if label == "sqlite":
            api, direct = watch_delivery(server.port, store_url, args.watchers, args.watch_writes)
            print(f"[{label}] watch delivery to {args.watchers} API watchers: p50 {ms(pct(api, 50))}, "
                  f"p99 {ms(pct(api, 99))} ({len(api)} deliveries)")
            print(f"[{label}] peer, one direct Store.watch: p50 {ms(pct(direct, 50))}, "
                  f"p99 {ms(pct(direct, 99))}")
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=2000)
    parser.add_argument("--writes", type=int, default=4000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--watchers", type=int, default=50)
    parser.add_argument("--watch-writes", type=int, default=200)
    parser.add_argument("--no-etcd", action="store_true", help="SQLite only")
    parser.add_argument("--serve", nargs=2, metavar=("STORE", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        bench_store("sqlite", f"sqlite:///{tmp}/api.db", args)
        if not args.no_etcd:
            with EtcdCluster(Path(tmp) / "etcd", size=1) as cluster:
                bench_store("etcd", cluster.url(prefix="/bench-api"), args)


if __name__ == "__main__":
    main()
