"""The fleet index: every host's free capacity in numpy arrays, so a fit query
over 100k hosts is a handful of vector comparisons instead of a store scan.

Each row is computed by the model's capacity functions (`free_capacity`,
`max_unit`, `hypervisor_effective_capacity`) — the index never redoes that
arithmetic, it only stores the results. Values are exact: per resource column
the index keeps integers scaled by the least common denominator of everything
stored in that column (1 for whole vCPUs and bytes), in int64 while they fit
and as Python ints otherwise, and compares them to the request scaled the same
way (rounded up: `q <= F/D` iff `ceil(q·D) <= F`). Rows are refreshed from the
store's watch; a row whose reservations expire is recomputed at the first
query after the expiry, so phases are derived the same way as everywhere else.
Candidacy is `model.readiness.readiness`, split so a query stays vectorised:
per row what needs no clock (Ready condition, maintenance), per query the
heartbeat's `fresh_until` against the time and the agent's lease. Agent
liveness (Lease objects) is read when the index loads, then follows the
Leases' watch events and is judged (`lease_live`) at each refresh, never per
query: a host whose lease expired is no candidate, a live lease stands for a
fresh heartbeat.

The index is also the Placement API's hosts (issue 18: one truth, not two
copies): beside each row it keeps that host's root provider in Placement's
units (`HostProvider`, by `host_provider`: `placement export`'s inventories
and usages, claims by consumer, readiness), made at the first Placement read
after a write that touched the host, after a Lease change that turns its
readiness, or when its turn on the clock comes (a holding claim expiring,
`readiness_turn`), each with a version (`placement_roots`). Placement's
arithmetic is done over those records (hvfleet.placement), `fit`'s over the
exact columns: the two never share a rounding.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from hvfleet.model.capacity import (
    free_capacity,
    held_resources,
    holds_space,
    hypervisor_effective_capacity,
    max_unit,
)
from hvfleet.model.errors import Gone, InvalidInput
from hvfleet.model.hypervisor import STORED_KINDS, Hypervisor, OvercommitPolicy, Reservation
from hvfleet.model.lease import Lease, lease_live
from hvfleet.model.readiness import DEFAULT_STALENESS, fresh_until, host_readiness, readiness, readiness_turn
from hvfleet.model.resources import CPU, MEMORY, ResourceName
from hvfleet.model.selectors import Selector
from hvfleet.model.spec_sync import SpecSync, spec_sync
from hvfleet.model.units import unit_constraints
from hvfleet.scheduling.fit import Rejection, rejections
from hvfleet.scheduling.placement import HostProvider, host_provider, provider_uuid
from hvfleet.scheduling.request import Request
from hvfleet.store.base import Store, WatchEvent
from hvfleet.store.following import follow_in_thread
from hvfleet.store.undecodable import Undecodable

log = logging.getLogger(__name__)

Weigher = Literal["binpack", "spread"]
WEIGHERS: tuple[Weigher, ...] = ("binpack", "spread")
_INT64_LIMIT = 2**62
_NEVER = np.iinfo(np.int64).max
_NO_BEAT = np.iinfo(np.int64).min
# How long a refresh waits for the follower (`follow_stream`) to reach the
# store's revision before it answers from what it has.
FOLLOW_WAIT_S = 0.5


def micros(t: datetime) -> int:
    """Exact integer microseconds since the epoch (naive times are UTC)."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    delta = t - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


@dataclass
class _Row:
    """What the index keeps per host, all computed by the model's functions."""

    free: dict[ResourceName, Fraction]
    max_unit: dict[ResourceName, Fraction]
    effective: dict[ResourceName, Fraction]
    min_unit: dict[ResourceName, Fraction]
    step: dict[ResourceName, Fraction]
    # readiness() apart from the heartbeat and the lease, which change without
    # an event and are compared per query (fresh_until, _lease_live, _lease_ok).
    ready: bool
    fresh_until: int
    next_expiry: int


def _compute_row(
    h: Hypervisor,
    reservations: Iterable[Reservation],
    now: datetime,
    staleness: timedelta,
    policies: Sequence[OvercommitPolicy] = (),
) -> _Row:
    # Confirmed reservations may hold what libvirt cannot see (held_resources);
    # only Pending/Active ones expire, and a host event recomputes the rest.
    held = [r for r in reservations if held_resources(r, h, now)]
    expiries = [
        micros(r.spec.expires_at) for r in held if r.spec.expires_at is not None and holds_space(r, h, now)
    ]
    try:
        units = unit_constraints(h)
        valid = True
    except InvalidInput:
        units, valid = {}, False  # not a candidate; `--why` says which annotation
    fresh = fresh_until(h, staleness)
    effective = hypervisor_effective_capacity(h, policies)
    return _Row(
        free={r: q.value for r, q in free_capacity(h, held, now, policies, effective).items()},
        max_unit={r: q.value for r, q in max_unit(h).items()},
        effective={r: q.value for r, q in effective.items()},
        min_unit={r: c.min_unit.value for r, c in units.items() if c.min_unit is not None},
        step={r: c.step_size.value for r, c in units.items() if c.step_size is not None},
        # lease_live=True: everything but the heartbeat and the lease, which the
        # query masks add (fresh_until, _lease_live, _lease_ok).
        ready=valid and readiness(h, None, True, staleness).ready,
        fresh_until=_NO_BEAT if fresh is None else micros(fresh),
        next_expiry=min(expiries, default=_NEVER),
    )


class _Column:
    """One resource across all rows: exact scaled integers plus floats for weighing.
    A host without the resource has free = max_unit = 0 (nothing fits), as in
    Placement, where a provider without the inventory is no candidate."""

    def __init__(self, size: int) -> None:
        self.scale = 1
        self.values: dict[str, list[Fraction]] = {
            k: [Fraction(0)] * size for k in ("free", "max_unit", "min_unit", "step")
        }
        # For weighing, kept ready per row so a query only gathers and divides:
        # used = effective − free, the divisor (1 where there is no capacity) and
        # whether there is capacity at all (utilisation counts as 1 otherwise).
        self.used = np.zeros(size, dtype=np.float64)
        self.divisor = np.ones(size, dtype=np.float64)
        self.has_capacity = np.zeros(size, dtype=bool)
        self.arrays: dict[str, npt.NDArray[Any]] = {}
        self._rebuild()

    def _rebuild(self) -> None:
        # The scale is a multiple of every stored denominator: each scaled value
        # is a whole number, computed in integers.
        scaled = {k: [v.numerator * (self.scale // v.denominator) for v in vals]
                  for k, vals in self.values.items()}
        big = any(abs(n) >= _INT64_LIMIT for ns in scaled.values() for n in ns)
        dtype: Any = object if big else np.int64
        self.arrays = {k: np.array(ns, dtype=dtype) for k, ns in scaled.items()}

    def grow(self, size: int) -> None:
        extra = size - len(self.used)
        for vals in self.values.values():
            vals.extend([Fraction(0)] * extra)
        self.used = np.concatenate([self.used, np.zeros(extra)])
        self.divisor = np.concatenate([self.divisor, np.ones(extra)])
        self.has_capacity = np.concatenate([self.has_capacity, np.zeros(extra, dtype=bool)])
        self._rebuild()

    def set(self, row: int, values: dict[str, Fraction], effective: Fraction) -> None:
        # Integer arithmetic only (v × scale is a whole number once the scale is
        # a multiple of v's denominator): Fraction arithmetic here was a third of
        # building the index of 10,000 hosts.
        rebuild = False
        scaled: dict[str, int] = {}
        for k, v in values.items():
            self.values[k][row] = v
            den = v.denominator
            if self.scale % den:
                self.scale = math.lcm(self.scale, den)
                rebuild = True
                continue
            n = scaled[k] = v.numerator * (self.scale // den)
            if self.arrays[k].dtype != object and abs(n) >= _INT64_LIMIT:
                rebuild = True
        if rebuild:
            self._rebuild()
        else:
            for k, n in scaled.items():
                self.arrays[k][row] = n
        eff = float(effective)
        self.used[row] = eff - float(values["free"])
        self.has_capacity[row] = eff > 0
        self.divisor[row] = eff if eff > 0 else 1.0


@dataclass
class Candidate:
    name: str
    score: float


@dataclass
class FitResult:
    request: Request
    weigher: Weigher
    # Best first. Kept as two plain lists: building one object per host would
    # cost more than the whole query on a 100k-host fleet.
    names: list[str]
    scores: list[float]
    # Number of hosts that fit before --limit cut the list.
    fitting: int
    considered: int
    rejected: dict[str, list[Rejection]] = field(default_factory=dict)

    @property
    def candidates(self) -> list[Candidate]:
        return [Candidate(n, s) for n, s in zip(self.names, self.scores, strict=True)]


class FleetIndex:
    def __init__(self, staleness: timedelta = DEFAULT_STALENESS) -> None:
        # One handler per kind the index follows (an access token: none), taking
        # (event type, object, revision, now).
        self._follow: dict[str, Callable[[str, Any, int, datetime], None]] = {
            "Hypervisor": self._apply_host, "OvercommitPolicy": self._apply_policy,
            "Reservation": self._apply_reservation, "Lease": self._apply_lease,
        }
        self.staleness = staleness
        self._lock = threading.RLock()
        # Per host, what the store last said of its agent's liveness lease (absent:
        # no information, e.g. only `--once` runs). Kept across loads: not in the lists.
        self._liveness: dict[str, bool] = {}
        # Per host, its agent's Lease as last seen (loaded, then from the watch):
        # liveness is judged from these at each refresh, without a store read.
        self._leases: dict[str, Lease] = {}
        # Set while a thread follows the store (`follow_stream`): a refresh then
        # waits for it instead of reading a stream of its own.
        self._following = False
        self._seen = threading.Condition(self._lock)
        # The version of the Placement roots (`placement_roots`): it moves on
        # with each host whose provider was made again, also across a reload.
        self._pversion = 0
        self._reset()

    def _reset(self) -> None:
        self.revision = 0
        # The store revision the last refresh caught up with (>= self.revision
        # when the newest revisions were not events of ours).
        self._caught_up = 0
        self._names: list[str] = []
        self._row: dict[str, int] = {}
        self._hosts: dict[str, Hypervisor] = {}
        self._reservations: dict[str, dict[str, Reservation]] = {}
        self._host_of_reservation: dict[str, str] = {}
        # OvercommitPolicies by name, and the same as a list for the capacity functions.
        self._policies: dict[str, OvercommitPolicy] = {}
        self._policy_list: list[OvercommitPolicy] = []
        self._rows: list[_Row | None] = []
        self._columns: dict[ResourceName, _Column] = {}
        self._size = 0
        self._present = np.zeros(0, dtype=bool)
        self._ready = np.zeros(0, dtype=bool)
        self._fresh_until = np.zeros(0, dtype=np.int64)
        self._next_expiry = np.zeros(0, dtype=np.int64)
        # Per row, False where the host's agent lease expired (from _liveness).
        self._lease_ok = np.zeros(0, dtype=bool)
        # Per row, True where the lease is live: that stands for a fresh heartbeat.
        self._lease_live = np.zeros(0, dtype=bool)
        # Name order, the tie-breaker of every ranking: each row's rank, and the
        # names by rank (what a query's result list is taken from).
        self._rank = np.zeros(0, dtype=np.int64)
        self._name_by_rank: npt.NDArray[np.object_] = np.zeros(0, dtype=object)
        self._labels_version = 0
        self._selector_cache: dict[str, tuple[int, npt.NDArray[np.bool_]]] = {}
        # Placement's view of each host (HostProvider), made at the first
        # Placement read after a write that touched the host (`_pdirty`), after
        # its agent's Lease changed its readiness (`_prejudge`), or when its
        # turn comes (a holding claim expires, its readiness may turn).
        self._proots: dict[str, HostProvider] = {}
        self._pdirty: set[str] = set()
        self._prejudge: set[str] = set()
        self._pturns = Turns()
        # Which host each version after `_pbase` made again (a reload starts a
        # new base: a reader from before it takes every root).
        self._pversion += 1
        self._pbase = self._pversion
        self._plog: list[str] = []
        self._uuids: dict[str, str] | None = None  # provider uuid -> host name

    # -- building -----------------------------------------------------------------

    @classmethod
    def from_store(cls, store: Store, staleness: timedelta = DEFAULT_STALENESS,
                   hosts: tuple[list[Hypervisor], int] | None = None) -> FleetIndex:
        """The index of the store's fleet; `hosts` as in `load_from`."""
        index = cls(staleness)
        index.load_from(store, hosts)
        return index

    def set_liveness(self, liveness: Mapping[str, bool]) -> None:
        """What the store says of each agent's liveness lease
        (`Store.agent_liveness()`): hosts listed as False are no candidates
        until a later map says otherwise; unlisted hosts have no information."""
        with self._lock:
            names = set(self._liveness) | set(liveness)
            changed = {n for n in names if self._liveness.get(n) != liveness.get(n)}
            self._liveness = dict(liveness)
            for name in changed:
                row = self._row.get(name)
                if row is not None:
                    self._lease_ok[row] = self._liveness.get(name) is not False
                    self._lease_live[row] = self._liveness.get(name) is True

    def load_from(self, store: Store, hosts: tuple[list[Hypervisor], int] | None = None) -> None:
        """Everything from the store. `hosts`: the fleet's Hypervisors already
        read (and decoded) by someone who follows the store, with a revision up
        to which every Hypervisor event is in them: a server's dashboard holds
        them, and listing and decoding 10,000 hosts again was a third of the
        index's first build."""
        if hosts is None:
            hv = store.list("Hypervisor")
            hosts = [h for h in hv.items if isinstance(h, Hypervisor)], hv.revision
        res = store.list("Reservation")
        pol = store.list("OvercommitPolicy")
        reservations = [r for r in res.items if isinstance(r, Reservation)]
        policies = [p for p in pol.items if isinstance(p, OvercommitPolicy)]
        # Watching from the oldest of the revisions replays what changed in
        # between; replays are recognised by resourceVersion and skipped.
        self.load(hosts[0], reservations, min(hosts[1], res.revision, pol.revision), policies=policies)
        self._leases = store.agent_leases()
        self.set_liveness(self._lease_liveness(datetime.now(UTC)))

    def _lease_liveness(self, now: datetime) -> dict[str, bool]:
        with self._lock:
            return {name: lease_live(lease, now) for name, lease in self._leases.items()}

    def load(
        self,
        hosts: Iterable[Hypervisor],
        reservations: Iterable[Reservation],
        revision: int = 0,
        now: datetime | None = None,
        policies: Iterable[OvercommitPolicy] = (),
    ) -> None:
        with self._lock:
            self._reset()
            self.revision = revision
            self._policies = {p.name: p for p in policies}
            self._policy_list = sorted(self._policies.values(), key=lambda p: p.name)
            for r in reservations:
                self._reservations.setdefault(r.spec.hypervisor, {})[r.name] = r
                self._host_of_reservation[r.name] = r.spec.hypervisor
            hosts = list(hosts)
            self._grow(len(hosts))
            now = now or datetime.now(UTC)
            for h in hosts:
                self._put_host(h, now, rank=False)
            self._rerank()

    def _grow(self, need: int) -> None:
        if need <= len(self._present):
            return
        size = max(need, 2 * len(self._present), 16)
        extra = size - len(self._present)
        self._present = np.concatenate([self._present, np.zeros(extra, dtype=bool)])
        self._ready = np.concatenate([self._ready, np.zeros(extra, dtype=bool)])
        self._fresh_until = np.concatenate([self._fresh_until, np.full(extra, _NO_BEAT, dtype=np.int64)])
        self._next_expiry = np.concatenate([self._next_expiry, np.full(extra, _NEVER, dtype=np.int64)])
        self._lease_ok = np.concatenate([self._lease_ok, np.ones(extra, dtype=bool)])
        self._lease_live = np.concatenate([self._lease_live, np.zeros(extra, dtype=bool)])
        self._rank = np.concatenate([self._rank, np.zeros(extra, dtype=np.int64)])
        self._rows.extend([None] * extra)
        for col in self._columns.values():
            col.grow(size)

    def _rerank(self) -> None:
        """Each row's position in name order: the tie-breaker of every ranking."""
        names = np.array(self._names, dtype=object)
        order = np.argsort(names, kind="stable")
        self._rank[order] = np.arange(len(order))
        # Fresh copies, allocated one after the other: a result list touches
        # every name it holds, and names packed on few pages make a 100k list
        # build 2-3× faster than names scattered among the fleet's model objects.
        self._name_by_rank = np.array([n.encode().decode() for n in names[order]], dtype=object)

    def _put_host(self, h: Hypervisor, now: datetime, *, rank: bool = True) -> None:
        row = self._row.get(h.name)
        old = self._hosts.get(h.name)
        if row is None:
            row = self._size
            self._size += 1
            self._grow(self._size)
            self._row[h.name] = row
            self._names.append(h.name)
            self._lease_ok[row] = self._liveness.get(h.name) is not False
            self._lease_live[row] = self._liveness.get(h.name) is True
            if rank:
                self._rerank()
            self._labels_version += 1
        elif old is None or old.metadata.labels != h.metadata.labels:
            self._labels_version += 1
        if old is None or old.metadata.uid != h.metadata.uid:
            self._uuids = None
        self._hosts[h.name] = h
        self._present[row] = True
        self._compute(row, now)

    def _compute(self, row: int, now: datetime) -> None:
        name = self._names[row]
        h = self._hosts[name]
        data = _compute_row(
            h, self._reservations.get(name, {}).values(), now, self.staleness, self._policy_list
        )
        self._rows[row] = data
        self._pdirty.add(name)
        self._ready[row] = data.ready
        self._fresh_until[row] = data.fresh_until
        self._next_expiry[row] = data.next_expiry
        previous = set(self._columns)
        for r in set(data.free) | set(data.max_unit) | previous:
            col = self._columns.get(r)
            if col is None:
                col = self._columns[r] = _Column(len(self._present))
            zero = Fraction(0)
            col.set(
                row,
                {
                    "free": data.free.get(r, zero),
                    "max_unit": data.max_unit.get(r, zero),
                    "min_unit": data.min_unit.get(r, zero),
                    "step": data.step.get(r, zero),
                },
                data.effective.get(r, zero),
            )

    def _remove_host(self, name: str) -> None:
        row = self._row.get(name)
        if row is not None:
            self._present[row] = False
            if self._hosts.pop(name, None) is not None:
                self._uuids = None
            self._labels_version += 1
            self._pdirty.add(name)

    # -- following the store --------------------------------------------------------

    def apply(self, event: WatchEvent, now: datetime | None = None) -> None:
        with self._lock:
            self._handle(event, now or datetime.now(UTC))
            self.revision = max(self.revision, event.revision)
            if event.last_of_revision:
                self._seen.notify_all()

    def _handle(self, event: WatchEvent, now: datetime) -> None:
        """One event, by its kind's handler (call with the lock held). By
        `event.kind`, not the object's: an event of a kind the index does not
        keep stays undecoded (sealed values)."""
        handler = self._follow.get(event.kind)
        if handler is not None:
            handler(event.type, event.object, event.revision, now)

    def _apply_host(self, kind: str, h: Hypervisor, revision: int, now: datetime) -> None:
        current = self._hosts.get(h.name)
        if kind == "DELETED":
            self._remove_host(h.name)
        elif current is None or _rv(current) < revision:
            self._put_host(h, now)

    def _apply_lease(self, kind: str, lease: Lease, _revision: int, _now: datetime) -> None:
        # Judged at the next refresh (a lease expires without an event).
        if kind == "DELETED":
            self._leases.pop(lease.name, None)
        else:
            self._leases[lease.name] = lease
        self._prejudge.add(lease.name)

    def forget(self, unreadable: Undecodable) -> None:
        """A write the store could not decode (hvfleet.store.undecodable): a host
        whose newest state cannot be read is no candidate any more. Anything
        else keeps its last readable state (a reservation still holds its space,
        a policy its ratios), the cautious side for a claim."""
        with self._lock:
            if STORED_KINDS.get(unreadable.kind) is Hypervisor:
                self._remove_host(unreadable.name)
            self.revision = max(self.revision, unreadable.revision)

    def _apply_policy(self, kind: str, p: OvercommitPolicy, revision: int, now: datetime) -> None:
        """A policy changes the effective capacity of the hosts its old or new
        selector matches: recompute those rows."""
        current = self._policies.get(p.name)
        if kind != "DELETED" and current is not None and _rv(current) >= revision:
            return
        selectors = [x.spec.selector.to_selector() for x in (current, p) if x is not None]
        if kind == "DELETED":
            self._policies.pop(p.name, None)
        else:
            self._policies[p.name] = p
        self._policy_list = sorted(self._policies.values(), key=lambda x: x.name)
        for name, h in self._hosts.items():
            if any(s.matches(h.metadata.labels) for s in selectors):
                self._compute(self._row[name], now)

    def _apply_reservation(self, kind: str, r: Reservation, revision: int, now: datetime) -> None:
        old_host = self._host_of_reservation.get(r.name)
        current = self._reservations.get(old_host, {}).get(r.name) if old_host else None
        if kind != "DELETED" and current is not None and _rv(current) >= revision:
            return
        touched = {h for h in (old_host, r.spec.hypervisor) if h}
        if old_host is not None:
            self._reservations.get(old_host, {}).pop(r.name, None)
            self._host_of_reservation.pop(r.name, None)
        if kind != "DELETED":
            self._reservations.setdefault(r.spec.hypervisor, {})[r.name] = r
            self._host_of_reservation[r.name] = r.spec.hypervisor
        for host in touched:
            row = self._row.get(host)
            if row is not None and host in self._hosts:
                self._compute(row, now)

    def refresh(self, store: Store, settle: float = 0.25, *, liveness: bool = True,
                target: int | None = None) -> int:
        """Catch up with the store: apply every event up to the store's current
        revision; returns how many. Stops as soon as that revision is delivered
        (SQLite has every event at hand; an etcd watch streams them), waiting at
        most `settle` seconds for revisions that are not ours (etcd counts writes
        under every prefix). A watch that lost its history (Gone) rebuilds from
        a fresh list. Agent liveness is then judged from the Leases the watch
        delivered (renewals are events; an expiry is the clock), so a refresh
        reads no Lease list; not with `liveness` False (the Placement roots
        judge each Lease at the time asked, and a fit's refresh judges them all).
        `target`: the store's revision, when the caller has just read it (on
        etcd each read is a round trip)."""
        if target is None:
            target = store.revision()
        n = 0
        if self._following:
            with self._lock:
                if target > max(self.revision, self._caught_up):
                    store.follow_now()
                    self._seen.wait_for(lambda: self.revision >= target, FOLLOW_WAIT_S)
                    self._caught_up = target
            if liveness:
                self.set_liveness(self._lease_liveness(datetime.now(UTC)))
            return n
        since = self.revision
        if store.events_at_hand:
            settle = 0.0  # every event up to the revision is in the first read
            # And each catch-up read every event up to its target: the next
            # starts there, not at the index's last event (when the writes
            # since were not of its kinds, a Placement record's, a token's,
            # each read walked every revision since: 10k stored providers'
            # claims paid a walk over the fleet's seeding).
            since = max(since, self._caught_up)
        if target > max(self.revision, self._caught_up):
            # A revision with no event of ours (a server secret's write on etcd)
            # that reaches `target` ends the catch-up as its event would.
            reached = threading.Event()

            def progressed(revision: int) -> None:
                if revision >= target:
                    reached.set()

            try:
                for event in store.watch(None, since=since, timeout=settle, stop=reached,
                                         on_undecodable=self.forget, on_progress=progressed):
                    self.apply(event)
                    n += 1
                    if event.revision >= target and event.last_of_revision:
                        break  # not before: one atomic write's events share a revision
            except Gone:
                self.load_from(store)
            self._caught_up = target
        if liveness:
            self.set_liveness(self._lease_liveness(datetime.now(UTC)))
        return n

    def follow(
        self, store: Store, stop: threading.Event, liveness_every: float = 1.0
    ) -> threading.Thread:
        """Keep the index current in a background thread until `stop` is set;
        agent liveness is judged again every `liveness_every` seconds."""

        def run() -> None:
            read_at = time.monotonic()
            while not stop.is_set():
                try:
                    for event in store.watch(None, since=self.revision, stop=stop, timeout=liveness_every,
                                             on_undecodable=self.forget):
                        self.apply(event)
                        if time.monotonic() - read_at >= liveness_every:
                            break
                except Gone:
                    self.load_from(store)
                self.set_liveness(self._lease_liveness(datetime.now(UTC)))
                read_at = time.monotonic()

        t = threading.Thread(target=run, name="fleet-index-watch", daemon=True)
        t.start()
        return t

    def follow_stream(self, store: Store, stop: threading.Event) -> threading.Thread:
        """Keep the index current in a thread until `stop` is set, from one
        long watch (on etcd the process's shared feed, hvfleet.store.feed):
        a `refresh` then only waits until this thread has seen the store's
        revision (a new stream from a past revision gets etcd's history only
        at its next sync of lagging watchers, up to 100 ms later). Agent
        liveness is judged at each refresh."""

        def events(since: int, progressed: Callable[[int], None]) -> Iterator[WatchEvent]:
            return store.watch(None, since=since, stop=stop, on_undecodable=self.forget,
                               on_progress=progressed)

        with self._lock:
            self._following = True
        return follow_in_thread(self, self._seen, store, stop, events,
                                lambda event: self._handle(event, datetime.now(UTC)), "fleet-index-stream")

    # -- Placement's view of the hosts ------------------------------------------------

    def placement_roots(self, since: int | None, now: datetime
                        ) -> tuple[int, dict[str, HostProvider | None] | None]:
        """Placement's root provider of each host (hvfleet.scheduling.placement
        .HostProvider), judged at `now`: (the version they are of, the hosts
        whose provider was made again after version `since`, by name, None
        where the host is gone). The changes are None when `since` is None or
        from before a reload: then take them all (`placement_all`). Each
        provider is made once per write that touched its host (the host, its
        reservations, a policy that selects it), per Lease change that turns
        its readiness and per turn of the clock that changes it (a holding
        claim expiring, `readiness_turn`), at the first call after it."""
        with self._lock:
            self._make_roots(now)
            version = self._pversion
            if since is None or since < self._pbase:
                return version, None
            return version, {n: self._proots.get(n) for n in set(self._plog[since - self._pbase:])}

    def placement_all(self, now: datetime) -> tuple[int, dict[str, HostProvider]]:
        """Every host's root provider at `now`, and the version it is of."""
        with self._lock:
            self._make_roots(now)
            return self._pversion, dict(self._proots)

    @property
    def placement_version(self) -> int:
        """The version of the root providers made so far (`placement_roots`)."""
        return self._pversion

    def placement_settled(self, version: int, now: datetime) -> bool:
        """Whether `placement_roots(version, now)` would hand out nothing new:
        no write applied since version `version`, no Lease to judge again, no
        host whose turn has come. False when another thread holds the index
        (never waits: safe on an event loop)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            return (version == self._pversion and not self._pdirty and not self._prejudge
                    and not self._pturns.any_due(now))
        finally:
            self._lock.release()

    def _make_roots(self, now: datetime) -> None:
        """Make again the providers of the hosts a write touched, whose turn
        has come, or whose Lease changed their readiness; with the lock held."""
        dirty = self._pdirty | self._pturns.due(now)
        for name in self._prejudge - dirty:
            h = self._hosts.get(name)
            root = self._proots.get(name)
            if h is None or root is None:
                continue
            lease = self._leases.get(name)
            if host_readiness(h, lease, now, self.staleness).ready != root.ready:
                dirty.add(name)
            else:  # a renewal: the same judgement, until the renewed Lease lapses
                self._pturns.put(name, _soonest(root.expires, readiness_turn(h, lease, now, self.staleness)))
        self._prejudge.clear()
        self._pdirty = set()
        for name in dirty:
            h = self._hosts.get(name)
            if h is None:
                self._pturns.put(name, None)
                if self._proots.pop(name, None) is not None:
                    self._log_root(name)
                continue
            root = host_provider(h, list(self._reservations.get(name, {}).values()), self._policy_list,
                                 now, self._leases.get(name), self.staleness)
            self._proots[name] = root
            lease = self._leases.get(name)
            self._pturns.put(name, _soonest(root.expires, readiness_turn(h, lease, now, self.staleness)))
            self._log_root(name)

    def _log_root(self, name: str) -> None:
        self._pversion += 1
        self._plog.append(name)
        if len(self._plog) > 4 * len(self._hosts) + 1024:  # readers keep up: drop the older half
            cut = len(self._plog) // 2
            del self._plog[:cut]
            self._pbase += cut

    def provider_uuids(self) -> dict[str, str]:
        """Provider uuid -> host name (made again only when a host comes or goes)."""
        with self._lock:
            if self._uuids is None:
                self._uuids = {provider_uuid(h): name for name, h in self._hosts.items()}
            return self._uuids

    # -- reading ----------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self._present[: self._size].sum())

    def policies(self) -> list[OvercommitPolicy]:
        """The OvercommitPolicies the rows are computed with, by name."""
        return list(self._policy_list)

    def host(self, name: str) -> Hypervisor | None:
        return self._hosts.get(name)

    def synced(self, name: str) -> SpecSync:
        """SYNCED of a host in the index, as `get` and `capacity` show it."""
        return spec_sync(self._hosts[name], self._policy_list)

    def reservations_of(self, name: str) -> list[Reservation]:
        with self._lock:
            return list(self._reservations.get(name, {}).values())

    def free(self, name: str) -> dict[ResourceName, Fraction]:
        """The host's free capacity as stored in the index (for tests and display)."""
        row = self._rows[self._row[name]]
        assert row is not None
        return dict(row.free)

    def _expire(self, now_us: int, now: datetime) -> None:
        n = self._size
        due = np.nonzero(self._present[:n] & (self._next_expiry[:n] <= now_us))[0]
        for row in due:
            self._compute(int(row), now)

    def _selector_mask(self, selector: Selector | None) -> npt.NDArray[np.bool_] | None:
        if selector is None or not selector.requirements:
            return None
        key = str(selector)
        cached = self._selector_cache.get(key)
        if cached is not None and cached[0] == self._labels_version:
            return cached[1]
        mask = np.zeros(self._size, dtype=bool)
        for name, h in self._hosts.items():
            if selector.matches(h.metadata.labels):
                mask[self._row[name]] = True
        self._selector_cache[key] = (self._labels_version, mask)
        return mask

    def _in_scope(self, selector: Selector | None) -> npt.NDArray[np.bool_]:
        present = self._present[: self._size]
        sel = self._selector_mask(selector)
        return present if sel is None else present & sel

    def candidates_mask(self, now: datetime, selector: Selector | None = None) -> npt.NDArray[np.bool_]:
        n = self._size
        # Together: readiness(h, now, lease, staleness).ready, vectorised.
        fresh = (self._fresh_until[:n] >= micros(now)) | self._lease_live[:n]
        mask = self._present[:n] & self._ready[:n] & fresh
        mask &= self._lease_ok[:n]
        sel = self._selector_mask(selector)
        return mask if sel is None else mask & sel

    def fits_mask(self, request: Request, now: datetime) -> npt.NDArray[np.bool_]:
        """Per row: does every requested resource fit (capacity, max_unit, min_unit,
        step_size)? Candidacy (maintenance, Ready, heartbeat) is not included."""
        n = self._size
        mask = np.ones(n, dtype=bool)
        for r, q in request.resources.items():
            col = self._columns.get(r)
            if col is None:
                return np.zeros(n, dtype=bool)
            a = col.arrays
            one = q.value * col.scale
            total = one * request.count
            mask &= a["free"][:n] >= math.ceil(total)
            mask &= a["max_unit"][:n] >= math.ceil(one)
            mask &= a["min_unit"][:n] <= math.floor(one)
            step = a["step"][:n]
            if not step.any():
                continue  # no host declares a step size for this resource
            if one.denominator == 1:
                mask &= (step == 0) | (int(one) % np.where(step == 0, 1, step) == 0)
            else:
                mask &= step == 0
        return mask

    def scores(
        self, rows: npt.NDArray[np.intp], request: Request, weigher: Weigher
    ) -> npt.NDArray[np.float64]:
        """Utilisation after placing the request, averaged over cpu and memory
        (binpack prefers the highest, spread the lowest)."""
        total = np.zeros(len(rows), dtype=np.float64)
        parts = 0
        for r in (CPU, MEMORY):
            col = self._columns.get(r)
            if col is None:
                continue
            need = float(request.total(r).value) if r in request.resources else 0.0
            # (effective − free + need) / effective, in the same operations and
            # order as ever, so scores (and ties) do not move; 1 without capacity.
            part = col.used.take(rows)
            part += need
            part /= col.divisor.take(rows)
            np.copyto(part, 1.0, where=~col.has_capacity.take(rows))
            total += part
            parts += 1
        if parts:
            total /= parts
        return total

    def _ranked(
        self, rows: npt.NDArray[np.intp], key: npt.NDArray[np.float64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Sort `rows` by `key`, ties by host name: the rows' name ranks in
        that order, and the keys in that order.

        One unstable argsort on the float key, then ties put in name order by
        sorting `tie group × size + name rank`: integers already grouped, so
        that sort is cheap. Two stable sorts (lexsort) cost 4× as much on a
        100k fleet."""
        m = len(rows)
        if m == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        by_key = np.argsort(key)
        sorted_key = key.take(by_key)
        combined = self._rank.take(rows.take(by_key))
        del by_key
        group = np.empty(m, dtype=np.int64)
        group[0] = 0
        differs = sorted_key[1:] != sorted_key[:-1]
        if np.isnan(sorted_key[-1]):  # argsort puts NaNs last; they tie, as in lexsort
            differs &= ~(np.isnan(sorted_key[1:]) & np.isnan(sorted_key[:-1]))
        np.cumsum(differs, out=group[1:])
        del differs
        group *= self._size
        combined += group
        combined.sort()
        combined -= group  # the sort moved values only within their group
        return combined, sorted_key

    def fit(
        self,
        request: Request,
        *,
        now: datetime | None = None,
        selector: Selector | None = None,
        weigher: Weigher = "binpack",
        limit: int | None = None,
        why: bool = False,
    ) -> FitResult:
        with self._lock:
            now = now or datetime.now(UTC)
            self._expire(micros(now), now)
            candidates = self.candidates_mask(now, selector)
            ok = candidates & self.fits_mask(request, now)
            rows = np.nonzero(ok)[0]
            key = self.scores(rows, request, weigher)
            if weigher == "binpack":
                np.negative(key, out=key)  # highest score first; negating is exact
            if limit is not None and 0 < limit < len(rows):
                part = np.argpartition(key, limit - 1)[:limit]
                keep = key <= key[part].max()  # keep ties at the cut, names decide below
                rows, key = rows[keep], key[keep]
            ranks, sorted_key = self._ranked(rows, key)
            del key
            if limit is not None:
                ranks, sorted_key = ranks[:limit], sorted_key[:limit]
            if weigher == "binpack":
                np.negative(sorted_key, out=sorted_key)
            result = FitResult(
                request=request,
                weigher=weigher,
                names=self._name_by_rank.take(ranks).tolist(),
                scores=sorted_key.tolist(),
                fitting=int(ok.sum()),
                considered=int(self._in_scope(selector).sum()),
            )
            if why:
                for row in np.nonzero(~ok & self._in_scope(selector))[0]:
                    name = self._names[int(row)]
                    found = rejections(
                        self._hosts[name],
                        self.reservations_of(name),
                        request,
                        now,
                        self.staleness,
                        self._liveness.get(name),
                        self._policy_list,
                    )
                    result.rejected[name] = found
            return result


def _soonest(*times: datetime | None) -> datetime | None:
    return min((t for t in times if t is not None), default=None)


class Turns:
    """When each host is to be looked at again, and which are due: a heap of
    (time, host), an entry counting only while it is the host's current turn
    (a renewed Lease moves a turn on without a pass over the fleet)."""

    def __init__(self) -> None:
        self._at: dict[str, datetime] = {}
        self._heap: list[tuple[datetime, str]] = []

    def put(self, host: str, when: datetime | None) -> None:
        if when is None:
            self._at.pop(host, None)
            return
        if self._at.get(host) == when:
            return
        self._at[host] = when
        heapq.heappush(self._heap, (when, host))
        if len(self._heap) > 2 * len(self._at) + 64:  # mostly moved-on entries: keep the current
            self._heap = [(t, h) for h, t in self._at.items()]
            heapq.heapify(self._heap)

    def any_due(self, now: datetime) -> bool:
        """Whether some entry is at or before `now` (a moved-on one too: then
        `due` has only not dropped it yet, and saying so is merely cautious)."""
        heap = self._heap
        return bool(heap) and heap[0][0] <= now

    def due(self, now: datetime) -> set[str]:
        """The hosts whose turn is at or before `now` (each then has none)."""
        out: set[str] = set()
        heap = self._heap
        while heap and heap[0][0] <= now:
            when, host = heapq.heappop(heap)
            if self._at.get(host) == when:
                del self._at[host]
                out.add(host)
        return out


def _rv(obj: Hypervisor | Reservation | OvercommitPolicy) -> int:
    rv = obj.metadata.resource_version
    return int(rv) if rv and rv.isdecimal() else 0
