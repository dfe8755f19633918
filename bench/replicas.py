"""Server CPU per write with 1, 2 and 3 `hvfleet serve` replicas over one
3-member etcd, next to the same writes on the direct store, and a scaled
fleet (leases every 10 s, status changes at a realistic rate) spread over the
replicas.

Everything is real: a 3-member etcd (Debian's etcd on loopback ports), each
replica a `python -m hvfleet.server` process (HTTPS, the CA the replicas
share through the store, the real token authenticator and role authorizer,
the JSON audit log), simulated agents with real agent tokens doing what the
agent does: a Lease renewal is a PUT of the Lease naming its resourceVersion,
a status write a PUT of /status naming it. Each replica has one watcher (a
viewer following every Hypervisor, as a scheduler or a dashboard would), so
it follows every write as in a deployment.

CPU is process CPU time (utime + stime from /proc/PID/stat) over a phase,
not wall time:
- "per write": the sum over all replicas, divided by the writes, with the
  writes spread round-robin over the replicas: what a write costs the service,
  including every replica following it;
- "per followed event": with 2 or 3 replicas, writes go to replica 0 only and
  replica 1, which serves nothing but its watcher, is measured;
- "direct store": the same writes by this process on EtcdStore (CAS update),
  this process's CPU (time.process_time) per write;
- "alternating" (2 or more replicas): the same lease renewals, each through
  the replica after the one the agent's last renewal went through, as a
  load balancer spreading requests sends them (the rows above pin agent a to
  replica a % n, so each renewal names a version its replica wrote);
- "fleet of F" (--far-hosts F, 2 or more replicas): F agents whose Leases the
  bench wrote directly in the store, each renewed once through replica
  a % n: every renewal names a version at least F - 500 writes back, written
  by none of the replicas, as a renewal every 10 s does in a fleet writing
  more than the replicas keep decoded (in blocks of 500 agents, each agent's
  token used once on every replica just before, outside the measured phase,
  by a GET of something else than its Lease).

The fleet phase runs --fleet-hosts simulated agents for --fleet-seconds:
each renews its Lease every 10 s and changes its status every
--status-every seconds (default 300: a VM started or stopped every 5 minutes
per host), over 3 replicas; it prints the cores the replicas and etcd used
and extrapolates the per-write figures to 10,000 and 100,000 hosts.

    .venv/bin/python bench/replicas.py [--hosts 200] [--writes 1500] [--clients 4]
        [--fleet-hosts 600] [--fleet-seconds 40] [--replicas 1,2,3] [--store etcd|sqlite]
        [--far-hosts 5000]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from api import Agents, Server, agent_of, host, make_token, process_cpu, read_ok, run_clients, seed, status_of

# The repository root: tests.support holds the test and bench tooling (local etcd).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.etcd_local import EtcdCluster

from hvfleet.model.errors import NotFound
from hvfleet.model.hypervisor import Hypervisor
from hvfleet.model.lease import Lease, renewed
from hvfleet.store import Store, open_store
from hvfleet.store.ownership import agent_manager

LEASES = "/apis/hvfleet.io/v1/leases"
HV = "/apis/hvfleet.io/v1/hypervisors"
TICK = os.sysconf("SC_CLK_TCK")


def now_text() -> str:
    return datetime.now(UTC).isoformat()


class LeaseClients:
    """Each simulated agent's Lease resourceVersion; one thread per agent (agent_of)."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.rv: list[str | None] = [None] * len(tokens)
        self.turns = [0] * len(tokens)  # renewals made, to alternate replicas by

    def alternating(self, conns: list[http.client.HTTPConnection], a: int) -> None:
        """Agent a's renewal through the replica after its last one's."""
        self.turns[a] += 1
        self.renew(conns[(a + self.turns[a]) % len(conns)], a)

    def renew(self, conn: http.client.HTTPConnection, a: int) -> None:
        auth = {"Authorization": f"Bearer {self.tokens[a]}", "Content-Type": "application/json"}
        spec = {"holderIdentity": agent_manager(host(a)), "leaseDurationSeconds": 30,
                "renewTime": now_text()}
        if self.rv[a] is None:  # an agent starting up reads its Lease once
            conn.request("GET", f"{LEASES}/{host(a)}", headers=auth)
            r = conn.getresponse()
            data = r.read()
            if r.status == 200:
                self.rv[a] = json.loads(data)["metadata"]["resourceVersion"]
        if self.rv[a] is None:
            body = {"apiVersion": "hvfleet.io/v1", "kind": "Lease",
                    "metadata": {"name": host(a)}, "spec": {**spec, "acquireTime": now_text()}}
            conn.request("POST", LEASES, body=json.dumps(body), headers=auth)
            r = conn.getresponse()
            data = r.read()
            if r.status not in (200, 201):
                raise RuntimeError(f"lease create answered {r.status}: {data[:300]!r}")
        else:
            body = {"apiVersion": "hvfleet.io/v1", "kind": "Lease",
                    "metadata": {"name": host(a), "resourceVersion": self.rv[a]}, "spec": spec}
            conn.request("PUT", f"{LEASES}/{host(a)}", body=json.dumps(body), headers=auth)
            data = read_ok(conn, "lease renewal")
        self.rv[a] = json.loads(data)["metadata"]["resourceVersion"]


class Replicas:
    def __init__(self, store_url: str, tmp: Path, n: int, viewer: str) -> None:
        self.servers = [Server(store_url, tmp / f"replica-{i}", options=SERVE_OPTIONS) for i in range(n)]
        self.viewer = viewer
        self.stop = threading.Event()
        self.watchers = [threading.Thread(target=self._follow, args=(s,), daemon=True) for s in self.servers]
        for w in self.watchers:
            w.start()
        time.sleep(1.0)  # watches open, start-up work done

    def _follow(self, server: Server) -> None:
        conn = server.connection(timeout=3600)
        conn.request("GET", f"{HV}?watch=true&timeoutSeconds=3600",
                     headers={"Authorization": f"Bearer {self.viewer}"})
        resp = conn.getresponse()
        while not self.stop.is_set() and resp.readline():
            pass

    def cpu(self) -> list[float]:
        return [process_cpu(s.proc.pid) for s in self.servers]

    def close(self) -> None:
        self.stop.set()
        for s in self.servers:
            s.stop()


def spread(replicas: Replicas, clients: int) -> Callable[[], list[http.client.HTTPConnection]]:
    """Per client thread, one connection to every replica."""
    return lambda: [s.connection() for s in replicas.servers]


PROFILE: dict[str, Any] = {"dir": None, "label": "", "gil": False}


def profilers(replicas: Replicas) -> list[subprocess.Popen[bytes]]:
    """With --profile DIR: `py-spy record` on every replica for the phase, collapsed
    stacks (one file per replica and phase) to read with bench/profile_top.py."""
    out = PROFILE["dir"]
    if out is None:
        return []
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        sys.exit("--profile needs py-spy: pip install -e '.[bench]'")
    procs = []
    for i, s in enumerate(replicas.servers):
        path = Path(out) / f"{PROFILE['label']}-r{i}.txt"
        # Idle threads (blocked in a wait: the GIL, a queue, a socket) are not
        # sampled (py-spy's default, no --idle), so waits are not counted as
        # work, and C work without the GIL (TLS) is; no native frames.
        # With --profile-gil, only the thread holding the GIL: Python work alone.
        gil = ["--gil"] if PROFILE["gil"] else []
        procs.append(subprocess.Popen([spy, "record", "--pid", str(s.proc.pid), "--format", "raw",
                                       "--threads", *gil, "--rate", "250", "--nonblocking",
                                       "-o", str(path)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(1.0)  # attached
    return procs


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of process `pid`, by thread id (py-spy names them)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):  # a thread that ended meanwhile
            out[int(task.name)] = cpu_of_stat(task / "stat")
    return out


def kernel_cpu_of(pid: int) -> float:
    """Seconds of system (kernel) CPU process `pid` has used."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[12]) / TICK


def cpu_of_stat(path: Path) -> float:
    fields = path.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def measured(replicas: Replicas, work: Callable[[], None]) -> tuple[list[float], float]:
    spies = profilers(replicas)
    threads = [thread_cpu(s.proc.pid) for s in replicas.servers] if spies else []
    before, t = replicas.cpu(), time.perf_counter()
    work()
    after, wall = replicas.cpu(), time.perf_counter() - t
    for p in spies:
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)
    for i, (s, old) in enumerate(zip(replicas.servers, threads, strict=True) if spies else ()):
        new = thread_cpu(s.proc.pid)
        used = sorted(((new[k] - old.get(k, 0.0), k) for k in new), reverse=True)
        lines = [f"{tid} {sec:.2f}" for sec, tid in used if sec > 0]
        Path(PROFILE["dir"], f"{PROFILE['label']}-r{i}.cpu").write_text("\n".join(lines) + "\n")
    return [b - a for a, b in zip(before, after, strict=True)], wall


def api_phase(replicas: Replicas, n: int, writes: int, clients: int, kind: str,
              only: int | None = None) -> tuple[list[float], float]:
    """`writes` lease renewals or status writes by `n` agents, agent a through
    replica a % len(replicas) (or all through replica `only`)."""
    count = len(replicas.servers)
    pick = (lambda a: a % count) if only is None else (lambda a: only)
    tokens = AGENT_TOKENS
    if kind == "lease-alternating":
        alt = LeaseClients(tokens[:n])
        run_clients(clients, n, lambda a, conns: alt.alternating(conns, a), spread(replicas, clients))

        def one(i: int, conns: list[http.client.HTTPConnection]) -> None:
            alt.alternating(conns, agent_of(i, n, clients))
    elif kind == "lease":
        leases = LeaseClients(tokens[:n])
        run_clients(clients, n, lambda a, conns: leases.renew(conns[pick(a)], a), spread(replicas, clients))

        def one(i: int, conns: list[http.client.HTTPConnection]) -> None:
            a = agent_of(i, n, clients)
            leases.renew(conns[pick(a)], a)
    else:
        agents = Agents(tokens[:n])
        run_clients(clients, n, lambda a, conns: agents.put_status(conns[pick(a)], a, status_of(a)),
                    spread(replicas, clients))

        def one(i: int, conns: list[http.client.HTTPConnection]) -> None:
            a = agent_of(i, n, clients)
            agents.put_status(conns[pick(a)], a, status_of(i))
    conns_by_thread: list[Any] = []
    PROFILE["label"] = f"{kind}-{count}" + ("" if only is None else f"-only{only}")
    cpu, wall = measured(replicas, lambda: conns_by_thread.append(
        run_clients(clients, writes, one, spread(replicas, clients))))
    return cpu, wall


def far_phase(replicas: Replicas, store_url: str, hosts: int, clients: int) -> float:
    """Server CPU per renewal, summed over the replicas: `hosts` agents whose
    Leases the bench wrote directly, each renewed once through replica a % n
    (see the module's docstring, "fleet of F")."""
    count = len(replicas.servers)
    leases = LeaseClients(AGENT_TOKENS[:hosts])

    def write(a: int, store: Store) -> None:
        holder = agent_manager(host(a))
        try:  # the first --hosts agents renewed theirs in the phases before
            got = store.get("Lease", host(a))
        except NotFound:
            got = None
        current = got if isinstance(got, Lease) else None
        new = renewed(current, host(a), holder, 30, datetime.now(UTC))
        lease = store.create(new, holder) if current is None else store.update(new, holder)
        leases.rv[a] = lease.metadata.resource_version

    run_clients(clients, hosts, write, lambda: open_store(store_url))

    def warm(block: range) -> Callable[[int, list[http.client.HTTPConnection]], None]:
        # Each token used once on each replica (a GET of the agent's Hypervisor:
        # not its Lease, which the replica would then hold as read).
        def one(i: int, conns: list[http.client.HTTPConnection]) -> None:
            a, conn = block[i // count], conns[i % count]
            conn.request("GET", f"{HV}/{host(a)}", headers={"Authorization": f"Bearer {leases.tokens[a]}"})
            conn.getresponse().read()
        return one

    def renew(block: range) -> Callable[[], None]:
        def work() -> None:
            run_clients(clients, len(block), lambda i, conns: leases.renew(conns[block[i] % count], block[i]),
                        spread(replicas, clients))
        return work

    # In blocks, each warmed just before it is renewed: a token record read is
    # reused for 30 s at most (auth.FOLLOWED_MAX_AGE_S); an agent renewing every
    # 10 s never lets it lapse, a warm-up of the whole fleet first would.
    used = 0.0
    PROFILE["label"] = f"lease-far-{count}"
    for start in range(0, hosts, FAR_BLOCK):
        block = range(start, min(hosts, start + FAR_BLOCK))
        run_clients(clients, len(block) * count, warm(block), spread(replicas, clients))
        cpu, _ = measured(replicas, renew(block))
        used += sum(cpu)
        PROFILE["label"] = f"lease-far-{count}-{start + FAR_BLOCK}"
    return used / hosts


FAR_BLOCK = 500


def paced_follow_phase(replicas: Replicas, store_url: str, n: int, writes: int, clients: int,
                       rate: float) -> tuple[float, float]:
    """Each replica's CPU per followed event (the median over the replicas)
    while this process writes `writes` statuses of `n` hosts directly in the
    store at `rate` per second: every replica only follows them (its watcher,
    dashboard, collector and index), as a replica follows the writes that went
    through the others. Returns that and the rate reached."""
    last: dict[int, Any] = {}

    def prepare(a: int, store: Store) -> None:
        last[a] = store.get_hypervisor(host(a))

    run_clients(clients, n, prepare, lambda: open_store(store_url))
    began: list[float] = []

    def one(i: int, store: Store) -> None:
        if not began:
            began.append(time.perf_counter())
        due = began[0] + i / rate
        if (wait := due - time.perf_counter()) > 0:
            time.sleep(wait)
        a = agent_of(i, n, clients)
        current = last[a]
        new = current.model_copy(update={"status": current.status.model_validate(status_of(i))})
        last[a] = store.update(new, agent_manager(host(a)))

    PROFILE["label"] = f"paced-{len(replicas.servers)}"
    walls: list[float] = []

    def work() -> None:
        run_clients(clients, writes, one, lambda: open_store(store_url))
        walls.append(time.perf_counter() - began[0])
        # The last writes followed: half a second more than the replicas' pace.
        time.sleep(0.5 + float(SERVE_OPTIONS.get("follow_pace") or 0.01))

    cpu, _ = measured(replicas, work)
    return sorted(cpu)[len(cpu) // 2] / writes, writes / walls[0]


def direct_phase(store_url: str, n: int, writes: int, clients: int, kind: str) -> float:
    """CPU of this process per write, the same writes on the store itself."""
    last: dict[int, Any] = {}

    def prepare(a: int, store: Store) -> None:
        if kind == "lease":
            try:
                got = store.get("Lease", host(a))
            except Exception:
                got = None
            current = got if isinstance(got, Lease) else None
            new = renewed(current, host(a), agent_manager(host(a)), 30, datetime.now(UTC))
            last[a] = (store.create(new, agent_manager(host(a))) if current is None
                       else store.update(new, agent_manager(host(a))))
        else:
            last[a] = store.get_hypervisor(host(a))

    def one(i: int, store: Store) -> None:
        a = agent_of(i, n, clients)
        current = last[a]
        if kind == "lease":
            new = renewed(current, host(a), agent_manager(host(a)), 30, datetime.now(UTC))
        else:
            assert isinstance(current, Hypervisor)
            new = current.model_copy(update={"status": current.status.model_validate(status_of(i))})
        last[a] = store.update(new, agent_manager(host(a)))

    run_clients(clients, n, prepare, lambda: open_store(store_url))
    t = time.process_time()
    run_clients(clients, writes, one, lambda: open_store(store_url))
    return (time.process_time() - t) / writes


AGENT_TOKENS: list[str] = []
# ServeOptions fields given to every replica (--http, --loop).
SERVE_OPTIONS: dict[str, Any] = {}


def ms(x: float) -> str:
    return f"{x * 1000:.2f} ms"


def fleet_phase(replicas: Replicas, etcd: EtcdCluster, hosts: int, seconds: float,
                status_every: float, clients: int, etcd_used: bool = True) -> dict[str, float]:
    """Paced: each agent renews every 10 s and writes its status every
    `status_every` s (phases spread evenly), through replica a % n."""
    count = len(replicas.servers)
    leases = LeaseClients(AGENT_TOKENS[:hosts])
    agents = Agents(AGENT_TOKENS[:hosts])
    run_clients(clients, hosts, lambda a, conns: leases.renew(conns[a % count], a), spread(replicas, clients))
    run_clients(clients, hosts, lambda a, conns: agents.put_status(conns[a % count], a, status_of(a)),
                spread(replicas, clients))
    # The schedule: (time offset, kind, agent), sorted.
    plan: list[tuple[float, str, int]] = []
    for a in range(hosts):
        t = (a / hosts) * 10.0
        while t < seconds:
            plan.append((t, "lease", a))
            t += 10.0
        t = (a / hosts) * status_every
        while t < seconds:
            plan.append((t, "status", a))
            t += status_every
    plan.sort()
    late = [0]
    lock = threading.Lock()
    per_thread = [[p for p in plan if p[2] % clients == k] for k in range(clients)]
    etcd_pids = [m.process.pid for m in etcd.members if m.process is not None and etcd_used]
    etcd_before = [process_cpu(p) for p in etcd_pids]

    def worker(k: int, start: float) -> None:
        conns = [s.connection() for s in replicas.servers]
        for offset, kind, a in per_thread[k]:
            wait = start + offset - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            elif wait < -1.0:
                with lock:
                    late[0] += 1
            if kind == "lease":
                leases.renew(conns[a % count], a)
            else:
                agents.put_status(conns[a % count], a, status_of(a + int(offset)))

    def work() -> None:
        start = time.monotonic() + 0.2
        threads = [threading.Thread(target=worker, args=(k, start)) for k in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    PROFILE["label"] = f"fleet-{count}"
    cpu, wall = measured(replicas, work)
    etcd_cpu = sum(process_cpu(p) - b for p, b in zip(etcd_pids, etcd_before, strict=True))
    return {"writes": len(plan), "wall": wall, "server_cores": sum(cpu) / wall,
            "etcd_cores": etcd_cpu / wall, "late": late[0], "server_cpu": sum(cpu), "etcd_cpu": etcd_cpu,
            "leases": sum(1 for p in plan if p[1] == "lease"),
            "statuses": sum(1 for p in plan if p[1] == "status")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--writes", type=int, default=1500)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--replicas", default="1,2,3")
    parser.add_argument("--fleet-hosts", type=int, default=600)
    parser.add_argument("--fleet-seconds", type=float, default=40.0)
    parser.add_argument("--status-every", type=float, default=300.0)
    parser.add_argument("--far-hosts", type=int, default=0,
                        help="with 2 or more replicas, also renew the Leases of this many agents once "
                             "each, every renewal naming a version that many writes back (0: not run)")
    parser.add_argument("--follow-rate", type=float, default=1000.0,
                        help="with 2 or more replicas, also write statuses directly in the store at "
                             "this rate and measure each replica following them (0: not run; 1,000/s "
                             "is a 10,000-host fleet's lease renewals)")
    parser.add_argument("--store", choices=["etcd", "sqlite"], default="etcd",
                        help="the store the replicas share: the 3-member etcd, or one SQLite file")
    parser.add_argument("--profile", metavar="DIR", default=None,
                        help="record every replica with py-spy during each measured phase "
                             "(the bench extra); profiling inflates the CPU figures")
    parser.add_argument("--profile-gil", action="store_true",
                        help="with --profile: sample only the thread holding the GIL (Python work, "
                             "no waits, no C work done without the GIL such as TLS and syscalls)")
    parser.add_argument("--http", choices=["auto", "h11", "httptools"], default=None,
                        help="the replicas' HTTP implementation (default: the server's, auto)")
    parser.add_argument("--follow-pace", type=float, default=None, metavar="SECONDS",
                        help="the replicas' --follow-pace (default: the server's, 0.01)")
    parser.add_argument("--loop", choices=["auto", "asyncio", "uvloop"], default=None,
                        help="the replicas' event loop (default: the server's, auto)")
    args = parser.parse_args()
    SERVE_OPTIONS.update({k: v for k, v in (("http", args.http), ("loop", args.loop)) if v})
    if args.follow_pace is not None:
        SERVE_OPTIONS["follow_pace"] = args.follow_pace
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        PROFILE["dir"] = args.profile
        PROFILE["gil"] = args.profile_gil
    counts = [int(x) for x in args.replicas.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    try:
        with EtcdCluster(tmp / "etcd", size=3) as etcd:
            results: dict[int, dict[str, float]] = {}
            direct: dict[str, float] = {}
            for n in counts:
                url = (etcd.url(prefix=f"/bench-{uuid.uuid4().hex[:8]}") if args.store == "etcd"
                       else f"sqlite:///{tmp}/bench-{n}.db")
                with open_store(url) as store:
                    tokens, viewers, _ = seed(store, max(args.hosts, args.fleet_hosts), 1)
                    # The far fleet's agents need tokens only: their Leases are written by far_phase.
                    if n >= 2:
                        tokens += [make_token(store, "agent", hypervisor=host(i))
                                   for i in range(len(tokens), args.far_hosts)]
                AGENT_TOKENS[:] = tokens
                if not direct:
                    for kind in ("lease", "status"):
                        direct[kind] = direct_phase(url, args.hosts, args.writes, args.clients, kind)
                replicas = Replicas(url, tmp / f"r{n}", n, viewers[0])
                try:
                    row: dict[str, float] = {}
                    for kind in ("lease", "status"):
                        cpu, wall = api_phase(replicas, args.hosts, args.writes, args.clients, kind)
                        row[kind] = sum(cpu) / args.writes
                        row[f"{kind}_rate"] = args.writes / wall
                    if n >= 2:
                        cpu, _ = api_phase(replicas, args.hosts, args.writes, args.clients,
                                           "lease-alternating")
                        row["lease_alternating"] = sum(cpu) / args.writes
                        if args.far_hosts:
                            row["lease_far"] = far_phase(replicas, url, args.far_hosts, args.clients)
                        follower = replicas.servers[1].proc.pid
                        kernel = kernel_cpu_of(follower)
                        cpu, _ = api_phase(replicas, args.hosts, args.writes, args.clients, "status", only=0)
                        row["follow"] = cpu[1] / args.writes
                        row["follow_kernel"] = (kernel_cpu_of(follower) - kernel) / args.writes
                        row["write_only"] = cpu[0] / args.writes - row["follow"]
                        if args.follow_rate:
                            # Each direct write waits for the 3 members' round trip: more
                            # writers than --clients, to reach the rate.
                            row["paced_follow"], row["paced_rate"] = paced_follow_phase(
                                replicas, url, args.hosts, args.writes, max(args.clients, 16),
                                args.follow_rate)
                    if n == max(counts) and args.fleet_hosts:
                        fleet = fleet_phase(replicas, etcd, args.fleet_hosts, args.fleet_seconds,
                                            args.status_every, max(args.clients, 8),
                                            args.store == "etcd")
                        row.update({f"fleet_{k}": v for k, v in fleet.items()})
                    results[n] = row
                finally:
                    replicas.close()
            report(results, direct, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def report(results: dict[int, dict[str, float]], direct: dict[str, float], args: argparse.Namespace) -> None:
    where = "3-member etcd" if args.store == "etcd" else "one SQLite file"
    print(f"\nserver CPU per write, {args.writes} writes by {args.hosts} agents, {args.clients} clients, "
          f"{where}; every replica follows all writes (one watcher each)")
    print(f"{'':28}{'lease renewal':>16}{'status write':>16}{'followed event':>16}{'writes/s (status)':>20}")
    print(f"{'direct store (this process)':28}{ms(direct['lease']):>16}{ms(direct['status']):>16}"
          f"{'-':>16}{'-':>20}")
    for n, row in results.items():
        follow = ms(row["follow"]) if "follow" in row else "-"
        print(f"{f'{n} replica(s), sum of all':28}{ms(row['lease']):>16}{ms(row['status']):>16}"
              f"{follow:>16}{row['status_rate']:>20.0f}")
        print(f"{'':28}{row['lease'] / direct['lease']:>15.1f}x{row['status'] / direct['status']:>15.1f}x"
              "   (vs direct store)")
    for n, row in results.items():
        if "lease_alternating" in row:
            print(f"{n} replicas, lease renewal alternating replicas, sum of all: "
                  f"{ms(row['lease_alternating'])}")
        if "lease_far" in row:
            print(f"{n} replicas, lease renewal in a fleet of {args.far_hosts} through any replica, "
                  f"sum of all: {ms(row['lease_far'])}")
    for n, row in results.items():
        if "write_only" in row:
            print(f"{n} replicas, status write to one replica, its CPU less following: "
                  f"{ms(row['write_only'])}; replica 1 following only: {ms(row['follow'])} "
                  f"(in the kernel: {ms(row['follow_kernel'])})")
        if "paced_follow" in row:
            print(f"{n} replicas, followed event, writes made in the store at {args.follow_rate:.0f}/s "
                  f"(reached {row['paced_rate']:.0f}/s), each replica (median): "
                  f"{ms(row['paced_follow'])}")
    for n, row in results.items():
        if "fleet_wall" not in row:
            continue
        hosts = args.fleet_hosts
        print(f"\nfleet: {hosts} hosts over {n} replicas for {row['fleet_wall']:.0f} s: "
              f"{row['fleet_leases']:.0f} lease renewals + {row['fleet_statuses']:.0f} status writes "
              f"({row['fleet_writes'] / row['fleet_wall']:.0f}/s), "
              f"{row['fleet_late']:.0f} more than 1 s late")
        print(f"  replicas: {row['fleet_server_cores']:.2f} cores; etcd (3 members): "
              f"{row['fleet_etcd_cores']:.2f} cores")
        # Per write (the pace may have slipped on a busy machine), times the
        # rate a fleet of that size writes at: leases every 10 s, statuses every --status-every.
        server_per_write = row["fleet_server_cpu"] / row["fleet_writes"]
        etcd_per_write = row["fleet_etcd_cpu"] / row["fleet_writes"]
        print(f"  per write: replicas {ms(server_per_write)} (all {n} together), etcd {ms(etcd_per_write)}")
        for big in (10_000, 100_000):
            rate = big / 10.0 + big / args.status_every
            print(f"  {big:,} hosts ({rate:,.0f} writes/s): replicas ≈ {server_per_write * rate:.1f} cores, "
                  f"etcd ≈ {etcd_per_write * rate:.1f} cores (linear; {n} replicas each following "
                  "every write)")


if __name__ == "__main__":
    main()
