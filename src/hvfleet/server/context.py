"""What every handler of one server process shares: the store, who is calling and
whether they may, the audit log, the limits, the watch fan-out, and the warm
state of the fleet verbs (fleet index, agent liveness)."""

from __future__ import annotations

import asyncio
import gc
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

from hvfleet.model.errors import BadRequest
from hvfleet.model.hypervisor import Hypervisor, Resource
from hvfleet.model.readiness import DEFAULT_STALENESS
from hvfleet.placement.allocations import AllocationWriter
from hvfleet.placement.snapshot import ProviderSnapshot
from hvfleet.scheduling.index import FleetIndex
from hvfleet.server.auth import not_selecting
from hvfleet.server.identity import Action, Authenticator, Authorizer, Identity, Selecting
from hvfleet.server.watch import WatchHub, WatchLimits
from hvfleet.store.base import Store
from hvfleet.views.tables import TableInputs, table_inputs

CONTINUE_MISMATCH = ("continue: this token was issued for another list (another caller, kind or "
                     "selector); list again without it")


@dataclass(frozen=True)
class Limits:
    max_body: int = 1024 * 1024  # bytes; larger bodies get 413 RequestEntityTooLarge
    watch: WatchLimits = field(default_factory=WatchLimits)
    # A claim refuses hosts whose heartbeat is older than this (as `hvfleet reserve`).
    claim_staleness: timedelta = DEFAULT_STALENESS
    # Read-modify-write handlers (PATCH, DELETE) retry this often on a stale version.
    write_attempts: int = 20
    # Seconds the inputs of Table rows (agent liveness, hosts) are reused for.
    liveness_max_age: float = 1.0
    # Seconds between checks of an open stream's token (API watches, dashboard
    # event streams): a revoked or expired token's streams end within this
    # (plus the authenticator's cache age).
    token_recheck: float = 2.0


class ListSnapshots:
    """The full results of recent paged lists, so the pages of one list are cut
    from one read (as Kubernetes serves continue tokens from one revision).
    Each is kept with the list it answers (`binding`: caller, kind, selectors),
    and served only to that list again."""

    def __init__(self, keep: int = 16, max_age: float = 60.0) -> None:
        self._keep, self._max_age = keep, max_age
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[float, str, int, list[Resource]]] = OrderedDict()

    def put(self, revision: int, items: list[Resource], binding: str = "") -> str:
        key = secrets.token_urlsafe(12)
        with self._lock:
            self._items[key] = (time.monotonic(), binding, revision, items)
            while len(self._items) > self._keep:
                self._items.popitem(last=False)
        return key

    def get(self, key: str, binding: str = "") -> tuple[int, list[Resource]] | None:
        """The snapshot (None when gone); BadRequest when it was taken for
        another caller, kind or selector."""
        with self._lock:
            found = self._items.get(key)
            if found is None or time.monotonic() - found[0] > self._max_age:
                self._items.pop(key, None)
                return None
        if not hmac.compare_digest(found[1], binding):
            raise BadRequest(CONTINUE_MISMATCH)
        return found[2], found[3]


class AuditLog(Protocol):
    """One structured record per write attempt (allowed or not)."""

    def record(self, who: Identity | None, action: Action, *, before: str | None,
               after: str | None, code: int, reason: str) -> None: ...


class ApiContext:
    def __init__(self, store: Store, authenticator: Authenticator, authorizer: Authorizer,
                 audit: AuditLog | None, limits: Limits) -> None:
        self.store = store
        self.authenticator = authenticator
        self.authorizer = authorizer
        self.audit = audit
        self.limits = limits
        self.hub = WatchHub(store, limits.watch)
        self.list_snapshots = ListSnapshots()
        self._table_inputs: dict[str, tuple[float, TableInputs]] = {}
        self._index: FleetIndex | None = None
        self.index_lock = threading.Lock()
        self._placement: ProviderSnapshot | None = None
        self._placement_lock = threading.Lock()
        self._placement_stop = threading.Event()
        # The Placement API's allocation writes, grouped (hvfleet.placement.allocations).
        self.placement_writer = AllocationWriter()
        # The fleet's Hypervisors as someone in this process follows them (the
        # dashboard's FleetState.hosts_snapshot), for the index's first build;
        # None, or answering None: the index lists them itself.
        self.fleet_hosts: Callable[[], tuple[list[Hypervisor], int] | None] | None = None
        # Set when the server begins to stop (hvfleet.server.serve): every open
        # stream (API watches, dashboard event streams) ends its answer then,
        # complete, so its client goes on at another replica and the stop is
        # not held until uvicorn's graceful-shutdown bound cancels it.
        self.stopping = asyncio.Event()

    def authorize(self, who: Identity, action: Action, current: Resource | None = None,
                  new: Resource | None = None) -> None:
        narrowed = self.authorizer.authorize(who, action, current, new)
        if narrowed is not None:
            # Fail closed: a handler that serves whole objects must not serve a read
            # the caller may make only of some of them (see authorize_read).
            raise not_selecting(who, action, action.name, narrowed)

    def authorize_read(self, who: Identity, action: Action) -> Selecting | None:
        """Authorize a get, list or watch; what it is narrowed to, if anything
        (the handler then serves only those objects, hvfleet.server.narrowing)."""
        return self.authorizer.authorize(who, action, None, None)

    def table_inputs(self, kind: str) -> TableInputs:
        """Liveness (and, for reservations, their hosts) for Table rows, read at
        most once per `liveness_max_age` seconds: a watch with many events must
        not re-read them per event."""
        at, value = self._table_inputs.get(kind, (0.0, TableInputs()))
        if time.monotonic() - at > self.limits.liveness_max_age:
            value = table_inputs(kind, self.store)
            self._table_inputs[kind] = (time.monotonic(), value)
        return value

    def fleet_index(self) -> FleetIndex:
        """The fleet index kept warm across requests; call with index_lock held.
        Each use catches up with the store first, so a fit sees every earlier write."""
        if self._index is None:
            hosts = self.fleet_hosts() if self.fleet_hosts is not None else None
            index = FleetIndex.from_store(self.store, self.limits.claim_staleness, hosts)
            if not self.store.events_at_hand:
                # etcd: one long watch (the process's shared feed) keeps it current;
                # a refresh waits for it instead of opening a stream of its own.
                index.follow_stream(self.store, self._placement_stop)
            self._index = index
            gc.freeze()  # kept for the process's life: see dashboard.live.Follower
        self._index.refresh(self.store)
        return self._index

    def _catch_up_index(self, store: Store, target: int) -> None:
        """The Placement snapshot's catch-up of the index: as `fleet_index`,
        but agent liveness is left for the next fit to judge (Placement judges
        each host's Lease itself, at the time asked)."""
        with self.index_lock:
            if self._index is None:
                self.fleet_index()
            else:
                self._index.refresh(store, liveness=False, target=target)

    def placement_snapshot(self) -> ProviderSnapshot:
        """The Placement API's provider snapshot (hvfleet.placement.snapshot),
        loaded on first use, over the fleet index `fit` reads; over a store
        whose events are not at hand (etcd) it follows the store's Placement
        records in a thread until the server stops."""
        snap = self._placement
        if snap is None:
            with self._placement_lock:
                snap = self._placement
                if snap is None:
                    # Over the fit's own index: one truth for both (hvfleet.placement.snapshot).
                    with self.index_lock:
                        index = self.fleet_index()
                    snap = ProviderSnapshot.from_store(self.store, index=index, catch_up=self._catch_up_index)
                    if not self.store.events_at_hand:
                        snap.follow(self.store, self._placement_stop)
                    self._placement = snap
        return snap

    def loaded_placement_snapshot(self) -> ProviderSnapshot | None:
        """The snapshot once loaded (None before: loading reads the store)."""
        return self._placement

    def close(self) -> None:
        self._placement_stop.set()
        self.hub.close()
