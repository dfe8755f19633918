"""What the dashboard's history in the store costs a replica, next to the
status writes it follows, in the same run:

    .venv/bin/python bench/history.py [--hosts 2000] [--changed 50] [--ticks 5] [--replicas 2]

A SQLite store with HOSTS hypervisors (labels az and role), one live picture
(live.FleetState) and one history keeper per replica over it. Each tick
CHANGED hosts get a new allocation (the peer: those agents' status writes,
timed), every replica follows the watch, and then samples the 10 s tier
(`history.sample_due`, timed per replica): how long a tick takes, how many
points it writes (the fleet, the label values, the changed hosts, each once
however many replicas sample), and a quiet tick (nothing changed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hvfleet.model import Hypervisor
from hvfleet.server.dashboard.history import HistoryKeeper, HistorySettings, group_figures, sample_due
from hvfleet.server.dashboard.live import FleetState
from hvfleet.store import open_store
from hvfleet.store.base import Store, Write
from hvfleet.store.ownership import agent_manager


def _host(i: int, used: int) -> Hypervisor:
    return Hypervisor.model_validate({
        "metadata": {"name": f"hv{i:05d}", "labels": {"az": f"az{i % 3}", "role": ("compute", "gpu")[i % 2]}},
        "status": {"capacity": {"cpu": 64, "memory": "256Gi"}, "allocation": {"cpu": used, "memory": "8Gi"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })


def _follow(state: FleetState, store: Store) -> None:
    state.apply(list(store.watch(since=state.revision, timeout=0.2)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=2000)
    ap.add_argument("--changed", type=int, default=50)
    ap.add_argument("--ticks", type=int, default=5)
    ap.add_argument("--replicas", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        with open_store(url) as setup:
            for start in range(0, args.hosts, 500):
                batch = [Write("create", _host(i, 1)) for i in range(start, min(start + 500, args.hosts))]
                setup.write_all(batch, "bench-setup")
        settings = HistorySettings.parse()
        replicas = []
        for _ in range(args.replicas):
            store = open_store(url)
            state = FleetState(store)
            state.load()
            state.take_touched()
            keeper = HistoryKeeper(store, settings)
            keeper.prime(group_figures(state))
            replicas.append((store, state, keeper))
        agent = open_store(url)
        writes_s: list[float] = []
        sample_s: list[list[float]] = [[] for _ in replicas]
        points: list[int] = []
        now = 1_000_000.0
        for tick in range(args.ticks):
            t0 = time.perf_counter()
            for k in range(args.changed):
                i = (tick * args.changed + k) % args.hosts
                h = agent.get_hypervisor(f"hv{i:05d}")
                status = _host(i, 2 + tick).status
                agent.update(h.model_copy(update={"status": status}), agent_manager(h.name))
            writes_s.append(time.perf_counter() - t0)
            for store, state, _ in replicas:
                _follow(state, store)
            now += 10
            written = 0
            for n, (_, state, keeper) in enumerate(replicas):
                t0 = time.perf_counter()
                written += sample_due(keeper, state, now + n)
                sample_s[n].append(time.perf_counter() - t0)
            points.append(written)
        now += 10
        quiet = []
        for n, (_, state, keeper) in enumerate(replicas):
            t0 = time.perf_counter()
            assert sample_due(keeper, state, now + n) == 0
            quiet.append(time.perf_counter() - t0)
        print(f"{args.hosts} hosts, {args.changed} changed per tick, {args.ticks} ticks, "
              f"{args.replicas} replicas")
        per_tick = statistics.median(writes_s)
        print(f"  peer: {args.changed} status writes          {per_tick * 1000:8.1f} ms a tick "
              f"({per_tick / args.changed * 1000:.2f} ms each)")
        for n, xs in enumerate(sample_s):
            print(f"  replica {n + 1}: history sample          {statistics.median(xs) * 1000:8.1f} ms a tick "
                  f"({statistics.median(xs) / statistics.median(writes_s):.2f}x the writes)")
        groups = len(group_figures(replicas[0][1])) - 1
        print(f"  points written a tick, all replicas: {statistics.median(points):.0f} "
              f"(fleet + {groups} label values + {args.changed} hosts, once each)")
        print(f"  a quiet tick (nothing changed):      {statistics.median(quiet) * 1000:8.1f} ms, 0 points")
        for store, _, _ in replicas:
            store.close()
        agent.close()


if __name__ == "__main__":
    main()
