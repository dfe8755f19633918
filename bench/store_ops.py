"""Store throughput on SQLite: create, update (CAS), get and list with 10k objects.

Objects carry a realistic status (capacity, allocation, 2 NUMA cells, 20
instances), so the figures reflect what an agent writes. Prints medians of
per-operation latency and ops/s.

    .venv/bin/python bench/store_ops.py [--objects 10000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from typing import Any

from hvfleet.model import Hypervisor, Quantity
from hvfleet.store import open_store


def realistic(name: str) -> Hypervisor:
    instances = [
        {"uuid": f"{name}-{i:04d}-0000-0000-000000000000", "name": f"vm-{i}", "state": "running",
         "resources": {"cpu": 2, "memory": "4Gi"}}
        for i in range(20)
    ]
    status: dict[str, Any] = {
        "capacity": {"cpu": 64, "memory": "512Gi", "hugepages-2Mi": "16Gi"},
        "allocation": {"cpu": 40, "memory": "80Gi"},
        "cells": [{"id": c, "capacity": {"cpu": 32, "memory": "256Gi"},
                   "allocation": {"cpu": 20, "memory": "40Gi"}} for c in range(2)],
        "instances": instances,
    }
    return Hypervisor.model_validate({
        "metadata": {"name": name, "labels": {"az": f"az-{hash(name) % 3}", "rack": name[-2:]}},
        "status": status,
    })


def timed(fn: Any, n: int) -> tuple[float, float]:
    """(ops/s over the whole run, median latency in ms)."""
    lat = []
    start = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        lat.append(time.perf_counter() - t)
    total = time.perf_counter() - start
    return n / total, statistics.median(lat) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--objects", type=int, default=10_000)
    args = ap.parse_args()
    n = args.objects
    with tempfile.TemporaryDirectory() as d:
        store = open_store(f"sqlite:///{d}/bench.db")
        objs = [realistic(f"hv-{i:06d}") for i in range(n)]
        size = len(objs[0].model_dump_json(by_alias=True))
        print(f"SQLite store, {n} Hypervisor objects of ~{size} bytes each")
        rate, med = timed(lambda i: store.create(objs[i], f"agent/{objs[i].name}"), n)
        print(f"  create            {rate:8.0f} ops/s   median {med:6.2f} ms")

        def update(i: int) -> None:
            h = store.get_hypervisor(objs[i].name)
            status = h.status.model_copy(update={"allocation": {"cpu": Quantity(i % 64)}})
            store.update(h.model_copy(update={"status": status}), f"agent/{h.name}")

        rate, med = timed(update, n)
        print(f"  get+update (CAS)  {rate:8.0f} ops/s   median {med:6.2f} ms")
        rng = random.Random(1)
        rate, med = timed(lambda i: store.get("Hypervisor", objs[rng.randrange(n)].name), n)
        print(f"  get               {rate:8.0f} ops/s   median {med:6.2f} ms")
        runs = 5
        lat = []
        for _ in range(runs):
            t = time.perf_counter()
            items = store.list("Hypervisor").items
            lat.append(time.perf_counter() - t)
        assert len(items) == n
        print(f"  list all          {statistics.median(lat) * 1000:8.0f} ms median of {runs} "
              f"({n / statistics.median(lat):.0f} objects/s)")
        lat = []
        for _ in range(runs):
            t = time.perf_counter()
            sel = store.list("Hypervisor", "az=az-1").items
            lat.append(time.perf_counter() - t)
        print(f"  list -l az=az-1   {statistics.median(lat) * 1000:8.0f} ms median ({len(sel)} matched)")
        store.close()


if __name__ == "__main__":
    main()
