"""The candidates index's capacity clause (Placement's `used + amount <=
(total - reserved) * ratio`, the units and the step), at `--size` flat
providers with VCPU, MEMORY_MB and DISK_GB: the index built whole, and the
clause for one amount of each class over every provider. With `--base
CHECKOUT`, that checkout's code is measured in the same run, in turns (each
side in its own process, `--rounds` times): a change to the index's columns
measured against the code before it.

    .venv/bin/python bench/candidates_clause.py [--size 10000] [--rounds 3] [--base CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def measure(size: int) -> dict[str, float]:
    """In this process: medians over 7 builds and 7 × 200 clause runs."""
    from hvfleet.placement import candidates
    from hvfleet.placement.graph import Inventory, Provider, ProviderGraph

    rng = random.Random(1)
    providers = {}
    for i in range(size):
        u = f"00000000-0000-0000-0000-{i:012d}"
        providers[u] = Provider(
            uuid=u, name=f"cn{i}", generation=0, parent_uuid=None, root_uuid=u,
            inventories={"VCPU": Inventory(total=rng.randint(8, 128), allocation_ratio=4.0),
                         "MEMORY_MB": Inventory(total=rng.randint(8192, 1 << 20), allocation_ratio=1.5),
                         "DISK_GB": Inventory(total=rng.randint(100, 4000))},
            usages={"VCPU": rng.randint(0, 64), "MEMORY_MB": rng.randint(0, 8192),
                    "DISK_GB": rng.randint(0, 100)},
            traits=frozenset(), aggregates=frozenset())
    builds, clauses = [], []
    for _ in range(7):
        start = time.perf_counter()
        ix = candidates._Index(ProviderGraph(dict(providers)))
        builds.append(time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(200):
            ix.with_capacity("VCPU", 4, None)
            ix.with_capacity("MEMORY_MB", 4096, None)
            ix.with_capacity("DISK_GB", 40, None)
        clauses.append((time.perf_counter() - start) / 200)
    return {"build_ms": statistics.median(builds) * 1e3, "clause_ms": statistics.median(clauses) * 1e3}


def run_side(src: Path, size: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, __file__, "--size", str(size), "--one"], env=env,
                         capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(out.stdout)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--base", help="a checkout of hvfleet to measure beside this one")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.size)))
        return
    sides = {"this": ROOT / "src"}
    if args.base:
        sides["base"] = Path(args.base).resolve() / "src"
    got: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, src in sides.items():
            got[name].append(run_side(src, args.size))
    print(f"candidates index, {args.size} providers, 3 classes; medians of {args.rounds} rounds")
    for name, runs in got.items():
        build = statistics.median(r["build_ms"] for r in runs)
        clause = statistics.median(r["clause_ms"] for r in runs)
        print(f"  {name:5}  build {build:7.2f} ms   clause for 3 classes {clause:6.3f} ms")


if __name__ == "__main__":
    main()
