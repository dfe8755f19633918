"""Stored objects that do not decode, on every backend.

Every write is checked against the model before it is stored
(`hvfleet.store.encoding.encode`), so no write through hvfleet stores what a
reader refuses. An object can still fail to decode: written by an older
hvfleet under other rules, or put straight into SQLite or etcd. One such
object must not take the fleet down, so the backends treat it the same way:

- a list or a watch skips it, logs an error and counts it
  (`skipped_counts`, served by `hvfleet serve` as the Prometheus counter
  `hvfleet_store_undecodable_skipped_total{kind}`); a list says which it
  skipped (`ListResult.undecodable`), so the API shows them as `Unknown`;
- a get raises `Undecodable` (its message names the object, its version and
  why), and so does a claim against such a host (it cannot be checked);
- a delete works as on any object (with the stored resourceVersion as the
  precondition), and an update whose resourceVersion is the stored one
  overwrites it: the new object is prepared as a create by its writer
  (`hvfleet.store.ownership.prepare_create`: status only from its agent,
  no spec from an agent, a Lease only from its own agent), keeping the uid
  and creation time when they can still be read.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from hvfleet.model.bounds import EARLIEST, LATEST
from hvfleet.model.hypervisor import Resource
from hvfleet.store.errors import Undecodable as Undecodable  # its home; importable from here

log = logging.getLogger("hvfleet.store")

_lock = threading.Lock()
_skipped: Counter[str] = Counter()


def reason_of(exc: Exception) -> str:
    """One line saying why a stored value did not decode (first error, and how many)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        found = errors()
        if found:
            first = found[0]
            loc = ".".join(str(p) for p in first["loc"] if p != "[key]")
            msg = str(first["msg"]).removeprefix("Value error, ")
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            return f"{loc}: {msg}{more}"[:500] if loc else f"{msg}{more}"[:500]
    return f"{type(exc).__name__}: {exc}"[:500]


def undecodable(kind: str, raw: bytes, revision: int, exc: Exception,
                name: str | None = None) -> Undecodable:
    """The error for `raw` (stored at `revision`) failing to decode with `exc`,
    with what can still be read of its metadata."""
    metadata: dict[str, Any] = {}
    try:
        doc = json.loads(raw)
        found = doc.get("metadata") if isinstance(doc, dict) else None
        if isinstance(found, dict):
            metadata = found
    except (ValueError, RecursionError):
        pass
    if name is None:
        stored_name = metadata.get("name")
        name = stored_name if isinstance(stored_name, str) else "?"
    return Undecodable(kind, name[:253], revision, reason_of(exc), metadata)


def skipped(err: Undecodable, where: str) -> None:
    """A list or watch (`where`) passed over `err`'s object: log it and count it."""
    with _lock:
        _skipped[err.kind] += 1
    log.error("%s skipped an undecodable object: %s", where, err)


def skipped_counts() -> dict[str, int]:
    """How many times, per kind, a list or watch in this process skipped an
    object that does not decode."""
    with _lock:
        return dict(_skipped)


def overwrite(err: Undecodable, new: Resource, manager: str, now: datetime) -> Resource:
    """`new` as stored over the undecodable object of `err`: prepared as a create
    by `manager`, with the stored uid and creation time when they can be read.
    The caller checked the resourceVersion against `err.revision`."""
    from hvfleet.store.ownership import prepare_create

    stored = prepare_create(new, manager, now)
    update: dict[str, Any] = {}
    if err.uid and len(err.uid) <= 128:
        update["uid"] = err.uid
    created = err.metadata.get("creationTimestamp")
    if isinstance(created, str):
        try:
            at = datetime.fromisoformat(created)
        except ValueError:
            at = None
        if at is not None:
            at = at if at.tzinfo else at.replace(tzinfo=UTC)
            if EARLIEST <= at < LATEST:
                update["creation_timestamp"] = at
    generation = err.metadata.get("generation")
    if isinstance(generation, int) and not isinstance(generation, bool) and 0 <= generation < 2**62:
        update["generation"] = generation + 1
    if not update:
        return stored
    return stored.model_copy(update={"metadata": stored.metadata.model_copy(update=update)})
