"""System calls of one `hvfleet serve` replica per Lease renewal (`strace -c -f`
on the replica, 3-member etcd on loopback, 4 clients, after a warm-up of 300
renewals): `futex` counts the GIL and queue hand-offs between threads.
Prints strace's table and the calls per renewal; run it from each checkout
to compare (it uses bench/replicas.py's replicas and clients).

    .venv/bin/python bench/renewal_syscalls.py [--renewals 600]
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import replicas as bench  # bench/replicas.py
from api import seed

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.etcd_local import EtcdCluster

from hvfleet.store import open_store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--renewals", type=int, default=600)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-syscalls-"))
    with EtcdCluster(tmp / "etcd", size=3) as etcd:
        url = etcd.url(prefix=f"/bench-{uuid.uuid4().hex[:8]}")
        with open_store(url) as store:
            tokens, viewers, _ = seed(store, 40, 1)
        bench.AGENT_TOKENS[:] = tokens
        replicas = bench.Replicas(url, tmp / "r1", 1, viewers[0])
        try:
            bench.api_phase(replicas, 40, 300, 4, "lease")  # warm-up: every agent's Lease at hand
            out = tmp / "strace.txt"
            tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(replicas.servers[0].proc.pid),
                                       "-o", str(out)], stderr=subprocess.DEVNULL)
            time.sleep(1.5)  # attached to every thread
            bench.api_phase(replicas, 40, args.renewals, 4, "lease")
            tracer.send_signal(signal.SIGINT)
            tracer.wait(timeout=60)
        finally:
            replicas.close()
    table = out.read_text()
    print(table)
    for line in table.splitlines():
        m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
        if m and m.group(2) in ("futex", "total", "sendto", "recvfrom", "write", "read"):
            print(f"{m.group(2):>10}: {int(m.group(1)) / args.renewals:.1f} per renewal")


if __name__ == "__main__":
    main()
