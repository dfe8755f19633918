"""What following a write costs one `hvfleet serve` replica, by write rate and
`--follow-pace`, and how late its watchers see the writes.

A 1-member etcd (Debian's etcd on a loopback port), one replica (a `python -m
hvfleet.server` process: HTTPS, the dashboard's follower, the collector, the
token watch) with one API watcher of every Hypervisor (a viewer token), and
this process writing statuses of `--hosts` hosts straight into the store at
`--rate` writes a second from four threads, as the other replicas' writes
reach a replica. Per combination: the replica's process CPU per followed
write (utime + stime from /proc), split into its event loop's thread and
the others (the etcd feed's), and the watcher's delay from the write's
answer to its event's line, p50 / p99. The peer in the same run is the same
replica with `--follow-pace 0` (every write read as it comes).

    .venv/bin/python bench/follow.py [--rates 300,1000] [--paces 0,0.01,0.02]
                                     [--writes 3000] [--hosts 40] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from api import Server, host, pct, seed, status_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.etcd_local import EtcdCluster

from hvfleet.model.hypervisor import Hypervisor
from hvfleet.store import open_store
from hvfleet.store.ownership import agent_manager

HV = "/apis/hvfleet.io/v1/hypervisors"
TICK = os.sysconf("SC_CLK_TCK")
WRITERS = 4  # threads writing (each write waits for etcd's answer)


def thread_cpu(pid: int) -> tuple[float, float]:
    """Seconds of CPU of process `pid`: its main thread (the event loop), the others."""
    main = other = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a thread that ended
        used = (int(fields[11]) + int(fields[12])) / TICK
        if task.name == str(pid):
            main += used
        else:
            other += used
    return main, other


def one_run(url: str, tmp: Path, viewer: str, hosts: int, writes: int, rate: float,
            pace: float) -> dict[str, float]:
    server = Server(url, tmp, options={"follow_pace": pace})
    received: dict[int, float] = {}
    stop = threading.Event()

    def watch() -> None:
        conn = server.connection(timeout=600)
        conn.request("GET", f"{HV}?watch=true&timeoutSeconds=600",
                     headers={"Authorization": f"Bearer {viewer}"})
        answer = conn.getresponse()
        while not stop.is_set() and (line := answer.readline()):
            received[int(json.loads(line)["object"]["metadata"]["resourceVersion"])] = time.perf_counter()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    stores = [open_store(url) for _ in range(WRITERS)]
    try:
        time.sleep(2.0)  # the watch open, start-up work done
        last: dict[int, Hypervisor] = {a: stores[0].get_hypervisor(host(a)) for a in range(hosts)}
        sent: dict[int, float] = {}
        cpu_before = thread_cpu(server.proc.pid)
        began = time.perf_counter()

        def writer(k: int) -> None:
            # Write i is thread i % WRITERS's, of host i % hosts: with hosts a
            # multiple of WRITERS, no host is written by two threads.
            for i in range(k, writes, WRITERS):
                due = began + i / rate
                if (wait := due - time.perf_counter()) > 0:
                    time.sleep(wait)
                a = i % hosts
                current = last[a]
                new = current.model_copy(update={"status": current.status.model_validate(status_of(i))})
                last[a] = stores[k].update(new, agent_manager(host(a)))
                sent[int(last[a].metadata.resource_version or 0)] = time.perf_counter()

        threads = [threading.Thread(target=writer, args=(k,)) for k in range(WRITERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        reached = writes / (time.perf_counter() - began)
        deadline = time.monotonic() + 30
        while len(received.keys() & sent.keys()) < len(sent) and time.monotonic() < deadline:
            time.sleep(0.05)
        cpu_after = thread_cpu(server.proc.pid)
    finally:
        stop.set()
        server.stop()
        for s in stores:
            s.close()
    delays = [received[r] - sent[r] for r in sent if r in received]
    return {"loop": (cpu_after[0] - cpu_before[0]) / writes, "other": (cpu_after[1] - cpu_before[1]) / writes,
            "reached": reached, "p50": pct(delays, 50), "p99": pct(delays, 99),
            "missing": len(sent) - len(delays)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="300,1000", help="writes a second, comma-separated")
    parser.add_argument("--paces", default="0,0.01,0.02", help="--follow-pace values, comma-separated")
    parser.add_argument("--writes", type=int, default=3000)
    parser.add_argument("--hosts", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=1, help="runs of every combination, interleaved")
    args = parser.parse_args()
    if args.hosts % WRITERS:
        parser.error(f"--hosts must be a multiple of {WRITERS}")
    rates = [float(x) for x in args.rates.split(",")]
    paces = [float(x) for x in args.paces.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-follow-"))
    results: dict[tuple[float, float], list[dict[str, float]]] = {}
    with EtcdCluster(tmp / "etcd", size=1) as etcd:
        url = etcd.url(prefix=f"/follow-{uuid.uuid4().hex[:8]}")
        with open_store(url) as store:
            _, viewers, _ = seed(store, args.hosts, 1)
        for r in range(args.rounds):
            for rate in rates:
                for pace in paces:
                    got = one_run(url, tmp / f"r{r}-{rate}-{pace}", viewers[0], args.hosts, args.writes,
                                  rate, pace)
                    results.setdefault((rate, pace), []).append(got)
    print(f"\none replica following {args.writes} status writes made in a 1-member etcd "
          f"({args.hosts} hosts), one API watcher; median of {args.rounds} round(s)")
    print(f"{'writes/s (reached)':>20}{'--follow-pace':>15}{'CPU per write':>15}{'loop + others':>18}"
          f"{'watch p50':>11}{'p99':>9}{'vs pace 0':>11}")
    for (rate, pace), runs in results.items():
        loop, other = (statistics.median(x[k] for x in runs) for k in ("loop", "other"))
        reached, p50, p99 = (statistics.median(x[k] for x in runs) for k in ("reached", "p50", "p99"))
        peer = results.get((rate, 0.0))
        ratio = "" if peer is None else \
            f"{(loop + other) / statistics.median(x['loop'] + x['other'] for x in peer):.2f}x"
        missing = sum(x["missing"] for x in runs)
        split = f"{loop * 1e3:.3f} + {other * 1e3:.3f}"
        print(f"{f'{rate:.0f} ({reached:.0f})':>20}{pace:>15g}{(loop + other) * 1e3:>12.3f} ms{split:>18}"
              f"{p50 * 1e3:>8.1f} ms{p99 * 1e3:>6.1f} ms{ratio:>11}"
              + (f"  ({missing:.0f} events missing)" if missing else ""))

if __name__ == "__main__":
    main()
