"""How long a Placement read waits, on etcd, for the server's provider
snapshot (hvfleet.placement.snapshot) to catch up with the store: in this
process, over a real one-member etcd, p50 of `refresh()` with nothing new,
and right after a write of each kind the snapshot follows (a Placement
record: ResourceProvider; a public kind: a Hypervisor's Lease, which the
snapshot follows to judge that host's readiness). Each write is checked to
be in the snapshot's graph after the refresh. Wall time per refresh and this
process's CPU time per refresh.

Runs against any checkout: a snapshot without `follow` (before c14129f) is
measured as it is, opening its streams per refresh:

    .venv/bin/python bench/placement_catchup.py [--writes 40]
    PYTHONPATH=/path/to/other/src .venv/bin/python bench/placement_catchup.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.etcd_local import EtcdCluster

from hvfleet.model.meta import ObjectMeta
from hvfleet.model.placement import ResourceProvider, ResourceProviderSpec
from hvfleet.placement.snapshot import ProviderSnapshot
from hvfleet.store import Store, open_store


def timed(refresh: Callable[[], None], before: Callable[[], None], n: int) -> tuple[float, float]:
    """(p50 wall s, mean CPU s) of `refresh`, each after `before`."""
    walls, cpu = [], 0.0
    for _ in range(n):
        before()
        c, t = time.process_time(), time.perf_counter()
        refresh()
        walls.append(time.perf_counter() - t)
        cpu += time.process_time() - c
    return statistics.median(walls), cpu / n


def record(store: Store) -> str:
    uid = str(uuid.uuid4())
    store.create(ResourceProvider(metadata=ObjectMeta(name=uid), spec=ResourceProviderSpec(
        provider_name=uid, root_uuid=uid)), "bench")
    return uid


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--writes", type=int, default=40)
    args = ap.parse_args()
    with EtcdCluster(Path(tempfile.mkdtemp(prefix="bench-catchup-")) / "etcd", size=1) as cluster:
        store = open_store(cluster.url(prefix="/catchup"))
        snap = ProviderSnapshot.from_store(store)
        stop = threading.Event()
        following = hasattr(snap, "follow")
        if following:
            snap.follow(store, stop)
        made: list[str] = []

        def check() -> None:
            if made:
                assert made[-1] in snap.graph().providers, "a refresh missed the write before it"

        def refresh() -> None:
            snap.refresh(store)
            check()

        print(f"snapshot {'follows the store in a thread' if following else 'opens its streams per refresh'}")
        rows = [
            ("nothing new", lambda: None),
            ("right after a Placement record's write", lambda: made.append(record(store))),
            ("right after a lease renewal", lambda: store.keepalive("hv-bench", 30)),
        ]
        for name, before in rows:
            wall, cpu = timed(refresh, before, args.writes)
            print(f"  refresh {name:40} p50 {wall * 1000:6.1f} ms   CPU {cpu * 1000:5.2f} ms")
        stop.set()
        store.close()


if __name__ == "__main__":
    main()
