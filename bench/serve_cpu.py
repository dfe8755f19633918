"""CPU time of the real `hvfleet serve` process at fleet scale (user+sys of
every thread, from /proc/PID/stat, so the machine's load barely moves it):

1. the first load of the dashboard's fleet (start to the first overview.json);
2. the first /fit page (its fleet index is built then), and a second one;
3. a quiet server over `--idle-seconds` (no page open, no write): the
   readiness of every host moves with the clock, the watches wait for writes.

The server runs over a SQLite store of `--hosts` synthetic hosts (seeded once
and copied, tests/dashboard/synthetic.py). `--server-src DIR` runs the server
from another checkout's `src` (PYTHONPATH), e.g. the parent commit's, for a
before/after figure in the same run. Each figure is the median over `--runs`
fresh servers.

    .venv/bin/python bench/serve_cpu.py [--hosts 10000] [--runs 3] [--idle-seconds 60] [--server-src DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from api import process_cpu as cpu_seconds  # noqa: E402
from tests.dashboard.fleet import serving, wait_dashboard_loaded  # noqa: E402
from tests.dashboard.synthetic import seeded_store  # noqa: E402


def one_run(hosts: int, idle: float, server_src: str | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        store_url = seeded_store(Path(tmp) / "hvfleet.db", hosts)
        env = dict(os.environ)
        if server_src:
            os.environ["PYTHONPATH"] = server_src
        try:
            with serving(Path(tmp), store_url) as fleet:
                assert fleet.process is not None
                pid = fleet.process.pid
                ops = fleet.token("operator", "ops")
                s = fleet.http()
                s.cookies.set("hvfleet_session", ops)
                c0 = cpu_seconds(pid)
                wait_dashboard_loaded(fleet, ops)
                c1 = cpu_seconds(pid)
                out = {"load": c1 - c0}
                for label in ("first fit", "second fit"):
                    c0 = cpu_seconds(pid)
                    r = s.get(fleet.url + "/fit", params={"go": "1", "cpu": "4", "memory": "8Gi"},
                              timeout=300)
                    assert r.status_code == 200, r.status_code
                    out[label] = cpu_seconds(pid) - c0
                time.sleep(6)  # past the first readiness pass after the fit
                c0 = cpu_seconds(pid)
                time.sleep(idle)
                out["idle"] = (cpu_seconds(pid) - c0) / idle
                return out
        finally:
            os.environ.clear()
            os.environ.update(env)


def main() -> None:
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--idle-seconds", type=float, default=60.0)
    ap.add_argument("--server-src", help="run the server from this src directory (PYTHONPATH)")
    args = ap.parse_args()
    runs = [one_run(args.hosts, args.idle_seconds, args.server_src) for _ in range(args.runs)]
    for r in runs:
        print("  run: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()))
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"{args.hosts} hosts, server CPU (median of {args.runs}): first load {med['load']:.2f} s, "
          f"first /fit {med['first fit']:.2f} s, second /fit {med['second fit']:.3f} s, "
          f"idle {100 * med['idle']:.1f}% of a core over {args.idle_seconds:.0f} s")


if __name__ == "__main__":
    main()
