"""Benchmark: a fleet of simulated agents against a 3-member etcd cluster and
against SQLite, with a scheduler watching, measured in the same run.

Load (the same for both backends): `--agents` Hypervisors (default 2,000), each
written by its own simulated agent every `--interval` seconds (default 10: a
heartbeat that rewrites status with lastHeartbeatTime and, every 6th time, a
changed allocation), as the agent's StatusWriter does: get, then CAS update as
manager agent/<name>. Objects carry a realistic status (~3 kB: capacity,
allocation, 2 NUMA cells, 20 instances, from bench/store_ops.py). Writers are
`--procs` processes × `--threads` threads; agents' first writes are spread over
one interval. One more process is the scheduler: it lists, then watches every
Hypervisor event.

Printed per backend:
- paced phase (`--duration` s at the target rate agents/interval): writes/s
  achieved, write latency p50/p99, how late writes ran against their schedule
  (p99: the backend keeps up only if this stays small), watch lag p50/p99
  (scheduler receives the event − the writer got its acknowledgement), events
  the scheduler missed (must be 0);
- saturation phase (`--saturate` s, no pacing): the most writes/s this machine
  sustains;
- resources after the run: etcd's RSS per member (now and peak), its data
  directory size and database size; SQLite's file sizes;
- etcd only: Lease renewals/s at saturation (`Store.keepalive`: a CAS
  update of the agent's small Lease object, one revision each; before Lease
  objects this was an etcd lease keepalive that wrote no revision).

The cluster runs with etcd's default election settings and fsync, data on
the machine's disk (a temp dir). Everything runs on 127.0.0.1 and is stopped
at the end.

Usage: .venv/bin/python bench/store_scale.py [--agents 2000] [--duration 60] [--quick]
"""

from __future__ import annotations

import argparse
import heapq
import json
import multiprocessing
import os
import random
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from store_ops import realistic

# The repository root: tests.support holds the test and bench tooling (local etcd).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from api import process_cpu as cpu_seconds
from tests.support.etcd_local import EtcdCluster

from hvfleet.model import Hypervisor, Quantity
from hvfleet.store import open_store
from hvfleet.store.etcd import EtcdStore


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def agent_name(i: int) -> str:
    return f"hv-{i:06d}"


# -- seeding ----------------------------------------------------------------------------


def _seed(url: str, names: list[str]) -> None:
    store = open_store(url)
    for name in names:
        h = realistic(name)
        store.create(h, f"agent/{name}")
    store.close()


def seed(url: str, agents: int, procs: int) -> float:
    t = time.perf_counter()
    ctx = multiprocessing.get_context("fork")
    chunks = [[agent_name(i) for i in range(p, agents, procs)] for p in range(procs)]
    ps = [ctx.Process(target=_seed, args=(url, c)) for c in chunks]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
        assert p.exitcode == 0, "seeding failed"
    return time.perf_counter() - t


# -- writers ----------------------------------------------------------------------------


@dataclass
class WriteRecord:
    revision: int
    done: float  # wall clock when the writer had its acknowledgement
    latency: float
    late: float  # how long after its scheduled time the write started


def _heartbeat(i: int, beat: int) -> Callable[[Hypervisor], Hypervisor]:
    def mutate(h: Hypervisor) -> Hypervisor:
        update: dict[str, Any] = {"last_heartbeat_time": datetime.now(UTC)}
        if beat % 6 == 0:  # the allocation moves now and then (a VM started/stopped)
            update["allocation"] = {"cpu": Quantity((i + beat) % 64), "memory": Quantity(2**34)}
        return h.model_copy(update={"status": h.status.model_copy(update=update)})

    return mutate


def _writer(
    url: str,
    agents: list[int],
    threads: int,
    start: float,
    duration: float,
    interval: float | None,
    out: Any,
) -> None:
    """Paced (interval given): agent i writes at start + offset_i + k*interval.
    Unpaced: every thread writes back to back, to random agents."""
    store = open_store(url)
    rng = random.Random(os.getpid())
    records: list[WriteRecord] = []
    errors: list[str] = []
    lock = threading.Lock()
    end = start + duration
    queue: list[tuple[float, int, int]] = []
    if interval is not None:
        for i in agents:
            queue.append((start + rng.random() * interval, i, 0))
        heapq.heapify(queue)

    def run() -> None:
        while True:
            if interval is not None:
                with lock:
                    due, i, beat = heapq.heappop(queue)
                    if due >= end:
                        return
                    heapq.heappush(queue, (due + interval, i, beat + 1))
                delay = due - time.time()
                if delay > 0:
                    time.sleep(delay)
            else:
                if time.time() >= end:
                    return
                due, i, beat = time.time(), rng.choice(agents), rng.randrange(6)
            t0 = time.time()
            try:
                h = store.update_hypervisor(agent_name(i), _heartbeat(i, beat), f"agent/{agent_name(i)}")
            except Exception as exc:
                with lock:
                    errors.append(str(exc))
                continue
            t1 = time.time()
            rec = WriteRecord(int(h.metadata.resource_version or 0), t1, t1 - t0, max(0.0, t0 - due))
            with lock:
                records.append(rec)

    ts = [threading.Thread(target=run) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    store.close()
    out.put(([(r.revision, r.done, r.latency, r.late) for r in records], errors))


def _watcher(url: str, since: int, stop_at: float, out: Any) -> None:
    store = open_store(url)
    seen: list[tuple[int, float]] = []
    stop = threading.Event()
    threading.Timer(max(0.0, stop_at - time.time()), stop.set).start()
    for e in store.watch("Hypervisor", since=since, stop=stop):
        seen.append((e.revision, time.time()))
    store.close()
    out.put(seen)


def run_phase(
    url: str, agents: int, procs: int, threads: int, duration: float, interval: float | None
) -> dict[str, Any]:
    ctx = multiprocessing.get_context("fork")
    q: Any = ctx.Queue()
    wq: Any = ctx.Queue()
    store = open_store(url)
    since = store.list("Hypervisor").revision
    store.close()
    start = time.time() + 1.0
    watcher = ctx.Process(target=_watcher, args=(url, since, start + duration + 3.0, wq))
    watcher.start()
    ps = [
        ctx.Process(
            target=_writer,
            args=(url, list(range(p, agents, procs)), threads, start, duration, interval, q),
        )
        for p in range(procs)
    ]
    for p in ps:
        p.start()
    records: list[tuple[int, float, float, float]] = []
    errors: list[str] = []
    for _ in ps:
        r, e = q.get()
        records += r
        errors += e
    for p in ps:
        p.join()
    seen = wq.get()
    watcher.join()
    got = {rev: t for rev, t in seen}
    lags = [got[rev] - done for rev, done, _, _ in records if rev in got]
    missed = sum(1 for rev, *_ in records if rev not in got)
    in_window = [r for r in records if r[1] <= start + duration]
    return {
        "writes": len(records),
        "writes_per_s": len(in_window) / duration,
        "errors": errors,
        "lat_p50_ms": pct([r[2] for r in records], 50) * 1000,
        "lat_p99_ms": pct([r[2] for r in records], 99) * 1000,
        "late_p99_ms": pct([r[3] for r in records], 99) * 1000,
        "lag_p50_ms": pct(lags, 50) * 1000,
        "lag_p99_ms": pct(lags, 99) * 1000,
        "missed": missed,
    }


# -- resources --------------------------------------------------------------------------


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in KiB: now and peak."""
    now = peak = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            now = int(line.split()[1])
        elif line.startswith("VmHWM:"):
            peak = int(line.split()[1])
    return now, peak


def children_cpu() -> float:
    """CPU seconds of this bench's finished (joined) child processes: the writers,
    the watcher and the seeders."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def du_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


def keepalive_rate(url: str, agents: int, seconds: float, threads: int) -> tuple[float, float]:
    store = EtcdStore.from_url(url)
    names = [agent_name(i) for i in range(agents)]
    for n in names:
        store.keepalive(n, 30)
    lat: list[float] = []
    lock = threading.Lock()
    end = time.time() + seconds

    def run(seed: int) -> None:
        rng = random.Random(seed)
        while time.time() < end:
            t = time.time()
            store.keepalive(rng.choice(names), 30)
            with lock:
                lat.append(time.time() - t)

    ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    store.close()
    return len(lat) / seconds, pct(lat, 99) * 1000


# -- main -------------------------------------------------------------------------------


def report(name: str, paced: dict[str, Any], sat: dict[str, Any], target: float) -> None:
    print(f"  paced at {target:.0f} writes/s target: {paced['writes_per_s']:.0f} writes/s achieved, "
          f"latency p50 {paced['lat_p50_ms']:.1f} ms p99 {paced['lat_p99_ms']:.1f} ms, "
          f"late p99 {paced['late_p99_ms']:.0f} ms")
    print(f"  scheduler watch lag p50 {paced['lag_p50_ms']:.1f} ms p99 {paced['lag_p99_ms']:.1f} ms, "
          f"missed events {paced['missed']}, write errors {len(paced['errors'])}")
    print(f"  saturation: {sat['writes_per_s']:.0f} writes/s, latency p50 {sat['lat_p50_ms']:.1f} ms "
          f"p99 {sat['lat_p99_ms']:.1f} ms, watch lag p99 {sat['lag_p99_ms']:.0f} ms, "
          f"missed {sat['missed']}, errors {len(sat['errors'])}")
    for e in (paced["errors"] + sat["errors"])[:3]:
        print(f"    error: {e}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=2000)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--saturate", type=float, default=15.0)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="200 agents, 10 s phases")
    ap.add_argument("--only", choices=["etcd", "sqlite"])
    args = ap.parse_args()
    if args.quick:
        args.agents, args.duration, args.saturate = 200, 10.0, 5.0
    target = args.agents / args.interval
    size = len(json.dumps(realistic(agent_name(0)).to_dict(), separators=(",", ":")))
    print(f"{args.agents} agents, one status write each every {args.interval:g} s "
          f"(target {target:.0f} writes/s), objects ~{size} bytes, "
          f"{args.procs} writer processes x {args.threads} threads, 1 watching scheduler, "
          f"{os.cpu_count()} CPUs")
    results: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="hvfleet-scale-") as tmp:
        if args.only in (None, "etcd"):
            cluster = EtcdCluster(Path(tmp) / "etcd", size=3)
            for m in cluster.members:  # etcd's defaults, not the tests' fast elections
                m.heartbeat_ms, m.election_ms = 100, 1000
            with cluster:
                url = cluster.url(prefix="/bench")
                print(f"\netcd 3.4, 3 members on 127.0.0.1 ({url})")
                took = seed(url, args.agents, args.procs)
                print(f"  seeded {args.agents} objects in {took:.1f} s ({args.agents / took:.0f} creates/s)")
                pids = [m.process.pid for m in cluster.members if m.process is not None]
                etcd0, gen0 = sum(cpu_seconds(p) for p in pids), children_cpu()
                paced = run_phase(url, args.agents, args.procs, args.threads, args.duration, args.interval)
                etcd1, gen1 = sum(cpu_seconds(p) for p in pids), children_cpu()
                sat = run_phase(url, args.agents, args.procs, args.threads, args.saturate, None)
                etcd2, gen2 = sum(cpu_seconds(p) for p in pids), children_cpu()
                results["etcd"] = (paced, sat)
                report("etcd", paced, sat, target)
                # Per second of the phase's load (start-up and drain add little CPU).
                for phase, e, g, w in (("paced", etcd1 - etcd0, gen1 - gen0, args.duration),
                                       ("saturation", etcd2 - etcd1, gen2 - gen1, args.saturate)):
                    print(f"  CPU in the {phase} phase: 3 etcd members {e / w:.2f} cores, "
                          f"hvfleet writers+scheduler {g / w:.2f} cores (of {os.cpu_count()})")
                kps, kp99 = keepalive_rate(url, args.agents, args.saturate, args.threads)
                print(f"  Lease renewal (CAS update of the Lease object): {kps:.0f}/s at saturation, "
                      f"p99 {kp99:.1f} ms")
                for m in cluster.members:
                    assert m.process is not None
                    now, peak = rss_kib(m.process.pid)
                    st = m.status()
                    print(f"  {m.name}: RSS {now / 1024:.0f} MiB (peak {peak / 1024:.0f} MiB), "
                          f"data dir {mib(du_bytes(m.data_dir))}, db {mib(int(str(st['dbSize'])))}"
                          f"{' (leader)' if cluster.leader() is m else ''}")
        if args.only in (None, "sqlite"):
            path = Path(tmp) / "sqlite" / "hvfleet.db"
            path.parent.mkdir()
            url = f"sqlite:///{path}"
            print(f"\nSQLite (WAL) at {path}")
            took = seed(url, args.agents, args.procs)
            print(f"  seeded {args.agents} objects in {took:.1f} s ({args.agents / took:.0f} creates/s)")
            gen0 = children_cpu()
            paced = run_phase(url, args.agents, args.procs, args.threads, args.duration, args.interval)
            gen1 = children_cpu()
            sat = run_phase(url, args.agents, args.procs, args.threads, args.saturate, None)
            gen2 = children_cpu()
            results["sqlite"] = (paced, sat)
            report("sqlite", paced, sat, target)
            phases = (("paced", gen1 - gen0, args.duration), ("saturation", gen2 - gen1, args.saturate))
            for phase, g, w in phases:
                print(f"  CPU in the {phase} phase: hvfleet writers+scheduler (SQLite in-process) "
                      f"{g / w:.2f} cores (of {os.cpu_count()})")
            files = {p.name: p.stat().st_size for p in path.parent.iterdir()}
            print("  files: " + ", ".join(f"{n} {mib(s)}" for n, s in sorted(files.items())))
    if len(results) == 2:
        e, s = results["etcd"], results["sqlite"]
        print("\nratios etcd/SQLite: saturation writes/s "
              f"{e[1]['writes_per_s'] / max(s[1]['writes_per_s'], 1e-9):.2f}, "
              f"paced latency p99 {e[0]['lat_p99_ms'] / max(s[0]['lat_p99_ms'], 1e-9):.2f}, "
              f"paced watch lag p99 {e[0]['lag_p99_ms'] / max(s[0]['lag_p99_ms'], 1e-9):.2f}")


if __name__ == "__main__":
    main()
