"""The Placement provider snapshot over hypervisors (not stored providers,
which bench/placement_api.py seeds): in this process, over a SQLite store of
N hypervisors, half of them with a live agent Lease, the CPU of loading the
snapshot and answering the first `GET /allocation_candidates` (graph, index,
body), then p50 wall and CPU of one answer warm (refresh + graph + the kept
body) and right after a claim (a Reservation written, then refresh + graph +
body). These are the paths that judge hosts' readiness and reservations by
the clock (hvfleet.placement.snapshot). The fleet is seeded once per size
(`--seed`) into a file that each measured run copies, so two checkouts can
be measured interleaved over the same fleet, each with its own venv:

    .venv/bin/python bench/placement_hypervisors.py --seed --sizes 1000,10000
    .venv/bin/python bench/placement_hypervisors.py --sizes 1000,10000
    /other/checkout/.venv/bin/python bench/placement_hypervisors.py --sizes 1000,10000

Prints one JSON line per size (times in ms).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hvfleet.model.hypervisor import Hypervisor, HypervisorStatus, Reservation
from hvfleet.placement import candidates
from hvfleet.placement.snapshot import ProviderSnapshot
from hvfleet.store import open_store
from hvfleet.store.ownership import agent_manager

QUERY = {"resources": ["VCPU:1,MEMORY_MB:1024"], "limit": ["1000"],
         "root_required": ["!COMPUTE_STATUS_DISABLED"]}


def seed(path: Path, n: int) -> None:
    store = open_store(f"sqlite:///{path}")
    beat = datetime.now(UTC) + timedelta(hours=2)  # fresh for every later run
    for i in range(n):
        name = f"hv-{i:05d}"
        h = Hypervisor.model_validate({
            "metadata": {"name": name}, "spec": {"overcommit": {"cpu": 4.0}},
            "status": {"capacity": {"cpu": 64, "memory": "256Gi"}, "allocation": {"cpu": i % 60},
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "lastHeartbeatTime": beat.isoformat()}})
        created = store.create(h.model_copy(update={"status": HypervisorStatus()}), "bench")
        store.update(created.model_copy(update={"status": h.status}), agent_manager(name))
        if i % 2:
            store.keepalive(name, 3600)
    store.close()


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(path: Path, queries: int) -> dict[str, float]:
    store = open_store(f"sqlite:///{path}")
    c0 = cpu()
    snap = ProviderSnapshot.from_store(store)
    classes, traits = snap.known_names()
    candidates.candidates_json(snap.graph(), QUERY, (1, 39), resource_classes=classes, traits=traits)
    out = {"first_cpu": (cpu() - c0) * 1000}

    def answer() -> tuple[float, float]:
        c, t = cpu(), time.perf_counter()
        snap.refresh(store)
        candidates.candidates_json(snap.graph(), QUERY, (1, 39), resource_classes=classes, traits=traits)
        return (time.perf_counter() - t) * 1000, (cpu() - c) * 1000

    warm = [answer() for _ in range(queries)]
    claimed = []
    for k in range(queries):
        store.create(Reservation.model_validate({"metadata": {"name": f"r-{uuid.uuid4().hex[:10]}"}, "spec": {
            "hypervisor": f"hv-{(k * 7) % 100:05d}", "resources": {"cpu": 1},
            "consumer": str(uuid.uuid4())}}), "bench")
        claimed.append(answer())
    store.close()
    for name, rows in (("warm", warm), ("claim", claimed)):
        out[f"{name}_p50"] = statistics.median(w for w, _ in rows)
        out[f"{name}_cpu_p50"] = statistics.median(c for _, c in rows)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--queries", type=int, default=15)
    ap.add_argument("--seed", action="store_true", help="write the fleets (once)")
    ap.add_argument("--dir", default="/tmp/bench-placement-hypervisors")
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    for n in (int(s) for s in args.sizes.split(",")):
        fleet = d / f"fleet-{n}.db"
        if args.seed:
            seed(fleet, n)
            continue
        work = d / f"run-{n}-{uuid.uuid4().hex[:8]}.db"
        shutil.copy(fleet, work)
        try:
            result: dict[str, Any] = {"size": n, **measure(work, args.queries)}
        finally:
            work.unlink()
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
