"""CPU of an idle `hvfleet serve` replica over etcd with open watches (issue 21):
nothing is written, `--watches` API watches are open (hypervisors,
reservations, leases, overcommitpolicies in turn, two tokens), and the
server's own long-lived watches (each kind's fan-out, the garbage collector,
the token records, the Placement snapshot's follower) wait on the shared etcd
feed. Process CPU (user + sys of every thread, /proc/PID/stat) over
`--seconds`, after a settling pause.

With `--base DIR` (another checkout), a server from DIR's `src` runs beside
this checkout's, each over its own prefix of one etcd member, both measured
over the same seconds of each round (so the machine's load hits both alike);
the figure is the median over `--rounds` and the ratio head / base.

    .venv/bin/python bench/idle_watches.py [--watches 16] [--seconds 30] [--rounds 2] [--base DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from api import process_cpu as cpu_seconds  # noqa: E402
from tests.support import serve  # noqa: E402
from tests.support.etcd_local import EtcdCluster  # noqa: E402

GV = "/apis/hvfleet.io/v1"
PLURALS = ("hypervisors", "reservations", "leases", "overcommitpolicies")


@contextlib.contextmanager
def replica(tmp: Path, store_url: str, src: str | None, watches: int) -> Iterator[serve.Server]:
    """A server from `src` (None: this checkout) with `watches` API watches open."""
    saved = os.environ.get("PYTHONPATH")
    if src is not None:
        os.environ["PYTHONPATH"] = src
    try:
        srv = serve.start_server(tmp, store_url)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    open_ones: list[requests.Response] = []
    try:
        # The Placement API's snapshot starts following on its first request.
        r = requests.get(f"{srv.url}/placement/resource_providers", verify=str(srv.ca), timeout=30,
                         headers={"X-Auth-Token": srv.tokens["admin"],
                                  "OpenStack-API-Version": "placement 1.39"})
        assert r.status_code == 200, r.text
        for i in range(watches):
            token = srv.tokens["admin" if i % 2 else "viewer"]
            s = srv.session(token)
            w = s.get(f"{srv.url}{GV}/{PLURALS[i % len(PLURALS)]}?watch=true", stream=True, timeout=30)
            assert w.status_code == 200, w.text
            open_ones.append(w)
        yield srv
    finally:
        for w in open_ones:
            w.close()
        serve.stop_server(srv)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--watches", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--base", help="another checkout, measured beside this one")
    args = ap.parse_args()
    peers: list[tuple[str, str | None]] = [("head", None)]
    if args.base:
        peers.insert(0, ("base", str(Path(args.base).resolve() / "src")))
    figures: dict[str, list[float]] = {name: [] for name, _ in peers}
    with tempfile.TemporaryDirectory() as tmp_dir, EtcdCluster(Path(tmp_dir) / "etcd", size=1) as etcd:
        for rnd in range(args.rounds):
            with contextlib.ExitStack() as stack:
                servers = {}
                for name, src in (peers if rnd % 2 == 0 else peers[::-1]):
                    d = Path(tmp_dir) / f"{name}-{rnd}"
                    d.mkdir()
                    url = etcd.url(prefix=f"/idle-{name}-{rnd}")
                    servers[name] = stack.enter_context(replica(d, url, src, args.watches))
                time.sleep(args.settle)
                start = {n: cpu_seconds(s.process.pid) for n, s in servers.items()}
                threading.Event().wait(args.seconds)
                for n, s in servers.items():
                    used = cpu_seconds(s.process.pid) - start[n]
                    figures[n].append(used)
                    print(f"round {rnd + 1}: {n}: {used:.2f} s CPU in {args.seconds:.0f} s idle "
                          f"with {args.watches} watches ({100 * used / args.seconds:.2f} % of a core)",
                          flush=True)
    for name, got in figures.items():
        print(f"{name}: median {statistics.median(got):.2f} s CPU per {args.seconds:.0f} s idle")
    if args.base:
        ratios = [h / b for h, b in zip(figures["head"], figures["base"], strict=True) if b > 0]
        if ratios:
            print(f"head / base: {statistics.median(ratios):.2f} "
                  f"(rounds {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
