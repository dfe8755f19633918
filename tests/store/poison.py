"""Objects put into a backend behind hvfleet's back, as an older hvfleet or a
person with `sqlite3`/`etcdctl` could have: straight into SQLite's tables (with
the revision and event a write makes) or into etcd's key. For the tests that
check one undecodable object never takes a reader down."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from hvfleet.store.etcd import EtcdStore
from hvfleet.store.etcd_transport import op_put

# The reproduction of issue 16: a Hypervisor whose status.capacity.cpu was
# stored with 4,000 digits (what `Quantity.parse` accepted from a JSON integer).
HUGE = "1" + "0" * 4000


def hypervisor_doc(name: str, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "hvfleet.io/v1", "kind": "Hypervisor",
        "metadata": {"name": name, "uid": f"uid-{name}", "generation": 3,
                     "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {"az": "a"}},
        "spec": {},
        "status": status or {"capacity": {"cpu": HUGE}},
    }


def poison(url: str, kind: str, name: str, doc: dict[str, Any] | bytes) -> int:
    """Store `doc` as `kind` `name` at the store at `url` (sqlite:///… or
    etcd://…) without any check; the revision it was stored at."""
    body = doc if isinstance(doc, bytes) else json.dumps(doc, sort_keys=True).encode()
    if url.startswith("sqlite:///"):
        return _sqlite(url.removeprefix("sqlite:///"), kind, name, body)
    if url.startswith("etcd://"):
        store = EtcdStore.from_url(url)
        try:
            result = store.transport.txn([], [op_put(store._key(kind, name), body)], what="poison")
            return result.revision
        finally:
            store.close()
    raise ValueError(f"cannot poison {url}")


def _sqlite(path: str, kind: str, name: str, body: bytes) -> int:
    try:
        labels = json.loads(body)["metadata"]["labels"]
    except (ValueError, KeyError, TypeError):
        labels = {}
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        rev = int(db.execute(
            "UPDATE meta SET value = value + 1 WHERE key = 'revision' RETURNING value").fetchone()[0])
        exists = db.execute("SELECT 1 FROM objects WHERE kind = ? AND name = ?", (kind, name)).fetchone()
        db.execute("INSERT OR REPLACE INTO objects (kind, name, rv, labels, host, body) "
                   "VALUES (?, ?, ?, ?, NULL, ?)", (kind, name, rev, json.dumps(labels), body.decode()))
        db.execute("INSERT INTO events (rev, kind, name, type, body) VALUES (?, ?, ?, ?, ?)",
                   (rev, kind, name, "MODIFIED" if exists else "ADDED", body.decode()))
        db.execute("COMMIT")
        return rev
    finally:
        db.close()
