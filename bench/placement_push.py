"""Placement push: how long `placement sync` takes to bring a real Placement's
inventories (and claims) to what hvfleet computes, beside a plain loop of the
same HTTP calls measured in the same run.

For N hosts in a SQLite store (and N empty root providers in a real
openstack-placement on SQLite in tmpfs, over HTTP on 127.0.0.1):
- first sync: every provider gets its inventories (GET + PUT each);
- fleet-wide `overcommit set -l` on a third of the hosts (one atomic
  Store.write_all), then a sync that rewrites only those providers;
- an idempotent sync (reads only);
- the peer: the same GET + PUT per provider written as a bare loop of HTTP
  calls, with no store read and no planning;
- claims: C hvfleet claims pushed as allocations with `--push-claims`, then an
  idempotent second push.

    .venv/bin/python bench/placement_push.py [--hosts 200,1000] [--claims 200]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "scheduling"))

from real_placement import RealPlacement

from hvfleet.model import Hypervisor, ResourceName
from hvfleet.model.spec_edits import SpecEdit
from hvfleet.scheduling.claims import reserve
from hvfleet.scheduling.fleet_edit import edit_hosts
from hvfleet.scheduling.placement import export_inventories, provider_uuid, sync
from hvfleet.scheduling.request import parse_request
from hvfleet.store import Store, open_store
from hvfleet.store.ownership import agent_manager


def load_store(store: Store, n: int) -> list[Hypervisor]:
    now = datetime.now(UTC).isoformat()
    out = []
    for i in range(n):
        h = Hypervisor.model_validate(
            {"metadata": {"name": f"hv-{i:05d}", "labels": {"role": ["compute", "gpu", "edge"][i % 3]}},
             "spec": {"reserved": {"cpu": 2}}}
        )
        created = store.create(h, "operator")
        status = {
            "capacity": {"cpu": 64, "memory": "256Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
            "lastHeartbeatTime": now,
        }
        observed = created.model_copy(update={"status": type(created.status).model_validate(status)})
        out.append(store.update(observed, agent_manager(h.name)))  # type: ignore[arg-type]
    return out


def timed(fn: object) -> float:
    t = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t


def run(n: int, claims: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, RealPlacement() as p:
        store = open_store(f"sqlite:///{tmp}/hv.db")
        hosts = load_store(store, n)
        c = p.client()
        for h in hosts:
            c.request("POST", "/resource_providers", {"name": h.name, "uuid": provider_uuid(h)})

        first = timed(lambda: sync(store, c))
        t = time.perf_counter()
        four = SpecEdit("overcommit", {ResourceName("cpu"): 4.0})
        edit_hosts(store, four, "bench", selector="role=compute")
        edit = time.perf_counter() - t
        report = None

        def changed() -> None:
            nonlocal report
            report = sync(store, c)

        after_edit = timed(changed)
        assert report is not None and report.inventories is not None
        pushed = len(report.inventories["updated"])
        idle = timed(lambda: sync(store, c))

        # The peer: the same GET + PUT per provider as a bare loop (no store, no plan).
        wanted = {provider_uuid(h): export_inventories(h) for h in hosts}

        def bare() -> None:
            for rp, inv in wanted.items():
                gen, _ = c.inventories(rp)
                c.put_inventories(rp, gen, inv)

        peer = timed(bare)

        for i in range(claims):
            reserve(store, hosts[i % n].name, parse_request("1", "1Gi"), str(uuid.uuid4()), None)
        push1 = timed(lambda: sync(store, c, push_claims=True))
        push2 = timed(lambda: sync(store, c, push_claims=True))
        store.close()
        c.close()

    print(f"{n:>6} hosts  first sync {first:6.2f} s ({first / n * 1000:.1f} ms/provider)   "
          f"bare GET+PUT loop {peer:6.2f} s ({peer / n * 1000:.1f} ms/provider)   ratio {first / peer:.2f}")
    print(f"{'':>13}overcommit set -l role=compute ({n // 3 + (n % 3 > 0)} hosts, one batch) "
          f"{edit * 1000:.0f} ms; "
          f"sync after it {after_edit:.2f} s ({pushed} providers written); idempotent sync {idle:.2f} s")
    print(f"{'':>13}--push-claims: {claims} claims created {push1:.2f} s, idempotent {push2:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", default="200,1000")
    ap.add_argument("--claims", type=int, default=200)
    args = ap.parse_args()
    for n in [int(x) for x in args.hosts.split(",") if x]:
        run(n, min(args.claims, n * 4))


if __name__ == "__main__":
    main()
