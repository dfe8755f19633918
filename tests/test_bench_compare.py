"""bench/compare.py reads the figures the bench scripts print (the lines below
are theirs, a few cut short) and calls a figure worse only when every round agrees."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.compare import Series, parse_api, parse_guests, parse_replicas, parse_scheduling, verdict

SCHEDULING = """fit latency, fleet index (in process), random cpu/memory requests
   hosts     build   p99 all, gc     p50 all     p99 all   p50 top10   p99 top10  placement p50   ratio p50
    1000      3.1s      19.64 ms     0.22 ms    18.55 ms     0.23 ms    21.82 ms
   10000     20.4s      39.69 ms     6.47 ms    99.00 ms     0.68 ms    93.81 ms
claims, 8 processes on sqlite, 200 hosts: 800 attempts in 10.00 s = 1,877 claims/s (737 taken…
"""

GUESTS = """hvfleet generate(), in-process, warm:    1.989 ms  (     503 guests/s, 50 guests, 3-host group)
virt-install --print-xml --dry-run, per process:   1943.6 ms  (4 runs)
hvfleet guest generate (console script, hvfleet worker running):    127.5 ms per process, …
    10  same-hw        0.56        1.25     2.2x            50            50 True
  1000    store        1.14       24.40    21.4x            28            28 True
"""

API = """[sqlite] 200 agents (own tokens), 600 CAS status writes over 16 keep-alive HTTPS connections
  status writes through the API: 218/s, p50 65.1 ms, p99 172.1 ms
  hvfleet get hypervisors --store https://… (remote): median 418 ms, 4.25× kubectl
  kubectl get hypervisors: median 98 ms
"""

REPLICAS = """server CPU per write, 1000 writes by 40 agents, 4 clients, 3-member etcd; every replica…
                               lease renewal    status write  followed event   writes/s (status)
direct store (this process)          0.34 ms         0.47 ms               -                   -
1 replica(s), sum of all             1.10 ms         1.50 ms               -                 330
2 replica(s), sum of all             1.30 ms         1.80 ms         0.67 ms                 282
2 replicas, lease renewal alternating replicas, sum of all: 1.50 ms
2 replicas, lease renewal in a fleet of 5000 through any replica, sum of all: 1.57 ms
2 replicas, followed event, writes made in the store at 1000/s (reached 941/s), each replica (median): 0.28 ms
"""


def test_scheduling_figures() -> None:
    figs = parse_scheduling(SCHEDULING)
    assert figs["fit p50, full list, 10,000 hosts"].value == 6.47
    assert figs["fit p99, best 10, 1,000 hosts"].value == 21.82
    assert figs["fit index build, 10,000 hosts"].value == pytest.approx(20400)
    claims = figs["claims/s, 8 processes, sqlite, 200 host(s)"]
    assert claims.value == 1877 and not claims.lower_is_better


def test_guests_figures_and_controls() -> None:
    figs = parse_guests(GUESTS)
    assert figs["generate(), in process, per guest"].value == 1.989
    assert figs["guest generate, worker running"].value == 127.5
    assert figs["control: virt-install --print-xml"].control
    assert figs["CPU baseline, 1,000 hosts, store"].value == 1.14
    assert figs["control: libvirt baselineCPU, 10 hosts, same-hw"].value == 1.25
    assert "control: libvirt baselineCPU, 1,000 hosts, store" not in figs  # it repeats same-hw's


def test_replicas_figures_with_renewals_pinned_alternating_and_in_a_large_fleet() -> None:
    figs = parse_replicas(REPLICAS)
    assert figs["etcd: 1 replica(s), server CPU per lease renewal"].value == 1.10
    assert "etcd: 1 replicas, CPU per followed event" not in figs
    assert figs["etcd: 2 replicas, CPU per followed event"].value == 0.67
    assert figs["etcd: 2 replicas, server CPU per lease renewal, alternating replicas"].value == 1.50
    assert figs["etcd: 2 replicas, server CPU per lease renewal, fleet of 5000"].value == 1.57
    assert figs["etcd: 2 replicas, CPU per followed event at 1000 writes/s"].value == 0.28
    assert not figs["etcd: 2 replica(s), status writes/s"].lower_is_better


def test_api_figures_per_store() -> None:
    figs = parse_api(API)
    assert figs["sqlite: status writes through the API"].value == 218
    assert figs["sqlite: status write p99"].value == 172.1
    assert figs["sqlite: hvfleet get hypervisors (remote)"].value == 418
    assert figs["sqlite: control: kubectl get hypervisors"].control


@pytest.mark.parametrize(("base", "head", "lower", "want"), [
    ([100, 100, 100], [120, 115, 130], True, "WORSE"),
    ([100, 100, 100], [120, 95, 130], True, "noisy"),  # one round says better
    ([100, 100, 100], [105, 95, 108], True, "same"),
    ([100, 100, 100], [80, 85, 70], True, "better"),
    ([100, 100, 100], [80, 85, 70], False, "WORSE"),  # fewer claims/s
])
def test_verdict_needs_every_round(base: list[float], head: list[float], lower: bool, want: str) -> None:
    assert verdict(Series("ms", lower, False, base, head)) == want
