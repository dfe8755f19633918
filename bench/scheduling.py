"""Scheduling: fit latency on the fleet index, the same queries against a real
OpenStack Placement's GET /allocation_candidates, and claims/s on SQLite.

- Fit: p50/p99 of `FleetIndex.fit` (what `reserve --auto` and a long-running
  scheduler call; the index is fed by the store's watch) over random
  cpu/memory requests, on fleets of 1k, 10k and 100k hosts: the full ranked
  list, and the best 10 (`--limit 10`).
- Placement: the same fleets (inventories and usages loaded through its API)
  and the same requests, at 1k and 10k providers, on SQLite in tmpfs, over
  HTTP on 127.0.0.1; the sets of fitting hosts are compared too.
- Claims: 8 processes claiming concurrently on SQLite through `Store.claim`
  (capacity re-checked inside the write), then a check that no host is
  overbooked.

    .venv/bin/python bench/scheduling.py [--sizes 1000,10000,100000]
        [--placement-sizes 1000,10000] [--queries 200] [--claims 200]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import multiprocessing
import random
import sys
import tempfile
import time
import urllib.parse
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "scheduling"))

from real_placement import RealPlacement

# The repository root: tests.support holds the test and bench tooling (local etcd).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.etcd_local import EtcdCluster

from hvfleet.model import Hypervisor
from hvfleet.model.capacity import free_capacity
from hvfleet.scheduling.claims import reserve
from hvfleet.scheduling.errors import DoesNotFit
from hvfleet.scheduling.index import FleetIndex
from hvfleet.scheduling.placement import export_inventories, placement_resources
from hvfleet.scheduling.request import Request, parse_request
from hvfleet.store import open_store
from hvfleet.store.ownership import agent_manager

GiB = 2**30


def fleet(n: int, seed: int = 1) -> list[Hypervisor]:
    rng = random.Random(seed)
    now = datetime.now(UTC).isoformat()
    out = []
    for i in range(n):
        cpus = rng.choice([32, 48, 64, 96, 128])
        mem = rng.choice([128, 256, 384, 512, 1024])
        out.append(
            Hypervisor.model_validate(
                {
                    "metadata": {"name": f"hv-{i:06d}", "labels": {"az": f"az-{i % 3}"}},
                    "spec": {
                        "overcommit": {"cpu": rng.choice([1.0, 2.0, 4.0]), "memory": 1.0},
                        "reserved": {"cpu": 2, "memory": "8Gi"},
                    },
                    "status": {
                        "capacity": {"cpu": cpus, "memory": f"{mem}Gi"},
                        "allocation": {
                            "cpu": rng.randint(0, cpus - 2),
                            "memory": f"{rng.randint(0, mem - 8)}Gi",
                        },
                        "conditions": [{"type": "Ready", "status": "True"}],
                        "lastHeartbeatTime": now,
                    },
                }
            )
        )
    return out


def requests(k: int, seed: int = 2) -> list[Request]:
    rng = random.Random(seed)
    return [
        parse_request(str(rng.choice([1, 2, 4, 8, 16, 32])), f"{rng.choice([2, 4, 8, 16, 32, 64, 128])}Gi")
        for _ in range(k)
    ]


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def ms(v: float) -> str:
    return f"{v * 1000:.2f} ms"


def bench_fit(index: FleetIndex, reqs: list[Request], limit: int | None) -> list[float]:
    lat = []
    for r in reqs:
        t = time.perf_counter()
        index.fit(r, limit=limit)
        lat.append(time.perf_counter() - t)
    return lat


def load_placement(p: RealPlacement, hosts: list[Hypervisor]) -> dict[str, str]:
    """Providers with the exported inventories and their usage as allocations."""
    c = p.client("1.27")
    uuids = {h.name: str(uuid.uuid5(uuid.NAMESPACE_DNS, h.name)) for h in hosts}
    for h in hosts:
        u = uuids[h.name]
        c.request("POST", "/resource_providers", {"name": h.name, "uuid": u})
        c.request(
            "PUT",
            f"/resource_providers/{u}/inventories",
            {"resource_provider_generation": 0, "inventories": export_inventories(h)},
        )
    batch = 500
    for start in range(0, len(hosts), batch):
        allocations = {}
        for h in hosts[start : start + batch]:
            used = {
                "VCPU": int(h.status.allocation[next(iter(h.status.allocation))].value),
            }
            mem = [q for r, q in h.status.allocation.items() if str(r) == "memory"]
            if mem and mem[0].value:
                used["MEMORY_MB"] = int(mem[0].value) // 2**20
            used = {k: v for k, v in used.items() if v}
            if used:
                allocations[uuids[h.name]] = {"resources": used}
        if allocations:
            c.request(
                "POST",
                "/allocations",
                {
                    str(uuid.uuid4()): {
                        "allocations": allocations,
                        "project_id": "bench",
                        "user_id": "bench",
                    }
                },
            )
    c.close()
    return {u: n for n, u in uuids.items()}


def bench_placement(
    p: RealPlacement, names: dict[str, str], reqs: list[Request], index: FleetIndex
) -> tuple[list[float], int]:
    c = p.client()
    lat, mismatches = [], 0
    for r in reqs:
        q = ",".join(f"{k}:{v}" for k, v in placement_resources(r).items())
        t = time.perf_counter()
        out = c.get("/allocation_candidates?" + urllib.parse.urlencode({"resources": q}))
        lat.append(time.perf_counter() - t)
        theirs = {names[u] for u in out["provider_summaries"]}
        mine = {x.name for x in index.fit(r).candidates}
        mismatches += mine != theirs
    c.close()
    return lat, mismatches


def _claimer(url: str, hosts: list[str], n: int, seed: int) -> tuple[int, int]:
    rng = random.Random(seed)
    ok = refused = 0
    req = parse_request("2", "4Gi")
    with open_store(url) as s:
        for _ in range(n):
            try:
                reserve(s, rng.choice(hosts), req, str(uuid.UUID(int=rng.getrandbits(128))))
                ok += 1
            except DoesNotFit:
                refused += 1
    return ok, refused


def bench_claims(n_hosts: int, per_process: int, backend: str = "sqlite") -> None:
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        if backend == "etcd":
            cluster = stack.enter_context(EtcdCluster(Path(tmp) / "etcd", size=1))
            url = cluster.url(prefix="/bench")
        else:
            url = f"sqlite:///{tmp}/bench.db"
        hosts = fleet(n_hosts, seed=3)
        with open_store(url) as s:
            for h in hosts:
                created = s.create(h.model_copy(update={"status": type(h.status)()}), "bench")
                s.update(created.model_copy(update={"status": h.status}), agent_manager(h.name))
        names = [h.name for h in hosts]
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(8) as pool:
            t = time.perf_counter()
            results = pool.starmap(_claimer, [(url, names, per_process, seed) for seed in range(8)])
            wall = time.perf_counter() - t
        ok = sum(r[0] for r in results)
        refused = sum(r[1] for r in results)
        with open_store(url) as s:
            res = s.list_reservations()
            now = datetime.now(UTC)
            over = sum(
                any(v < 0 for v in free_capacity(h, res, now).values())
                and not any(v < 0 for v in free_capacity(h, [], now).values())
                for h in s.list_hypervisors()
            )
        print(
            f"claims, 8 processes on {backend}, {n_hosts} hosts: {ok + refused} attempts in "
            f"{wall:.2f} s = {(ok + refused) / wall:,.0f} claims/s "
            f"({ok} taken, {refused} did not fit); hosts overbooked by claims: {over}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--placement-sizes", default="1000,10000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--placement-queries", type=int, default=30)
    ap.add_argument("--claims", type=int, default=200, help="claims per process")
    ap.add_argument("--claim-stores", default="sqlite", help="sqlite,etcd")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x]
    psizes = {int(x) for x in args.placement_sizes.split(",") if x}
    reqs = requests(args.queries)
    print("fit latency, fleet index (in process), random cpu/memory requests")
    print(
        f"{'hosts':>8}  {'build':>8}  {'p99 all, gc':>12}  {'p50 all':>10}  {'p99 all':>10}  "
        f"{'p50 top10':>10}  {'p99 top10':>10}  {'placement p50':>14}  {'ratio p50':>10}"
    )
    for n in sizes:
        hosts = fleet(n)
        t = time.perf_counter()
        # The Placement load at 10k takes minutes: keep heartbeats "fresh" for it.
        index = FleetIndex(staleness=timedelta(days=1))
        index.load(hosts, [])
        build = time.perf_counter() - t
        bench_fit(index, reqs[:10], None)  # warm up
        gc_full = bench_fit(index, reqs, None)
        # A long-running scheduler moves what lives as long as the index out of
        # the cyclic GC's reach once loaded; without it, full collections that
        # walk every Fraction and model object of the fleet land in the p99.
        gc.freeze()
        full = bench_fit(index, reqs, None)
        top = bench_fit(index, reqs, 10)
        gc.unfreeze()
        line = (
            f"{n:>8}  {build:>7.1f}s  {ms(pct(gc_full, 99)):>12}  "
            f"{ms(pct(full, 50)):>10}  {ms(pct(full, 99)):>10}  "
            f"{ms(pct(top, 50)):>10}  {ms(pct(top, 99)):>10}"
        )
        if n in psizes:
            with RealPlacement() as p:
                t = time.perf_counter()
                names = load_placement(p, hosts)
                load = time.perf_counter() - t
                plat, mism = bench_placement(p, names, reqs[: args.placement_queries], index)
            line += (
                f"  {ms(pct(plat, 50)):>14}  {pct(plat, 50) / pct(full, 50):>9.0f}x"
                f"   (placement p99 {ms(pct(plat, 99))}, load {load:.0f}s, "
                f"{mism} set mismatches in {len(plat)} queries)"
            )
        print(line, flush=True)
    for backend in args.claim_stores.split(","):
        bench_claims(200, args.claims, backend)
        bench_claims(1, args.claims, backend)


if __name__ == "__main__":
    main()
