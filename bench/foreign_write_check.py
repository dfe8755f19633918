"""What it would cost to prove, after a write outside hvfleet's prefix (another
application sharing the etcd), that nothing under the prefix changed since
the Placement snapshot's follower's revision F, instead of waiting for the
follower (docs/etcd.md, "Writes beside the objects"): one read-only
transaction of a range of the prefix with `min_mod_revision = F + 1`,
`keys_only`, `limit 1` (no key: no put since F) and the prefix's count at F
and now (equal: no delete). etcd reads every value under the prefix to
filter by mod_revision, so its cost grows with the fleet. Next to it, its
peer in the same run: the `count_only` range that `Store.revision()` is.

A fresh one-member etcd; `--keys` values of `--size` bytes under the prefix;
wall time (p50 of `--requests`) and etcd's process CPU (/proc) per request.

    .venv/bin/python bench/foreign_write_check.py [--keys 10000] [--size 1500] [--requests 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from api import process_cpu as cpu_seconds
from tests.support.etcd_local import EtcdCluster

from hvfleet.store.etcd_transport import EtcdTransport, b64, op_put, prefix_end

PREFIX = "/bench/"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=10000)
    ap.add_argument("--size", type=int, default=1500)
    ap.add_argument("--requests", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EtcdCluster(Path(tmp), size=1) as etcd:
        t = EtcdTransport(etcd.endpoints, "etcd://bench")
        value = b"x" * args.size
        for i in range(0, args.keys, 100):
            t.txn([], [op_put(f"{PREFIX}objects/Hypervisor/h{j:06d}", value)
                       for j in range(i, min(args.keys, i + 100))])
        _, since, _ = t.range(PREFIX, count_only=True)
        t.txn([], [op_put("/another-application/key", b"1")])  # the foreign write
        whole = {"key": b64(PREFIX), "range_end": b64(prefix_end(PREFIX))}

        def check() -> Any:
            out, _ = t.post("kv/txn", {"compare": [], "success": [
                {"request_range": {**whole, "keys_only": True, "min_mod_revision": since + 1, "limit": 1}},
                {"request_range": {**whole, "count_only": True, "revision": since}},
                {"request_range": {**whole, "count_only": True}}]}, "check")
            ranges = [r["response_range"] for r in out["responses"]]
            assert not ranges[0].get("kvs") and ranges[1]["count"] == ranges[2]["count"], ranges
            return out

        def revision() -> Any:
            return t.range(PREFIX, count_only=True)

        member = etcd.members[0].process
        assert member is not None
        cases: list[tuple[str, Callable[[], Any]]] = [
            ("count_only range (Store.revision)", revision), ("min_mod_revision check", check)]
        for name, fn in cases:
            fn()
            walls = []
            before = cpu_seconds(member.pid)
            for _ in range(args.requests):
                began = time.perf_counter()
                fn()
                walls.append(time.perf_counter() - began)
            used = (cpu_seconds(member.pid) - before) / args.requests
            print(f"{args.keys} keys of {args.size} B, {name}: wall p50 "
                  f"{statistics.median(walls) * 1e3:.1f} ms, etcd CPU {used * 1e3:.1f} ms per request")
        t.close()


if __name__ == "__main__":
    main()
