"""GET /allocation_candidates: hvfleet's candidates module beside real
OpenStack Placement 16.0, on the same fleets, in the same run.

For N flat compute-node providers (VCPU, MEMORY_MB, DISK_GB with random
totals, reserves, ratios and usages; a tenth with a trait, a third in one of
eight aggregates):
- hvfleet: `parse_candidates_query` + `find_candidates` + `render_candidates`
  + json.dumps over a `ProviderGraph` (query string in, body out), warm index;
  and the index build itself (first query on a new graph);
- Placement: its WSGI application in this process (no sockets) on SQLite in
  tmpfs, `GET /allocation_candidates` at microversion 1.39. Its rows are
  written straight into its database tables (10k providers through its API
  would take minutes); the differential test shows both answer alike.
Queries: a simple one (every provider fits: the whole answer is rendered), the
same with limit=50, with a required trait, and with member_of.

    .venv/bin/python bench/placement_candidates.py [--sizes 1000,10000]
        [--queries 30] [--placement-queries 5]
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
import sys
import time
import urllib.parse
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.placement import inprocess_placement as real

from hvfleet.placement.candidates import find_candidates, parse_candidates_query, render_candidates
from hvfleet.placement.graph import Inventory, Provider, ProviderGraph

CLASS_IDS = {"VCPU": 0, "MEMORY_MB": 1, "DISK_GB": 2}
TRAIT = "HW_CPU_X86_AVX2"
AGGS = [str(uuid.UUID(int=0xA66 << 64 | i)) for i in range(8)]
QUERIES = {
    "simple": "resources=VCPU:2,MEMORY_MB:4096",
    "limit 50": "resources=VCPU:2,MEMORY_MB:4096&limit=50",
    "trait": f"resources=VCPU:2,MEMORY_MB:4096&required={TRAIT}",
    "member_of": f"resources=VCPU:2,MEMORY_MB:4096,DISK_GB:10&member_of=in:{AGGS[0]},{AGGS[1]}",
}


def fleet(n: int, seed: int = 7) -> list[Provider]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        u = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        vcpu, mem = rng.choice([32, 64, 128]), rng.choice([131072, 262144, 524288])
        disk = rng.randint(500, 4000)
        out.append(
            Provider(
                uuid=u,
                name=f"cn{i:05d}",
                generation=1,
                parent_uuid=None,
                root_uuid=u,
                inventories={
                    "VCPU": Inventory(
                        total=vcpu, allocation_ratio=rng.choice([1.0, 4.0, 16.0]), max_unit=vcpu
                    ),
                    "MEMORY_MB": Inventory(total=mem, reserved=512, allocation_ratio=1.5, max_unit=mem),
                    "DISK_GB": Inventory(total=disk, allocation_ratio=1.0, max_unit=disk),
                },
                usages={"VCPU": rng.randint(0, vcpu), "MEMORY_MB": rng.randint(0, mem // 2)},
                traits=frozenset({TRAIT}) if rng.random() < 0.1 else frozenset(),
                aggregates=frozenset({rng.choice(AGGS)}) if rng.random() < 0.33 else frozenset(),
            )
        )
    return out


def load_placement(providers: list[Provider]) -> None:
    """Write the fleet into real Placement's tables (emptied first)."""
    real.app()
    db = sqlite3.connect(Path(real.workdir()) / "placement.db")
    with db:
        for table in ("allocations", "inventories", "resource_provider_traits",
                      "resource_provider_aggregates", "placement_aggregates", "resource_providers"):
            db.execute(f"DELETE FROM {table}")
        trait_id = db.execute("SELECT id FROM traits WHERE name = ?", (TRAIT,)).fetchone()[0]
        agg_id = {}
        for i, a in enumerate(AGGS, 1):
            db.execute("INSERT INTO placement_aggregates (id, uuid) VALUES (?, ?)", (i, a))
            agg_id[a] = i
        for rid, p in enumerate(providers, 1):
            db.execute(
                "INSERT INTO resource_providers (id, uuid, name, generation, root_provider_id) "
                "VALUES (?, ?, ?, 1, ?)",
                (rid, p.uuid, p.name, rid),
            )
            for rc, inv in p.inventories.items():
                db.execute(
                    "INSERT INTO inventories (resource_provider_id, resource_class_id, total, reserved, "
                    "min_unit, max_unit, step_size, allocation_ratio) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (rid, CLASS_IDS[rc], inv.total, inv.reserved, inv.min_unit, inv.max_unit,
                     inv.step_size, inv.allocation_ratio),
                )
            for rc, used in p.usages.items():
                if used:
                    db.execute(
                        "INSERT INTO allocations (resource_provider_id, consumer_id, "
                        "resource_class_id, used) VALUES (?, ?, ?, ?)",
                        (rid, str(uuid.uuid4()), CLASS_IDS[rc], used),
                    )
            if p.traits:
                db.execute(
                    "INSERT INTO resource_provider_traits (resource_provider_id, trait_id) VALUES (?, ?)",
                    (rid, trait_id),
                )
            for a in p.aggregates:
                db.execute(
                    "INSERT INTO resource_provider_aggregates (resource_provider_id, aggregate_id) "
                    "VALUES (?, ?)",
                    (rid, agg_id[a]),
                )
    db.close()


def ours(graph: ProviderGraph, qs: str) -> tuple[float, float, int]:
    """(find_candidates alone, query string to JSON body, answers)."""
    t = time.perf_counter()
    params: dict[str, list[str]] = {}
    for k, v in urllib.parse.parse_qsl(qs):
        params.setdefault(k, []).append(v)
    query = parse_candidates_query(params, (1, 39))
    t1 = time.perf_counter()
    answer = find_candidates(graph, query)
    t2 = time.perf_counter()
    json.dumps(render_candidates(answer, (1, 39)))
    t3 = time.perf_counter()
    return t2 - t1, t3 - t, len(answer.allocation_requests)


def theirs(qs: str) -> tuple[float, int]:
    t = time.perf_counter()
    status, body = real.call("GET", "/allocation_candidates?" + qs, microversion="1.39")
    took = time.perf_counter() - t
    assert status == 200, body
    return took, len(body["allocation_requests"])


def p(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--placement-queries", type=int, default=5)
    args = ap.parse_args()
    for n in (int(s) for s in args.sizes.split(",")):
        providers = fleet(n)
        load_placement(providers)
        graph = ProviderGraph({pr.uuid: pr for pr in providers})
        t = time.perf_counter()
        ours(graph, QUERIES["simple"])
        first = time.perf_counter() - t
        print(f"\n{n} providers: hvfleet first query (index build included) {first * 1000:.1f} ms")
        print(
            f"  {'query':<10} {'answers':>7} | {'find p50':>9} {'p99':>9} | {'to JSON p50':>11} {'p99':>9} | "
            f"{'placement p50':>13} | {'ratio find':>10} {'ratio JSON':>10}"
        )
        for name, qs in QUERIES.items():
            mine = [ours(graph, qs) for _ in range(args.queries)]
            them = [theirs(qs) for _ in range(args.placement_queries)]
            assert mine[0][2] == them[0][1], (name, mine[0][2], them[0][1])
            f50, f99 = statistics.median(x[0] for x in mine), p([x[0] for x in mine], 0.99)
            j50, j99 = statistics.median(x[1] for x in mine), p([x[1] for x in mine], 0.99)
            t50 = statistics.median(x for x, _ in them)
            print(
                f"  {name:<10} {mine[0][2]:>7} | {f50 * 1e3:>6.2f} ms {f99 * 1e3:>6.2f} ms | "
                f"{j50 * 1e3:>8.2f} ms {j99 * 1e3:>6.2f} ms | {t50 * 1e3:>10.1f} ms | "
                f"{t50 / f50:>9.0f}x {t50 / j50:>9.0f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
