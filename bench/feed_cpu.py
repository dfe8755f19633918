"""CPU of a server's etcd feed thread per followed event, and how much of it
is the pydantic decode: one process follows (a shared store, one
`watch_into` of Hypervisors whose sink does nothing) while another store in
the same process writes status updates; the feed thread's own CPU is read
from /proc (utime + stime of that thread), so the writer's work is not in it.

Modes, each a fresh 1-member etcd: `decode` (as a server runs), `constant`
(the decode replaced by one object: what the rest of the feed costs), `nogc`
(`gc.disable()`: the collector's share).

    .venv/bin/python bench/feed_cpu.py [--writes 3000] [--modes decode,constant,nogc]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.etcd_local import EtcdCluster

from hvfleet.model.hypervisor import Hypervisor
from hvfleet.store.etcd import EtcdStore

TICK = os.sysconf("SC_CLK_TCK")
HOSTS = 20


def thread_cpu(tid: int) -> float:
    fields = Path(f"/proc/{os.getpid()}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def run(mode: str, writes: int) -> float:
    """Seconds of the feed thread's CPU per followed event."""
    with tempfile.TemporaryDirectory() as tmp, EtcdCluster(Path(tmp) / "etcd", size=1) as etcd:
        writer = EtcdStore(etcd.endpoints, "/feed-cpu")
        follower = EtcdStore(etcd.endpoints, "/feed-cpu")
        follower.share_watches()
        current = {i: writer.create(Hypervisor.model_validate({"metadata": {"name": f"hv{i}"}}),
                                    f"agent/hv{i}") for i in range(HOSTS)}
        if mode == "constant":
            same = current[0]
            follower._decode_watched = lambda kv: same  # type: ignore[method-assign]
        if mode == "nogc":
            gc.disable()
        got = [0]
        stop = threading.Event()

        def count(events: list[object]) -> None:
            got[0] += len(events)

        threading.Thread(target=follower.watch_into, daemon=True,
                         args=("Hypervisor", follower.revision(), count, stop)).start()
        time.sleep(1.0)
        feed = follower._feed._thread
        assert feed is not None and feed.native_id is not None
        before = thread_cpu(feed.native_id)
        for k in range(writes):
            i = k % HOSTS
            h = current[i]
            status = h.status.model_validate({"allocation": {"cpu": str(k % 64 + 1)},
                                              "lastHeartbeatTime": datetime.now(UTC).isoformat()})
            current[i] = writer.update(h.model_copy(update={"status": status}), f"agent/hv{i}")
        deadline = time.monotonic() + 60
        while got[0] < writes and time.monotonic() < deadline:
            time.sleep(0.05)
        used = thread_cpu(feed.native_id) - before
        stop.set()
        gc.enable()
        follower.close()
        writer.close()
        return used / writes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=3000)
    parser.add_argument("--modes", default="decode,constant,nogc")
    args = parser.parse_args()
    for mode in args.modes.split(","):
        print(f"{mode:10} feed thread CPU per followed event: {run(mode, args.writes) * 1e6:.0f} µs")


if __name__ == "__main__":
    main()
