"""One etcd shared by two fleets (each under its own `?prefix=`): what the
other fleet's writes cost a replica of this one, with the store URL's
`?follow=all` (the default: the feed reads every key of the etcd) and its peer
in the same run, `?follow=prefix` (the feed reads this fleet's keys only).

A 1-member etcd; fleet B (`--hosts` Hypervisors, one replica: a `python -m
hvfleet.server` process over HTTPS, asked with an operator's token) and fleet A, whose
statuses this process writes straight into the etcd at `--rate` writes a
second. Meanwhile one client sends `--gets` Placement GETs
(`/placement/resource_providers`) to B's replica, one at a time, each right
after one of A's writes: a GET first reads etcd's revision (A's write moved
it) and waits until the replica has followed that far. Per setting: the GETs'
latency p50 / p99, and the replica's process CPU per write of A's while it
only follows them (no GETs: `--follow-seconds`).

    .venv/bin/python bench/shared_etcd.py [--hosts 200] [--rate 200] [--gets 40]
                                          [--follow-seconds 10] [--rounds 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from api import Server, host, pct, process_cpu, seed, status_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.etcd_local import EtcdCluster

from hvfleet.model.hypervisor import Hypervisor
from hvfleet.store import open_store
from hvfleet.store.base import Store
from hvfleet.store.ownership import agent_manager


class Neighbour:
    """Fleet A: its hosts' statuses written in turn, one write per call."""

    def __init__(self, store: Store, hosts: int) -> None:
        self.store = store
        self.hosts = [store.create(Hypervisor.model_validate({"metadata": {"name": f"a-{host(i)}"}}),
                                   agent_manager(f"a-{host(i)}")) for i in range(hosts)]
        self.n = 0

    def write(self) -> None:
        i = self.n % len(self.hosts)
        current = self.hosts[i]
        new = current.model_copy(update={"status": current.status.model_validate(status_of(self.n))})
        self.hosts[i] = self.store.update(new, agent_manager(current.metadata.name))
        self.n += 1


def one_run(url: str, tmp: Path, token: str, neighbour: Neighbour, args: argparse.Namespace
            ) -> dict[str, float]:
    server = Server(url, tmp)
    try:
        conn = server.connection()
        headers = {"X-Auth-Token": token, "OpenStack-API-Version": "placement 1.39",
                   "Accept": "application/json"}

        def get() -> float:
            began = time.perf_counter()
            conn.request("GET", "/placement/resource_providers", headers=headers)
            answer = conn.getresponse()
            answer.read()
            assert answer.status == 200, answer.status
            return time.perf_counter() - began

        get()  # the Placement snapshot loaded and following
        took = []
        for _ in range(args.gets):
            neighbour.write()
            took.append(get())
            time.sleep(0.02)
        # Following only: A writes at --rate for --follow-seconds.
        writes = int(args.rate * args.follow_seconds)
        before = process_cpu(server.proc.pid)
        began = time.perf_counter()
        for i in range(writes):
            if (wait := began + i / args.rate - time.perf_counter()) > 0:
                time.sleep(wait)
            neighbour.write()
        time.sleep(0.5)
        per_write = (process_cpu(server.proc.pid) - before) / writes
        conn.close()
    finally:
        server.stop()
    return {"p50": pct(took, 50), "p99": pct(took, 99), "cpu": per_write}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=200)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--gets", type=int, default=40)
    ap.add_argument("--follow-seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-shared-etcd-"))
    got: dict[str, list[dict[str, float]]] = {"all": [], "prefix": []}
    with EtcdCluster(tmp / "etcd", size=1) as etcd:
        tag = uuid.uuid4().hex[:8]
        mine_url = etcd.url(prefix=f"/fleet-b-{tag}")
        with open_store(mine_url) as mine:
            _, _, operator = seed(mine, args.hosts, 0)
        with open_store(etcd.url(prefix=f"/fleet-a-{tag}")) as theirs:
            neighbour = Neighbour(theirs, args.hosts)
            for r in range(args.rounds):
                for follow in got:
                    got[follow].append(one_run(f"{mine_url}&follow={follow}", tmp / f"r{r}-{follow}",
                                               operator, neighbour, args))
    print(f"\nfleet B's replica, fleet A writing in the same etcd; {args.gets} Placement GETs each "
          f"right after a write of A's; CPU while A writes {args.rate:.0f}/s for {args.follow_seconds:g} s; "
          f"median of {args.rounds} round(s)")
    print(f"{'?follow=':<12}{'GET p50':>10}{'GET p99':>10}{'CPU per write of A':>22}")
    for follow, runs in got.items():
        p50, p99, c = (statistics.median(x[k] for x in runs) for k in ("p50", "p99", "cpu"))
        print(f"{follow + (' (peer)' if follow == 'prefix' else ''):<12}{p50 * 1e3:>7.1f} ms"
              f"{p99 * 1e3:>7.1f} ms{c * 1e3:>19.3f} ms")


if __name__ == "__main__":
    main()
