"""What authenticating and authorizing a request costs, beside its peers.

1. TokenAuthenticator.authenticate with the record cached (the common case:
   every request of a busy caller within its one-second cache age); peer: one
   SHA-256 of a 43-character secret, which every authentication pays.
2. authenticate with the cache off (a store read each time: what a token
   costs once per second per replica); peer: a direct `store.get` of a
   Hypervisor on the same store, as every handler does anyway.
3. RoleAuthorizer.authorize; peer: building the Action it is asked about.

Run on SQLite, and on a real single-member etcd with `--etcd`.

    .venv/bin/python bench/auth.py [--n 20000] [--etcd]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

# The repository root: tests.support holds the test and bench tooling (local etcd).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.etcd_local import EtcdCluster

from hvfleet.model import Hypervisor, ObjectMeta
from hvfleet.server.auth import RoleAuthorizer, TokenAuthenticator
from hvfleet.server.identity import Action, Identity
from hvfleet.store import Store, open_store
from hvfleet.store.tokens import issue_token


def per_call_us(fn: Callable[[], object], n: int, rounds: int = 5) -> float:
    """Median over `rounds` of the mean microseconds per call of `n` calls."""
    results = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        results.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(results)


def row(what: str, us: float, peer: str, peer_us: float) -> None:
    print(f"  {what:<44} {us:9.2f} µs   {peer:<36} {peer_us:9.2f} µs   ratio {us / peer_us:6.2f}")


def measure(store: Store, label: str, n: int) -> None:
    store.create(Hypervisor(metadata=ObjectMeta(name="hv1")), "bench")
    _, text = issue_token(store, "agent", manager="bench", now=datetime.now(UTC), ttl=None,
                          hypervisor="hv1")
    header = f"Bearer {text}"
    secret = text.rsplit("_", 1)[-1]
    cached = TokenAuthenticator(store)
    uncached = TokenAuthenticator(store, max_age=0.0)
    who = cached.authenticate(header)
    auth = RoleAuthorizer()
    action = Action("patch", "hypervisors", name="hv1", subresource="status")
    print(f"{label}:")
    row("authenticate, record cached", per_call_us(lambda: cached.authenticate(header), n),
        "sha256 of the secret", per_call_us(lambda: hashlib.sha256(secret.encode()).hexdigest(), n))
    slow_n = max(n // 20, 200)
    row("authenticate, store read each time", per_call_us(lambda: uncached.authenticate(header), slow_n),
        "store.get of a Hypervisor", per_call_us(lambda: store.get("Hypervisor", "hv1"), slow_n))
    row("authorize (agent patches its own status)", per_call_us(
        lambda: auth.authorize(who, action, None, None), n),
        "building that Action", per_call_us(
        lambda: Action("patch", "hypervisors", name="hv1", subresource="status"), n))
    assert isinstance(who, Identity)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--etcd", action="store_true", help="also on a real single-member etcd")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        with open_store(f"sqlite:///{tmp}/bench.db") as store:
            measure(store, "SQLite", args.n)
        if args.etcd:
            with EtcdCluster(Path(tmp) / "etcd", size=1) as cluster, \
                    open_store(cluster.url(prefix="/bench-auth")) as store:
                measure(store, "etcd (1 member)", args.n)


if __name__ == "__main__":
    main()
