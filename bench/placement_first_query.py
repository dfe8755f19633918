"""The first `GET /allocation_candidates` of a fresh `hvfleet serve` over a
seeded fleet: wall time and the server process's CPU (from /proc), for this
checkout and, with `--base CHECKOUT` (its own .venv), that checkout's server
over a copy of the same fleet, alternating, `--rounds` times. What a server
pays once before its candidates answers are warm (its fleet index and the
Placement snapshot built).

The fleet is a SQLite file seeded beforehand, e.g. by
bench/placement_hypervisors.py --seed (hypervisors, half with a live Lease):

    .venv/bin/python bench/placement_hypervisors.py --seed --sizes 10000 --dir /tmp/bench-hv
    .venv/bin/python bench/placement_first_query.py --fleet /tmp/bench-hv/fleet-10000.db \
        [--base CHECKOUT] [--rounds 3]
"""

from __future__ import annotations

import argparse
import http.client
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from api import Server, make_token, process_cpu

from hvfleet.store import open_store

QUERY = "/placement/allocation_candidates?resources=VCPU:1,MEMORY_MB:1024&limit=1000"


def first_query(fleet: Path, python: str) -> tuple[float, float]:
    """(wall ms, server CPU s) of the first candidates query of a new server."""
    with tempfile.TemporaryDirectory(prefix="first-query-") as d:
        work = Path(d)
        shutil.copy(fleet, work / "fleet.db")
        store = open_store(f"sqlite:///{work}/fleet.db")
        token = make_token(store, "admin", name="bench-admin")
        server = Server(store.url, work / "server", plain=True, python=python)
        try:
            c0, t0 = process_cpu(server.proc.pid), time.perf_counter()
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
            conn.request("GET", QUERY, headers={"X-Auth-Token": token,
                                                "OpenStack-API-Version": "placement 1.39"})
            answer = conn.getresponse()
            answer.read()
            assert answer.status == 200, answer.status
            return (time.perf_counter() - t0) * 1000, process_cpu(server.proc.pid) - c0
        finally:
            server.stop()
            store.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fleet", type=Path, required=True)
    ap.add_argument("--base", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sides = [("head", sys.executable)]
    if args.base is not None:
        sides.append(("base", str(args.base / ".venv" / "bin" / "python")))
    got: dict[str, list[float]] = {name: [] for name, _ in sides}
    for r in range(args.rounds):
        for name, python in sides if r % 2 == 0 else sides[::-1]:
            wall, cpu = first_query(args.fleet, python)
            got[name].append(cpu)
            print(f"round {r + 1} {name:4}  first query {wall:8.0f} ms  server CPU {cpu:6.2f} s", flush=True)
    for name, cpus in got.items():
        print(f"{name:4}  server CPU median {statistics.median(cpus):.2f} s  "
              f"range {min(cpus):.2f}-{max(cpus):.2f} s")
    if args.base is not None:
        ratios = [h / b for h, b in zip(got["head"], got["base"], strict=True)]
        print(f"head / base server CPU per round {min(ratios):.2f}-{max(ratios):.2f}")


if __name__ == "__main__":
    main()
