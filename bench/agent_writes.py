"""Store writes of an idle node agent per minute: status heartbeats vs the Lease.

Three real agents (hvfleet.agent.runner.Agent on a libvirt test-driver host:
one of examples/fleet, or a generated one with --domains), side by side in one
run, each with its own store, and nothing changing on their hosts:
- peer 1, "status heartbeat / resync" (how the agent kept liveness before
  Lease objects): no Lease, the whole status rewritten on every resync (60 s)
  for lastHeartbeatTime; a dead agent shows after 3 resyncs (180 s);
- peer 2, "status heartbeat / 10 s": the same at the Lease's renewal
  interval, i.e. the same 30 s detection as the Lease;
- "Lease": the Lease renewed every lease_ttl / 3 (10 s), an unchanged status
  only once per status_resync (5 min).
Printed per agent per minute: writes (store revisions) and bytes written (the
stored encoding of each written object), split by kind.

Periods are the agent's defaults (resync 60 s, lease_ttl 30 s, status_resync
5 min) divided by --speedup, and the window is --minutes of agent time, so
the default run (10 agent-minutes at speedup 10) takes about a minute; with
--speedup 1 it runs in real time.

    .venv/bin/python bench/agent_writes.py [--minutes 10] [--speedup 10]
        [--store sqlite|etcd] [--host compute-01 | --domains 100]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

# The repository root: tests.support holds the test and bench tooling (local etcd).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.etcd_local import EtcdCluster

from hvfleet.agent.runner import Agent, AgentConfig
from hvfleet.model import NotFound
from hvfleet.store import open_store
from hvfleet.store.encoding import encode

REPO = Path(__file__).resolve().parents[1]


def measure(url: str, config: AgentConfig, seconds: float, out: dict[str, tuple[Counter[str], Counter[str]]],
            label: str) -> None:
    store = open_store(url)
    agent = Agent(config, store)
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,), name=f"agent-{label}")
    runner.start()
    try:
        name = config.name or ""
        deadline = time.monotonic() + 60
        while True:  # settled: status written, and the Lease taken if there is one
            try:
                h = store.get_hypervisor(name)
                if h.status.capacity and (config.lease_ttl == 0 or store.agent_leases()):
                    break
            except NotFound:
                pass
            assert time.monotonic() < deadline, f"{label}: the agent never wrote its status"
            time.sleep(0.05)
        start = store.revision()
        time.sleep(seconds)
        end = store.revision()
    finally:
        stop.set()
        runner.join(10)
    writes: Counter[str] = Counter()
    size: Counter[str] = Counter()
    for event in store.watch(None, since=start, timeout=0.5):
        if event.revision > end:
            break
        writes[event.object.kind] += 1
        size[event.object.kind] += len(encode(event.object))
    store.close()
    out[label] = (writes, size)


def report(label: str, writes: Counter[str], size: Counter[str], minutes: float) -> None:
    total_w, total_b = sum(writes.values()), sum(size.values())
    kinds = ", ".join(
        f"{k} {writes[k] / minutes:.2f} writes ({size[k] / minutes / 1024:.1f} KiB)" for k in sorted(writes)
    ) or "none"
    print(f"  {label:34s} {total_w / minutes:6.2f} writes/min  {total_b / minutes / 1024:7.1f} KiB/min"
          f"   [{kinds}]")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10.0, help="agent-minutes measured")
    ap.add_argument("--speedup", type=float, default=10.0, help="agent periods divided by this")
    ap.add_argument("--store", choices=["sqlite", "etcd"], default="sqlite")
    ap.add_argument("--host", default="compute-01", help="a node file of examples/fleet")
    ap.add_argument("--domains", type=int, default=0, help="a generated host with this many domains")
    args = ap.parse_args()
    k = args.speedup
    seconds = args.minutes * 60 / k
    work = Path(tempfile.mkdtemp(prefix="hvfleet-bench-agent-writes-"))
    node = REPO / "examples" / "fleet" / f"{args.host}.xml"
    if args.domains:
        sys.path.insert(0, str(REPO / "bench"))
        from agent import node_file  # bench/agent.py's 500-domain host generator

        args.host = f"gen-{args.domains}"
        node = work / f"{args.host}.xml"
        node_file(node, args.domains)
    labels = ("before", "before-10s", "after")
    with ExitStack() as stack:
        if args.store == "etcd":
            cluster = stack.enter_context(EtcdCluster(work / "etcd", size=1))
            urls = {lbl: cluster.url(prefix=f"/{lbl}") for lbl in labels}
        else:
            urls = {lbl: f"sqlite:///{work / lbl}.db" for lbl in labels}
        base = dict(uri=f"test://{node}", name=args.host, resync=60 / k)
        configs = {
            # the peer: liveness through the status heartbeat on every resync
            "before": AgentConfig(**base, lease_ttl=0),  # type: ignore[arg-type]
            "before-10s": AgentConfig(**{**base, "resync": 10 / k}, lease_ttl=0),  # type: ignore[arg-type]
            "after": AgentConfig(**base, lease_ttl=max(1, round(30 / k)),  # type: ignore[arg-type]
                                 status_resync=300 / k),
        }
        out: dict[str, tuple[Counter[str], Counter[str]]] = {}
        threads = [
            threading.Thread(target=measure, args=(urls[lbl], configs[lbl], seconds, out, lbl))
            for lbl in configs
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    shutil.rmtree(work, ignore_errors=True)
    print(f"Idle agent on {args.host} ({args.store}), {args.minutes:g} agent-minutes "
          f"(periods / {k:g}: resync {60 / k:g} s, lease_ttl {max(1, round(30 / k))} s, "
          f"status_resync {300 / k:g} s), per agent per agent-minute:")
    report("peer 1: status heartbeat / 60 s", *out["before"], args.minutes)
    report("peer 2: status heartbeat / 10 s", *out["before-10s"], args.minutes)
    report("Lease / 10 s + status / 5 min", *out["after"], args.minutes)
    after = sum(out["after"][1].values())
    for peer in ("before", "before-10s"):
        print(f"  bytes written, Lease agent / {peer} peer: {after / sum(out[peer][1].values()):.2f}")


if __name__ == "__main__":
    main()
