"""Agent liveness as etcd leases: one lease per hypervisor, kept by its agent.

`{prefix}/leases/{name}` is attached to a lease with the agent's TTL and
vanishes when the agent stops renewing it; `{prefix}/lease-holders/{name}`
stays, so readers can tell "lease expired" (not live) from "never had one".
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime

from hvfleet.model.errors import InvalidInput
from hvfleet.store.etcd_transport import EtcdTransport, cmp_lease, op_get, op_put, prefix_end


class EtcdLeases:
    def __init__(self, transport: EtcdTransport, prefix: str) -> None:
        self.transport = transport
        self.prefix = prefix
        self._ids: dict[str, int] = {}
        self._lock = threading.Lock()

    def _lease_key(self, name: str) -> str:
        return f"{self.prefix}/leases/{name}"

    def _holder_key(self, name: str) -> str:
        return f"{self.prefix}/lease-holders/{name}"

    def refresh(self, name: str, ttl: int) -> int:
        """Keep hypervisor `name`'s liveness lease alive: grant it (TTL `ttl` s) and
        attach `{prefix}/leases/{name}` on the first call or after it expired,
        refresh it otherwise. Returns the seconds the lease now has left. When
        the agent stops calling this, the key vanishes `ttl` s later and
        `liveness()` reports the host as not live."""
        if ttl < 1:
            raise InvalidInput(f"keepalive {name}: ttl {ttl} must be at least 1 second")
        what = f"keepalive {name}"
        key = self._lease_key(name)
        with self._lock:
            lease_id = self._ids.get(name)
        if lease_id is not None:
            out, _ = self.transport.post("lease/keepalive", {"ID": lease_id}, what)
            left = int(out.get("result", {}).get("TTL", -1))
            if left > 0:
                # Still ours? (Another store of the same agent may have taken the
                # key over and then released it.) Put it back if not.
                self.transport.txn(
                    [cmp_lease(key, lease_id)],
                    [],
                    [op_put(key, _record(name, ttl), lease_id)],
                    what=what,
                )
                return left
        granted, _ = self.transport.post("lease/grant", {"TTL": ttl, "ID": 0}, what)
        lease_id = int(granted["ID"])
        record = _record(name, ttl)
        # The lease key expires with the lease; the holder key stays, so readers
        # can tell "lease expired" (NotReady) from "never had a lease".
        self.transport.txn(
            [], [op_put(key, record, lease_id), op_put(self._holder_key(name), record)], what=what
        )
        with self._lock:
            self._ids[name] = lease_id
        return int(granted.get("TTL", ttl))

    def release(self, name: str) -> None:
        """Revoke `name`'s lease now (a clean agent shutdown): it is not live anymore."""
        with self._lock:
            lease_id = self._ids.pop(name, None)
        if lease_id is not None:
            self.transport.post("kv/lease/revoke", {"ID": lease_id}, f"release {name}")

    def liveness(self) -> dict[str, bool]:
        leases, holders = self._lease_key(""), self._holder_key("")
        snap = self.transport.txn(
            [],
            [
                op_get(leases, prefix_end(leases), keys_only=True),
                op_get(holders, prefix_end(holders), keys_only=True),
            ],
            what="read agent leases",
        )
        live = {kv.key.removeprefix(leases) for kv in snap.ranges[0]}
        held = {kv.key.removeprefix(holders) for kv in snap.ranges[1]}
        return {name: name in live for name in sorted(held | live)}


def _record(name: str, ttl: int) -> bytes:
    now = datetime.now(UTC).replace(microsecond=0)
    record = {"holder": name, "ttlSeconds": ttl, "acquireTime": now.isoformat()}
    return json.dumps(record, separators=(",", ":")).encode()
