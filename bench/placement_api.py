"""hvfleet's Placement API (`/placement` of `hvfleet serve`) next to a real
OpenStack Placement 16.0 (its own WSGI app under wsgiref on SQLite, as
tests/scheduling/real_placement.py runs it), measured in the same run.

hvfleet is the real server: `python -m hvfleet.server` in its own process,
HTTPS with the CA it makes, token authentication (an admin token in
`X-Auth-Token`) and the role checks, over SQLite (and etcd for the claims).

1. Claims, on each of `--stores`: `--clients` threads each PUT
   /allocations/{new consumer} for 1 DISK_GB on one provider, `--claims` in
   all, each thread on its own keep-alive connection; claims/s and p50. Then
   a contended round: capacity for half of the attempts; the figure that
   matters is 0 overbooked (usage equals the claims that succeeded, and never
   passes the capacity).
2. `GET /allocation_candidates?resources=VCPU:1,MEMORY_MB:1024&limit=1000`
   (what Nova's scheduler asks, with its default limit) at each of `--sizes`
   providers (each with VCPU, MEMORY_MB and DISK_GB inventories). Timed at
   the client from sending the request to the answer's last byte; parsing its
   JSON (the same for both, several ms for a 444 KiB body) is timed apart and
   not counted. The peers are measured **interleaved**: `--queries` rounds,
   each `--ours-per-round` requests to every hvfleet server and one to real
   Placement (whose answer takes 100-1000x longer), the order turning each
   round, so all are measured over the same minutes of a loaded machine; the
   first request to each (hvfleet builds its index) is not measured. p50 and
   p90: warm (nothing changed since the last query), and right after a claim
   on one of the providers (a scheduler's steady state: every answer follows a
   write). Beside them, the per-request floor (the same URL asking for more
   than any provider has: transport, token, policy, parsing, an empty
   answer), the floor (bench/floor_server.py: a bare ASGI app on the same
   HTTP stack sending hvfleet's answer bytes, gzip-encoded when the client
   takes it, over plain HTTP and over HTTPS with hvfleet's certificate,
   interleaved with the rest;
   `--no-floor` leaves it out), the client's own CPU and the server
   process's CPU over each request,
   and, in this process over the same store, where hvfleet's time goes
   (snapshot load, first index, find, encoding). hvfleet answers over each of
   `--candidate-stores` (SQLite, a one-member etcd), each through a server
   per `--transports`: HTTPS as deployed, and plain HTTP on loopback, the
   transport real Placement is measured on (wsgiref, no TLS; HTTP/1.0, a new
   connection per request, which costs it ~0.1 ms). With `--base CHECKOUT`,
   that checkout's `hvfleet serve` answers beside each (`base/...`, its own
   .venv, the same store), in the same rounds: a change's effect measured
   interleaved. The client is Python's http.client; `--accept-encoding`
   sets the header it sends (none by default; requests, Nova's client under
   keystoneauth, sends `gzip, deflate`), and each figure says how the answer
   came (a compressed answer is decoded within the timed span). Both fleets are seeded
   straight into their databases (hvfleet's as provider records,
   Placement's as rows in its tables, as bench/placement_candidates.py does):
   10,000 providers through Placement's API would take an hour on a loaded
   machine.

3. nova-compute's reads of its own provider (`--gets-stores`, at each of
   `--sizes`): GET the provider by uuid, the providers `in_tree` of it, its
   inventories, traits, aggregates, allocations and usages, the allocations
   of a consumer holding resources on it and the usages of that consumer's
   project; p50 of each over `--queries` providers (one claim of 1 VCPU made
   on each first, through the API), next to real Placement over the same
   fleet; and, on hvfleet, a provider's usages read right after a claim on it
   (the read waits for the server's snapshot to have the write).

    .venv/bin/python bench/placement_api.py [--sizes 1000,10000] [--claims 400] [--clients 8]
        [--stores sqlite,etcd] [--queries 20] [--candidate-stores sqlite,etcd] [--transports https,http]
        [--ours-per-round 5] [--no-floor] [--base CHECKOUT] [--accept-encoding 'gzip, deflate']
        [--sections claims,candidates,gets] [--gets-stores sqlite,etcd]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import http.client
import json
import os
import sqlite3
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "scheduling"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from api import Server, make_token
from real_placement import RealPlacement
from tests.support.etcd_local import EtcdCluster

from hvfleet.model.meta import ObjectMeta
from hvfleet.model.placement import (
    PlacementInventory,
    ResourceProvider,
    ResourceProviderSpec,
)
from hvfleet.placement.candidates import find_candidates, parse_candidates_query, render_candidates_json
from hvfleet.placement.snapshot import ProviderSnapshot
from hvfleet.store import Store, open_store
from hvfleet.store.base import Write

VERSION = "placement 1.39"


@dataclass(frozen=True)
class Got:
    """One timed GET: status, parsed body, seconds to the answer's last byte,
    the body's size, the client thread's CPU seconds over that span, and the
    seconds json.loads then took (not counted in `took`), and the server
    process's CPU seconds over the same span (what its idle threads burn
    while the client parses is not counted)."""

    status: int
    doc: Any
    took: float
    size: int
    cpu: float
    parse: float
    server: float = 0.0
    encoding: str = "identity"  # the answer's Content-Encoding (decoded within `took`)
    wire: int = 0  # the body's bytes as sent (`size` is the decoded body's)


class Endpoint:
    """One Placement (hvfleet's or the real one): a connection per thread.
    `accept_encoding`, when set, is sent with every timed GET (as requests,
    keystoneauth's HTTP client, sends `gzip, deflate`)."""

    accept_encoding = ""

    def __init__(self, name: str, host: str, port: int, prefix: str, token: str,
                 context: ssl.SSLContext | None, pid: int | None = None, tls: Path | None = None) -> None:
        self.name, self.host, self.port, self.prefix = name, host, port, prefix
        self.token, self.context, self.pid = token, context, pid
        self.tls = tls  # the server's TLS directory (server.crt, server.key), when HTTPS

    def cpu(self) -> float:
        """The server process's CPU seconds so far, all its threads: the sum
        of their schedstat run times (nanoseconds; /proc/PID/stat counts
        10 ms ticks, too coarse for a request of a millisecond). A thread
        that ended is no longer counted: only the threads that live through
        a measurement may be compared."""
        if self.pid is None:
            return 0.0
        total = 0
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                total += int((task / "schedstat").read_text().split()[0])
        return total / 1e9

    def connection(self) -> http.client.HTTPConnection:
        if self.context is None:
            return http.client.HTTPConnection(self.host, self.port, timeout=120)
        return http.client.HTTPSConnection(self.host, self.port, timeout=120, context=self.context)

    def timed_get(self, conn: http.client.HTTPConnection, path: str) -> Got:
        """GET `path`, timed from sending the request to the last byte of
        the answer (decoded, when it came compressed, as requests decodes
        it): wall, this thread's CPU (sending, receiving, TLS, decoding) and
        the server's CPU; parsing the JSON (the same for both peers) is timed
        apart."""
        headers = {"X-Auth-Token": self.token, "OpenStack-API-Version": VERSION,
                   "Accept": "application/json"}
        if self.accept_encoding:
            headers["Accept-Encoding"] = self.accept_encoding
        server = self.cpu()
        c = time.thread_time()
        t = time.perf_counter()
        conn.request("GET", self.prefix + path, headers=headers)
        r = conn.getresponse()
        raw = r.read()
        wire = len(raw)
        encoding = r.getheader("content-encoding") or "identity"
        if encoding == "gzip":
            raw = gzip.decompress(raw)
        took = time.perf_counter() - t
        cpu = time.thread_time() - c
        server = self.cpu() - server
        t = time.perf_counter()
        doc = json.loads(raw)
        return Got(r.status, doc, took, len(raw), cpu, time.perf_counter() - t, server, encoding, wire)

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


@dataclass
class ClaimRound:
    rate: float  # claims that succeeded per second (wall clock)
    p50: float  # of the claims that succeeded, from the first PUT to the 204
    won: int
    usage: int  # what the provider's usages say afterwards
    requests: int  # PUTs sent, retries of a lost race included
    cpu: float  # the server process's CPU seconds over the round


def claims(ep: Endpoint, clients: int, n: int, capacity: int) -> ClaimRound:
    """`n` attempts from `clients` threads, each retrying a lost race (409
    concurrent update) as Nova does, until it is taken or refused as full."""
    conn = ep.connection()
    rp = provider(ep, conn, capacity)
    won: list[float] = []
    sent = [0]
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
                with lock:
                    sent[0] += 1
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
    cpu = ep.cpu()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    cpu = ep.cpu() - cpu
    # A new connection: the first one sat idle past the server's keep-alive.
    _, usage = ep.call(ep.connection(), "GET", f"/resource_providers/{rp}/usages")
    return ClaimRound(len(won) / elapsed, statistics.median(won), len(won),
                      usage["usages"].get("DISK_GB", 0), sent[0], cpu)


INVENTORY = {"VCPU": {"total": 64, "allocation_ratio": 4.0},
             "MEMORY_MB": {"total": 262144, "max_unit": 262144},
             "DISK_GB": {"total": 2000}}


def seed_hvfleet(store: Store, n: int, start: int, batch_size: int = 500) -> None:
    batch: list[Write] = []
    for i in range(start, n):
        uid = str(uuid.UUID(int=i + 1))
        spec = ResourceProviderSpec(
            provider_name=f"cn{i:05d}", root_uuid=uid, generation=1,
            inventories={rc: PlacementInventory(**inv) for rc, inv in INVENTORY.items()})
        batch.append(Write("create", ResourceProvider(metadata=ObjectMeta(name=uid), spec=spec)))
        if len(batch) == batch_size:
            store.write_all(batch, "bench")
            batch = []
    if batch:
        store.write_all(batch, "bench")


def seed_real(real: RealPlacement, n: int, start: int) -> None:
    """Rows straight into real Placement's tables (its resource class ids:
    VCPU 0, MEMORY_MB 1, DISK_GB 2), while it runs: it reads them per request."""
    class_ids = {"VCPU": 0, "MEMORY_MB": 1, "DISK_GB": 2}
    db = sqlite3.connect(real.workdir / "placement.db", timeout=60)
    with db:
        first = db.execute("SELECT coalesce(max(id), 0) FROM resource_providers").fetchone()[0] + 1
        for k, i in enumerate(range(start, n)):
            rid = first + k
            uid = str(uuid.UUID(int=i + 1))
            db.execute("INSERT INTO resource_providers (id, uuid, name, generation, root_provider_id) "
                       "VALUES (?, ?, ?, 1, ?)", (rid, uid, f"cn{i:05d}", rid))
            for rc, inv in INVENTORY.items():
                db.execute(
                    "INSERT INTO inventories (resource_provider_id, resource_class_id, total, reserved, "
                    "min_unit, max_unit, step_size, allocation_ratio) VALUES (?, ?, ?, 0, 1, ?, 1, ?)",
                    (rid, class_ids[rc], inv["total"], inv.get("max_unit", inv["total"]),
                     inv.get("allocation_ratio", 1.0)))
    db.close()


CANDIDATES = "/allocation_candidates?resources=VCPU:1,MEMORY_MB:1024&limit=1000"
NOTHING_FITS = "/allocation_candidates?resources=VCPU:100000"


@dataclass(frozen=True)
class Timing:
    p50: float
    p90: float
    note: str
    cpu: float = 0.0  # the server's CPU seconds per request (its idle threads' included)


class Turns:
    """One peer's side of an interleaved measurement: its connection, and per
    request the wall seconds, the client's CPU and parse seconds, and the
    server process's CPU over the request (read from /proc before sending and
    after the last byte: not while the client parses)."""

    def __init__(self, ep: Endpoint) -> None:
        self.ep, self.conn = ep, ep.connection()
        self.times: list[float] = []
        self.client: list[float] = []
        self.parse: list[float] = []
        self.extra: list[float] = []  # the claim before each query, when there is one
        self.server = 0.0
        self.last: Got | None = None
        self.used = time.monotonic()

    def keep_open(self) -> None:
        """Before a turn: a connection idle for more than 2 s (uvicorn drops
        a kept-alive one after 5 s, and at 10k a round of real Placement takes
        longer) is opened again, with one unmeasured request, so that no
        measured request pays a new connection or TLS handshake."""
        if time.monotonic() - self.used > 2.0:
            self.conn.close()
            self.conn = self.ep.connection()
            status, doc = self.ep.call(self.conn, "GET", NOTHING_FITS)
            assert status == 200, doc

    def timing(self, note: str) -> Timing:
        per_request = self.server / len(self.times)
        return Timing(statistics.median(self.times), quantile(self.times, 0.9), note, per_request)


def interleaved(eps: list[Endpoint], theirs: Endpoint, rounds: int, ours_per_round: int,
                one: Callable[[Turns], None]) -> dict[str, Turns]:
    """`rounds` rounds; in each, `ours_per_round` requests to each of hvfleet's
    endpoints and one to real Placement, the order turning round by round, so
    every peer is measured over the same minutes of a loaded machine. `one`
    makes one measured request and records it."""
    sides = [Turns(ep) for ep in [*eps, theirs]]
    for side in sides:  # the first request (hvfleet builds its index, both warm caches): not measured
        status, doc = side.ep.call(side.conn, "GET", CANDIDATES)
        assert status == 200, doc
    for r in range(rounds):
        for side in sides[r % len(sides):] + sides[:r % len(sides)]:
            if side.ep is not theirs:  # real Placement (HTTP/1.0) opens one per request anyway
                side.keep_open()
            for _ in range(1 if side.ep is theirs else ours_per_round):
                one(side)
            side.used = time.monotonic()
    return {side.ep.name: side for side in sides}


def candidates_get(path: str) -> Callable[[Turns], None]:
    """One GET of `path` (answered 200), recorded."""
    def one(side: Turns) -> None:
        got = side.ep.timed_get(side.conn, path)
        assert got.status == 200, got.doc
        side.times.append(got.took)
        side.client.append(got.cpu)
        side.parse.append(got.parse)
        side.server += got.server
        side.last = got
    return one


def candidates_note(side: Turns) -> str:
    got = side.last
    assert got is not None
    return (f"({len(got.doc['allocation_requests'])} candidates, {got.size / 1024:.0f} KiB "
            f"sent as {got.encoding} in {got.wire / 1024:.0f} KiB, "
            f"{len(side.times)} queries; client CPU {ms(statistics.median(side.client))}, "
            f"json.loads {ms(statistics.median(side.parse))} (not counted); "
            f"server CPU {ms(side.server / len(side.times))})")


def after_claim(size: int) -> Callable[[Turns], None]:
    """A claim of 1 VCPU (a new consumer) on one of the `size` providers,
    then the candidates query: the query recorded, the claim's time apart."""
    counter = iter(range(1 << 30))

    def one(side: Turns) -> None:
        k = next(counter)
        rp = str(uuid.UUID(int=(k * 7919) % size + 1))
        body = {"allocations": {rp: {"resources": {"VCPU": 1}}}, "project_id": "p", "user_id": "u",
                "consumer_generation": None, "consumer_type": "INSTANCE"}
        server = side.ep.cpu()
        t = time.perf_counter()
        status, doc = side.ep.call(side.conn, "PUT", f"/allocations/{uuid.uuid4()}", body)
        side.extra.append(time.perf_counter() - t)
        side.server += side.ep.cpu() - server
        assert status == 204, doc
        candidates_get(CANDIDATES)(side)
    return one


def after_claim_note(side: Turns) -> str:
    return (f"(the claim before each, one client: p50 {ms(statistics.median(side.extra))}; "
            f"{len(side.times)} pairs; server CPU per claim + query {ms(side.server / len(side.times))})")


def in_process(store: Store, queries: int) -> dict[str, float]:
    """hvfleet's own steps over the same store, in this process: the
    snapshot's first load and graph, the first index, then per query
    find_candidates and the body's text (p50)."""
    params = {"resources": ["VCPU:1,MEMORY_MB:1024"], "limit": ["1000"]}
    out: dict[str, float] = {}
    t = time.perf_counter()
    snap = ProviderSnapshot.from_store(store)
    out["snapshot load"] = time.perf_counter() - t
    t = time.perf_counter()
    graph = snap.graph()
    out["first graph"] = time.perf_counter() - t
    q = parse_candidates_query(params, (1, 39))
    t = time.perf_counter()
    find_candidates(graph, q)
    out["first find (index built)"] = time.perf_counter() - t
    finds, texts = [], []
    for _ in range(queries):
        t = time.perf_counter()
        answer = find_candidates(graph, parse_candidates_query(params, (1, 39)))
        t1 = time.perf_counter()
        render_candidates_json(answer, (1, 39))
        t2 = time.perf_counter()
        finds.append(t1 - t)
        texts.append(t2 - t1)
    out["parse + find p50"] = statistics.median(finds)
    out["encode p50"] = statistics.median(texts)
    return out


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def open_bench_store(kind: str, work: Path, stack: contextlib.ExitStack) -> Store:
    if kind == "sqlite":
        return open_store(f"sqlite:///{work}/hvfleet.db")
    cluster = stack.enter_context(EtcdCluster(work / "etcd", size=1))
    return open_store(cluster.url(prefix="/bench-placement"))


def claims_round(kind: str, args: argparse.Namespace, theirs: Endpoint | None) -> None:
    with contextlib.ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix=f"bench-placement-{kind}-"))
        _, (ours,) = hvfleet_endpoints(kind, work, stack, ["https"])
        peers = [ours] if theirs is None else [ours, theirs]
        print(f"PUT /allocations, {args.clients} clients, {args.claims} claims of 1 DISK_GB on one provider "
              "(server CPU per claim that succeeded)")
        for ep in peers:
            r = claims(ep, args.clients, args.claims, 10 * args.claims)
            print(f"  {ep.name:20} {r.rate:7.1f} claims/s  p50 {ms(r.p50)}  succeeded {r.won}"
                  f"  usage {r.usage}  requests {r.requests}  CPU/claim {ms(r.cpu / r.won)}")
        print(f"contended: capacity {args.claims // 2} for {args.claims} attempts")
        for ep in peers:
            r = claims(ep, args.clients, args.claims, args.claims // 2)
            over = max(0, r.usage - args.claims // 2) + abs(r.usage - r.won)
            print(f"  {ep.name:20} {r.rate:7.1f} claims/s  succeeded {r.won}  usage {r.usage}"
                  f"  overbooked {over}  requests {r.requests}  CPU/attempt {ms(r.cpu / args.claims)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--claims", type=int, default=400)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--stores", default="sqlite,etcd",
                    help="where the claims are measured ('' for none)")
    ap.add_argument("--candidate-stores", default="sqlite,etcd",
                    help="the stores hvfleet answers candidates over (one server each per transport)")
    ap.add_argument("--transports", default="https,http",
                    help="hvfleet's listeners: https (as deployed), http (plain, as real Placement here)")
    ap.add_argument("--ours-per-round", type=int, default=5,
                    help="candidates: hvfleet requests per server for each real Placement one (interleaved)")
    ap.add_argument("--no-floor", action="store_true",
                    help="candidates: without bench/floor_server.py (a bare ASGI app sending the same body)")
    ap.add_argument("--base", type=Path, default=None,
                    help="candidates: also serve from this checkout (its .venv), over the same stores, "
                         "in the same rounds")
    ap.add_argument("--accept-encoding", default="",
                    help="candidates: the Accept-Encoding the client sends every peer ('': none; "
                         "requests, as keystoneauth uses it, sends 'gzip, deflate')")
    ap.add_argument("--sections", default="claims,candidates,gets")
    ap.add_argument("--gets-stores", default="sqlite,etcd",
                    help="where nova-compute's reads are measured")
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    real = RealPlacement().start()
    port = int(real.url.rsplit(":", 1)[1])
    assert real.proc is not None
    theirs = Endpoint("placement", "127.0.0.1", port, "", "admin", None, real.proc.pid)
    seeded = RealSeeded(real)
    try:
        if "claims" in sections:
            for i, kind in enumerate(k for k in args.stores.split(",") if k):
                claims_round(kind, args, theirs if i == 0 else None)
        if args.sizes and "candidates" in sections:
            candidates_rounds(args, seeded, theirs)
        if args.sizes and "gets" in sections:
            gets_rounds(args, seeded, theirs)
    finally:
        real.stop()


class RealSeeded:
    """Real Placement's fleet, grown to a size once for every section."""

    def __init__(self, real: RealPlacement) -> None:
        self.real, self.have = real, 0

    def grow(self, size: int) -> float:
        t = time.perf_counter()
        if size > self.have:
            seed_real(self.real, size, self.have)
            self.have = size
        return time.perf_counter() - t


def quantile(times: list[float], q: float) -> float:
    """The `q` quantile (0.9: p90) of `times`, as statistics.quantiles puts it."""
    if len(times) < 2:
        return times[0]
    return statistics.quantiles(times, n=100, method="inclusive")[round(q * 100) - 1]


def hvfleet_endpoints(kind: str, work: Path, stack: contextlib.ExitStack,
                      transports: list[str], base: Path | None = None) -> tuple[Store, list[Endpoint]]:
    """A store of `kind` and one `hvfleet serve` over it per transport: HTTPS
    (as deployed, with its own CA) and plain HTTP on loopback (the transport
    real Placement is measured on here: wsgiref, no TLS). With `base` (a
    checkout with its own .venv), that checkout's `hvfleet serve` too, per
    transport, over the same store: the code before a change, measured in the
    same rounds."""
    store = open_bench_store(kind, work, stack)
    stack.callback(store.close)
    token = make_token(store, "admin", name="bench-admin")
    out = []
    for transport in transports:
        plain = transport == "http"
        checkouts = [("hvfleet", sys.executable)]
        if base is not None:
            checkouts.append(("base", str(base / ".venv" / "bin" / "python")))
        for name, python in checkouts:
            server = Server(store.url, work / f"{name}-server-{transport}", plain=plain, python=python)
            stack.callback(server.stop)
            context = None if plain else ssl.create_default_context(cafile=str(server.ca))
            out.append(Endpoint(f"{name}/{kind}/{transport}", "127.0.0.1", server.port, "/placement", token,
                                context, server.proc.pid,
                                None if plain else work / f"{name}-server-{transport}" / "tls"))
    return store, out


def floor_endpoints(ours: list[Endpoint], stack: contextlib.ExitStack) -> list[Endpoint]:
    """bench/floor_server.py answering with the body the first of `ours`
    gives (its warm candidates answer): the same HTTP stack with nothing of
    hvfleet's above it, over plain HTTP, and over HTTPS (with an hvfleet
    server's own certificate and key) when one of `ours` is HTTPS."""
    first = ours[0]
    conn = first.connection()
    conn.request("GET", first.prefix + CANDIDATES, headers={
        "X-Auth-Token": first.token, "OpenStack-API-Version": VERSION, "Accept": "application/json"})
    answer = conn.getresponse()
    body = answer.read()
    assert answer.status == 200, body
    fd, name = tempfile.mkstemp(prefix="bench-placement-floor-", suffix=".json")
    os.write(fd, body)
    os.close(fd)
    out = []
    secure = next((ep for ep in ours if ep.tls is not None), None)
    for transport, tls in (("http", []), ("https", [] if secure is None else [secure.tls])):
        if transport == "https" and not tls:
            continue
        files = [str(tls[0] / "server.crt"), str(tls[0] / "server.key")] if tls else []
        proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("floor_server.py")), name,
                                 *files], stdout=subprocess.PIPE, text=True)
        stack.callback(_stop, proc)
        assert proc.stdout is not None
        port = int(proc.stdout.readline().strip().rsplit(":", 1)[1])
        out.append(Endpoint(f"floor/{transport}", "127.0.0.1", port, "", "",
                            secure.context if tls and secure is not None else None, proc.pid))
    return out


def _stop(proc: subprocess.Popen[str]) -> None:
    """Stop a floor server: uvicorn waits for its open keep-alive connections
    (the bench's clients hold theirs to the end), so kill it after a grace."""
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def candidates_rounds(args: argparse.Namespace, seeded: RealSeeded, theirs: Endpoint) -> None:
    kinds = [k for k in args.candidate_stores.split(",") if k]
    transports = [t for t in args.transports.split(",") if t]
    with contextlib.ExitStack() as stack:
        fleets: list[tuple[str, Store, list[Endpoint]]] = []
        for kind in kinds:
            work = Path(tempfile.mkdtemp(prefix=f"bench-placement-candidates-{kind}-"))
            store, eps = hvfleet_endpoints(kind, work, stack, transports, args.base)
            fleets.append((kind, store, eps))
        have = 0
        Endpoint.accept_encoding = args.accept_encoding
        for size in [int(s) for s in args.sizes.split(",")]:
            print(f"GET /allocation_candidates at {size} providers; client: Python's http.client, one "
                  f"keep-alive connection per peer, Accept-Encoding: {args.accept_encoding or '(none)'}")
            for kind, store, eps in fleets:
                t = time.perf_counter()
                seed_hvfleet(store, size, have, 500 if kind == "sqlite" else 50)  # etcd: --max-txn-ops
                print(f"  hvfleet/{kind} seeded in {time.perf_counter() - t:.1f} s")
                for ep in eps:
                    t = time.perf_counter()
                    ep.call(ep.connection(), "GET", CANDIDATES)
                    print(f"  {ep.name} first query after seeding (snapshot catches up, index built): "
                          f"{ms(time.perf_counter() - t)}")
            print(f"  placement seeded in {seeded.grow(size):.1f} s")
            have = size
            ours = [ep for _, _, eps in fleets for ep in eps]
            floor = [] if args.no_floor else floor_endpoints(ours, stack)
            k = args.ours_per_round
            rounds = [("warm", args.queries, candidates_get(CANDIDATES), candidates_note, floor),
                      ("right after a claim", max(5, args.queries // 2), after_claim(size), after_claim_note,
                       []),
                      ("nothing fits (the per-request floor: an empty authenticated answer)", args.queries,
                       candidates_get(NOTHING_FITS), candidates_note, floor)]
            for title, n, one, note, bare in rounds:
                print(f"  {title}: {n} rounds, each {k} requests to each hvfleet server"
                      f"{' and the floor' if bare else ''} and 1 to real Placement, interleaved")
                sides = interleaved([*ours, *bare], theirs, n, k, one)
                got = {name: side.timing(note(side)) for name, side in sides.items()}
                for name, timing in got.items():
                    print(f"    {name:22} p50 {ms(timing.p50)}  p90 {ms(timing.p90)}  {timing.note}")
                real = got[theirs.name]
                for ep in [*ours, *bare]:
                    print(f"    ratio {ep.name:16} p50 {real.p50 / got[ep.name].p50:6.1f}x  "
                          f"p90 {real.p90 / got[ep.name].p90:6.1f}x  "
                          f"server CPU {real.cpu / max(got[ep.name].cpu, 1e-6):6.1f}x")
                for ep in ours:
                    before = got.get(ep.name.replace("hvfleet/", "base/", 1))
                    if ep.name.startswith("hvfleet/") and before is not None:
                        speedup = before.p50 / got[ep.name].p50
                        print(f"    base / hvfleet {ep.name[8:]:9} p50 {speedup:5.2f}x  "
                              f"server CPU {before.cpu / max(got[ep.name].cpu, 1e-6):5.2f}x")
            for kind, store, _ in fleets:
                if kind == "sqlite":
                    for step, took in in_process(store, args.queries).items():
                        print(f"  in process: {step:26} {ms(took)}")


# nova-compute's reads of its own provider ({rp}) and of a consumer on it.
GETS = [
    ("provider by uuid", "/resource_providers/{rp}"),
    ("providers in_tree", "/resource_providers?in_tree={rp}"),
    ("inventories", "/resource_providers/{rp}/inventories"),
    ("traits", "/resource_providers/{rp}/traits"),
    ("aggregates", "/resource_providers/{rp}/aggregates"),
    ("allocations of the provider", "/resource_providers/{rp}/allocations"),
    ("usages of the provider", "/resource_providers/{rp}/usages"),
    ("allocations of a consumer", "/allocations/{consumer}"),
    ("usages of its project", "/usages?project_id={project}"),
]


def provider_reads(ep: Endpoint, queries: int, size: int) -> tuple[dict[str, float], float, list[float]]:
    """p50 of each of GETS over `queries` providers, each holding one claim
    of 1 VCPU (made first, through the API, by a consumer of a project of its
    own); p50 of the provider's usages read right after that claim; and every
    GET's time, in order."""
    conn = ep.connection()
    held: list[tuple[str, str, str]] = []
    after: list[float] = []
    for k in range(queries):
        rp = str(uuid.UUID(int=(k * 7919 + 13) % size + 1))
        consumer, project = str(uuid.uuid4()), str(uuid.uuid4())
        status, doc = ep.call(conn, "PUT", f"/allocations/{consumer}", {
            "allocations": {rp: {"resources": {"VCPU": 1}}}, "project_id": project, "user_id": "u",
            "consumer_generation": None, "consumer_type": "INSTANCE"})
        assert status == 204, doc
        got = ep.timed_get(conn, f"/resource_providers/{rp}/usages")
        assert got.status == 200 and got.doc["usages"]["VCPU"] >= 1, got.doc
        after.append(got.took)
        held.append((rp, consumer, project))
    times: dict[str, list[float]] = {name: [] for name, _ in GETS}
    for rp, consumer, project in held:
        for name, path in GETS:
            got = ep.timed_get(conn, path.format(rp=rp, consumer=consumer, project=project))
            assert got.status == 200, (name, got.doc)
            times[name].append(got.took)
    every = [t for name in times for t in times[name]]
    return {name: statistics.median(t) for name, t in times.items()}, statistics.median(after), every


def gets_rounds(args: argparse.Namespace, seeded: RealSeeded, theirs: Endpoint) -> None:
    kinds = [k for k in args.gets_stores.split(",") if k]
    sizes = [int(s) for s in args.sizes.split(",")]
    with contextlib.ExitStack() as stack:
        ours: dict[str, tuple[Store, Endpoint]] = {}
        for kind in kinds:
            work = Path(tempfile.mkdtemp(prefix=f"bench-placement-gets-{kind}-"))
            store, (ep,) = hvfleet_endpoints(kind, work, stack, ["https"])
            ours[kind] = store, ep
        have = 0
        for size in sizes:
            seeded.grow(size)
            print(f"nova-compute's GETs at {size} providers, p50 of {args.queries} providers")
            rows: dict[str, dict[str, float]] = {}
            notes = []
            for kind, (store, ep) in ours.items():
                seed_hvfleet(store, size, have, 500 if kind == "sqlite" else 50)  # etcd: --max-txn-ops
                t = time.perf_counter()
                ep.call(ep.connection(), "GET", f"/resource_providers/{uuid.UUID(int=1)}")
                notes.append(f"{ep.name} first GET after seeding (snapshot catches up) "
                             f"{ms(time.perf_counter() - t)}")
                began = time.perf_counter()
                rows[ep.name], right_after, every = provider_reads(ep, args.queries, size)
                notes.append(f"{ep.name} usages of a provider right after a claim on it: "
                             f"p50 {ms(right_after)}")
                # A write no follower sees held a GET up to FOLLOW_WAIT_S (0.5 s): the tail shows it.
                notes.append(f"{ep.name} all {len(every)} GETs over {time.perf_counter() - began:.1f} s: "
                             f"p50 {ms(statistics.median(every))} p90 {ms(quantile(every, 0.9))} "
                             f"p99 {ms(quantile(every, 0.99))} max {ms(max(every))}, "
                             f"{sum(t >= 0.4 for t in every)} took 0.4 s or more")
            rows[theirs.name], right_after, _ = provider_reads(theirs, args.queries, size)
            notes.append(f"{theirs.name} usages of a provider right after a claim on it: "
                         f"p50 {ms(right_after)}")
            have = size
            names = list(rows)
            print("  " + f"{'GET':30}" + "".join(f"{n:>16}" for n in names) + "   ratio (placement / each)")
            for name, _ in GETS:
                cells = "".join(f"{ms(rows[n][name]):>16}" for n in names)
                ratios = " ".join(f"{rows[theirs.name][name] / rows[n][name]:.0f}x"
                                  for n in names if n != theirs.name)
                print(f"  {name:30}{cells}   {ratios}")
            for note in notes:
                print(f"  {note}")


if __name__ == "__main__":
    main()
