"""The dashboard's live picture of the fleet, kept by following the API's own
watch fan-out (`WatchHub`, server/watch.py) for Hypervisors and Reservations:
every host's overview row (feed.host_row) recomputed when that host or one of
its reservations changes, and when the clock alone moves it: each host's next
such moment (its heartbeat turning stale, a reservation expiring) is kept in
a heap, and a pass every `refresh_seconds` judges again only the hosts whose
moment has come or whose agent's liveness (its Lease) changed, not every
host (a full pass over 10,000 hosts every 5 s was most of an idle server's
CPU). It also keeps, in bounded memory, each host's recent
changes, notes which hosts' figures changed for the history (history.py keeps
that in the store: a change of readiness alone is not history), and tells the
page's event streams (SSE) which hosts changed.

A followed Hypervisor write that the store vouched for (its sealed bytes:
hvfleet.store.encoding.vouched) is not decoded here: its recent change is
told from the stored JSON (json.loads, not the model), the host is kept as
that event, and decoded when something reads it (a page, /metrics, the
history's sample, the fleet index, the readiness pass of a host whose moment
came). A replica with no page open follows a host written 100 times between
two reads with one decode, and a read of one host decodes that host only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import heapq
import json
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from hvfleet.model.errors import HvfleetError
from hvfleet.model.hypervisor import (
    Hypervisor,
    HypervisorSpec,
    HypervisorStatus,
    OvercommitPolicy,
    Reservation,
)
from hvfleet.model.readiness import fresh_until
from hvfleet.model.resources import CPU, MEMORY, ResourceName
from hvfleet.model.selectors import Selector
from hvfleet.server.dashboard.feed import (
    HostRow,
    host_row,
    same_figures,
    shown_alike,
    totals_document,
    totals_of,
    with_readiness,
)
from hvfleet.store.base import Store, WatchEvent
from hvfleet.store.ownership import owners
from hvfleet.views.capacity import FleetTotals, resource_order


@dataclass(frozen=True)
class HistoryLimits:
    recent_changes: int = 20  # per host, for its page


@dataclass(frozen=True)
class Change:
    """One watch event of a host, as its page lists it."""

    at: str
    type: str
    kind: str
    name: str
    resource_version: str
    manager: str
    fields: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "type": self.type, "kind": self.kind, "name": self.name,
                "resourceVersion": self.resource_version, "manager": self.manager,
                "fields": self.fields}


Followed = TypeVar("Followed", Hypervisor, Reservation, OvercommitPolicy)


def _apply_one(objects: dict[str, Followed], event: WatchEvent, obj: Followed) -> None:
    """`objects` (by name) as the watch event about `obj` leaves them."""
    if event.type == "DELETED":
        objects.pop(obj.metadata.name, None)
    else:
        objects[obj.metadata.name] = obj


def _change(event: WatchEvent, obj: Hypervisor | Reservation, fields: list[str]) -> Change:
    """The change a watch event made to `obj`, as the host's page lists it."""
    return Change(datetime.now(UTC).isoformat(timespec="seconds"), event.type, obj.kind, obj.metadata.name,
                  str(event.revision), _last_writer(obj), fields)


def _last_writer(obj: Hypervisor | Reservation) -> str:
    latest = max(obj.metadata.managed_fields, key=lambda e: e.time or datetime.min.replace(tzinfo=UTC),
                 default=None)
    return latest.manager if latest is not None else "-"


def _changed_fields(before: Hypervisor | None, after: Hypervisor) -> list[str]:
    """Top-level spec and status fields that differ (what a person scans for)."""
    if before is None:
        return ["created"]
    out = []
    for part in ("spec", "status"):
        # Field by field on the models (no dump of either side: this runs for
        # every followed write of a host).
        a, b = getattr(before, part), getattr(after, part)
        out += [f"{part}.{k}" for k in sorted(type(b).model_fields)
                if k != "last_heartbeat_time" and getattr(a, k) != getattr(b, k)]
    return out or ["heartbeat"]


# The spec's and status' fields by the name the stored JSON gives them.
_FIELD_OF = {part: {(f.alias or n): n for n, f in model.model_fields.items()}
             for part, model in (("spec", HypervisorSpec), ("status", HypervisorStatus))}


def _changed_fields_stored(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    """`_changed_fields` told from two stored JSON documents of a host (parsed),
    not from the models: the same list, since the stored JSON is the model's
    own dump (a field left out is its None)."""
    if before is None:
        return ["created"]
    out = []
    for part, fields in _FIELD_OF.items():
        a, b = before.get(part) or {}, after.get(part) or {}
        if _alike_but_heartbeat(a, b):  # most writes (one comparison in C, not one per field)
            continue
        out += sorted(f"{part}.{fields[k]}" for k in a.keys() | b.keys()
                      if k != _HEARTBEAT and a.get(k) != b.get(k) and k in fields)
    return sorted(out) or ["heartbeat"]


_HEARTBEAT = "lastHeartbeatTime"


def _alike_but_heartbeat(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether `a` and `b` are equal but for the heartbeat: True only when no
    field differs (False may still turn out as no field of interest moved)."""
    if a == b:
        return True
    return a.get(_HEARTBEAT) != b.get(_HEARTBEAT) and {**a, _HEARTBEAT: None} == {**b, _HEARTBEAT: None}


def _last_writer_stored(doc: dict[str, Any]) -> str:
    """`_last_writer` from a stored JSON document."""
    latest, at = "-", datetime.min.replace(tzinfo=UTC)
    entries = (doc.get("metadata") or {}).get("managedFields") or []
    for entry in entries:
        when = entry.get("time")
        t = datetime.fromisoformat(when) if isinstance(when, str) else datetime.min.replace(tzinfo=UTC)
        if latest == "-" or t > at:
            latest, at = str(entry.get("manager", "-")), t
    return latest


class FleetState:
    def __init__(self, store: Store, refresh_seconds: float = 5.0,
                 history: HistoryLimits | None = None) -> None:
        self.store = store
        self.refresh_seconds = refresh_seconds
        self.limits = history or HistoryLimits()
        self.lock = threading.RLock()
        self._hosts: dict[str, Hypervisor] = {}
        # A host's last event when it came undecoded (the store vouched for its
        # bytes): it stands for the host until something reads the host
        # (`_host`, `hosts`), which decodes it once.
        self._undecoded: dict[str, WatchEvent] = {}
        # Each host's last stored JSON as its last event brought it, for telling
        # the next event's changed fields without a decode.
        self._stored: dict[str, bytes] = {}
        self.reservations: dict[str, Reservation] = {}
        self.policies: dict[str, OvercommitPolicy] = {}
        self._rows: dict[str, HostRow] = {}
        self._version = 0  # bumped on every change of any row
        # Hosts whose row an event made stale while nobody looked: computed when
        # something reads the rows (`_settle`), so a replica with no open page
        # (and not keeping the history) follows a write without computing rows.
        self._pending: set[str] = set()
        # The version at which each host's row last changed: a page that drew the
        # fleet at version V asks only for the rows changed since (`changed_since`).
        self.changed_at: dict[str, int] = {}
        self.revision = 0
        # Every Hypervisor event up to this revision is in `hosts` (the list's
        # revision, then the followed fan-out's position): see hosts_snapshot.
        self.hosts_through = 0
        self._liveness: dict[str, bool] = {}
        self._refreshed = 0.0
        # When the clock alone next moves each host's row (epoch seconds), and
        # the same as a heap of (when, name); an entry whose time is not the
        # host's current one in `_due` is left over and skipped.
        self._due: dict[str, float] = {}
        self._clock: list[tuple[float, str]] = []
        self._sorted: list[HostRow] | None = None
        self._totals: dict[tuple[int, str], dict[str, Any]] = {}
        # Running totals of every host (key None) and of each label value (key, value).
        self._sums: dict[tuple[str, str] | None, FleetTotals] = {}
        # How many hosts have effective capacity of each resource (the overview's columns).
        self._resource_hosts: dict[ResourceName, int] = {}
        self.recent: dict[str, deque[Change]] = {}
        # Hosts whose figures (allocated, held, effective) changed, or that went,
        # since the history last took them.
        self.touched: set[str] = set()
        self._listeners: set[asyncio.Queue[set[str]]] = set()
        self.loaded = threading.Event()  # set once the first load is done
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the hosts, decoded when read --------------------------------------------------------------

    @property
    def hosts(self) -> dict[str, Hypervisor]:
        """Every host, by name (read it under `lock`): the ones an undecoded event
        left are decoded now."""
        if self._undecoded:
            for name in list(self._undecoded):
                self._host(name)
        return self._hosts

    @hosts.setter
    def hosts(self, hosts: dict[str, Hypervisor]) -> None:
        self._hosts = hosts
        self._undecoded.clear()
        self._stored.clear()

    def _host(self, name: str) -> Hypervisor | None:
        """One host, decoded now if its last event came undecoded (lock held)."""
        event = self._undecoded.pop(name, None)
        if event is not None:
            obj = event.object
            assert isinstance(obj, Hypervisor)
            self._hosts[name] = obj
            return obj
        return self._hosts.get(name)

    def _host_revision(self, name: str) -> int | None:
        event = self._undecoded.get(name)
        if event is not None:
            return event.revision
        h = self._hosts.get(name)
        return None if h is None else int(h.metadata.resource_version or 0)

    # -- loading and refreshing ----------------------------------------------------------------

    def load(self) -> int:
        """Everything from the store; returns the revision to watch from. Every
        row is computed again (the policies may have changed), but only the
        hosts whose row differs from before count as changed: a reload tells
        the pages and the history about what moved, not about every host."""
        hv = self.store.list("Hypervisor")
        rs = self.store.list("Reservation")
        ps = self.store.list("OvercommitPolicy")
        with self.lock:
            self.policies = {o.metadata.name: o for o in ps.items if isinstance(o, OvercommitPolicy)}
            self.hosts = {o.metadata.name: o for o in hv.items if isinstance(o, Hypervisor)}
            self.reservations = {o.metadata.name: o for o in rs.items if isinstance(o, Reservation)}
            self.revision = min(hv.revision, rs.revision, ps.revision)
            self.hosts_through = hv.revision
            self._recompute_all(force=True)
        self.loaded.set()
        return self.revision

    def _by_host(self) -> dict[str, list[Reservation]]:
        out: dict[str, list[Reservation]] = {}
        for r in self.reservations.values():
            out.setdefault(r.spec.hypervisor, []).append(r)
        return out

    def policy_list(self) -> list[OvercommitPolicy]:
        return [self.policies[n] for n in sorted(self.policies)]

    def _recompute_all(self, force: bool = False) -> set[str]:
        """Every row again (call with the lock held); the hosts whose row
        changed (the version moves only then). Without `force`, an unchanged
        host without reservations only has its readiness judged again."""
        now = datetime.now(UTC)
        self._liveness = self.store.agent_liveness(now)
        self._pending.clear()  # every row is judged here
        rows = _judged(now, self.hosts, self._rows, self._by_host(), self.policy_list(), self._liveness,
                       force)
        return self._install(rows, now)

    def _install(self, rows: dict[str, HostRow], now: datetime) -> set[str]:
        """`rows` as every host's row (lock held); the hosts whose row changed."""
        # A row whose readiness message alone moved (a stale heartbeat's age) is
        # kept up to date for the next page that asks, but is not a change.
        changed = {n for n, x in rows.items() if n not in self._rows or not shown_alike(self._rows[n], x)}
        gone = set(self._rows) - set(rows)
        changed |= gone
        if not self._rows or len(changed) > len(rows) // 2:
            self._sums = self._summed(rows.values())
            self._resource_hosts = {}
            for x in rows.values():
                self._count_resources(x, 1)
        else:
            for n in changed:
                self._account(self._rows.get(n), rows.get(n))
        self.touched |= gone | {n for n in changed - gone if not same_figures(self._rows.get(n), rows[n])}
        self._rows = rows
        self._sorted = None
        self._refreshed = time.monotonic()
        self._reschedule_all(now)
        if changed:
            self._changed(changed)
        return changed

    def _reschedule_all(self, now: datetime) -> None:
        """Every host's next moment after `now`, the time its row was judged at."""
        by_host = self._by_host()
        self._due, self._clock = {}, []
        for n, h in self.hosts.items():
            when = _next_move(h, by_host.get(n, ()), now)
            if when is not None:
                self._due[n] = when
                self._clock.append((when, n))
        heapq.heapify(self._clock)

    def _schedule(self, name: str, reservations: Iterable[Reservation], now: datetime) -> None:
        """Note when the clock alone next moves `name`'s row (lock held)."""
        h = self._host(name)
        when = _next_move(h, reservations, now) if h is not None else None
        if when is None:
            self._due.pop(name, None)
        elif self._due.get(name) != when:
            self._due[name] = when
            heapq.heappush(self._clock, (when, name))

    def _recompute(self, names: Iterable[str]) -> None:
        now = datetime.now(UTC)
        by_host = self._by_host()
        policies = self.policy_list()
        for n in names:
            h = self._host(n)
            if h is None:
                self.touched.add(n)
                self._account(self._rows.pop(n, None), None)
                continue
            row = host_row(h, by_host.get(n, []), now, self._liveness.get(n), policies)
            old = self._rows.get(n)
            if not same_figures(old, row):
                self.touched.add(n)
            self._account(old, row)
            self._rows[n] = row
            self._schedule(n, by_host.get(n, []), now)
        self._changed(names)

    def _settle(self) -> None:
        """Compute the rows events left pending (lock held)."""
        if self._pending:
            names, self._pending = self._pending, set()
            self._recompute(names)

    @property
    def rows(self) -> dict[str, HostRow]:
        """Every host's row, by name (read it under `lock`)."""
        with self.lock:
            self._settle()
            return self._rows

    @property
    def version(self) -> int:
        with self.lock:
            self._settle()
            return self._version

    @property
    def watched(self) -> bool:
        """Whether a page follows the rows now (an open event stream)."""
        return bool(self._listeners)

    @staticmethod
    def _summed(rows: Iterable[HostRow]) -> dict[tuple[str, str] | None, FleetTotals]:
        """The running sums of `rows` from scratch: every host (key None) and
        each label value, as `_account` keeps them."""
        members: dict[tuple[str, str] | None, list[HostRow]] = {None: []}
        for x in rows:
            members[None].append(x)
            for label in x.labels.items():
                members.setdefault(label, []).append(x)
        sums: dict[tuple[str, str] | None, FleetTotals] = {}
        for key, xs in members.items():
            if xs:
                sums[key] = FleetTotals()
                sums[key].add_all((x.capacity, x.held) for x in xs)
        return sums

    def _count_resources(self, x: HostRow, step: int) -> None:
        for r in x.capacity.effective:
            n = self._resource_hosts.get(r, 0) + step
            if n:
                self._resource_hosts[r] = n
            else:
                del self._resource_hosts[r]

    def _account(self, old: HostRow | None, new: HostRow | None) -> None:
        for x, adding in ((old, False), (new, True)):
            if x is None:
                continue
            self._count_resources(x, 1 if adding else -1)
            for key in [None, *x.labels.items()]:
                sums = self._sums.get(key)
                if sums is None:
                    sums = self._sums[key] = FleetTotals()
                if adding:
                    sums.add(x.capacity, x.held)
                else:
                    sums.remove(x.capacity, x.held)
                    if not sums.hosts:
                        del self._sums[key]

    def _changed(self, names: Iterable[str]) -> None:
        self._version += 1
        self._sorted = None
        self._totals.clear()
        for n in names:
            if n in self._rows:
                self.changed_at[n] = self._version
            else:
                self.changed_at.pop(n, None)

    def followed(self, kind: str, position: int) -> None:
        """Every event of `kind` up to `position` is applied."""
        if kind == "Hypervisor":  # the only kind whose position is kept: no lock for the others
            with self.lock:
                self._hosts_followed(position)

    def _hosts_followed(self, position: int) -> None:
        self.hosts_through = max(self.hosts_through, position)

    def hosts_snapshot(self) -> tuple[list[Hypervisor], int] | None:
        """The hosts as followed, and a revision up to which every Hypervisor
        event is in them (None before the first load): the fleet index's first
        build reads them instead of listing and decoding the fleet again."""
        if not self.loaded.is_set():
            return None
        with self.lock:
            return list(self.hosts.values()), self.hosts_through

    def take_touched(self) -> set[str]:
        """The hosts whose figures changed (or that went) since the last call
        (for the history)."""
        with self.lock:
            self._settle()
            out, self.touched = self.touched, set()
        return out

    def take_noted(self) -> set[str]:
        """The hosts an event touched since the last take, their rows not
        computed (for a replica that does not keep the history now: whom to
        sample should it take over). Rows changed meanwhile count too."""
        with self.lock:
            out, self.touched = self.touched | self._pending, set()
        return out

    def fresh(self) -> set[str]:
        """Judge again, if the last pass is older than refresh_seconds, the rows
        the clock alone moved: the hosts whose next moment (`_next_move`) has
        come and those whose agent's liveness changed; the hosts whose row
        changed. An idle fleet costs one read of the agents' liveness a pass."""
        if time.monotonic() - self._refreshed <= self.refresh_seconds:
            return set()
        now = datetime.now(UTC)
        liveness = self.store.agent_liveness(now)
        with self.lock:
            # The rows events left pending are not computed here: whoever reads
            # the rows does that (`_settle`), at that moment's time. (Only when no
            # page follows are any pending: an open page has them computed at once.)
            self._refreshed = time.monotonic()
            due = {n for n in liveness.keys() | self._liveness.keys()
                   if liveness.get(n) != self._liveness.get(n)}
            self._liveness = liveness
            at = now.timestamp()
            while self._clock and self._clock[0][0] < at:
                when, n = heapq.heappop(self._clock)
                if self._due.get(n) == when:
                    del self._due[n]
                    due.add(n)
            due = {n for n in due if (n in self._hosts or n in self._undecoded) and n not in self._pending}
            if not due:
                return set()
            by_host: dict[str, list[Reservation]] = {}
            for r in self.reservations.values():
                if r.spec.hypervisor in due:
                    by_host.setdefault(r.spec.hypervisor, []).append(r)
            due_hosts = {n: h for n in due if (h := self._host(n)) is not None}
            rows = _judged(now, due_hosts, self._rows, by_host, self.policy_list(), liveness, False)
            changed: set[str] = set()
            for n, x in rows.items():
                old = self._rows.get(n)
                # A row whose readiness message alone moved (a stale heartbeat's
                # age) is kept for the next page that asks, but is not a change.
                if old is None or not shown_alike(old, x):
                    changed.add(n)
                    if not same_figures(old, x):
                        self.touched.add(n)
                    self._account(old, x)
                self._rows[n] = x
                self._schedule(n, by_host.get(n, ()), now)
            self._sorted = None
            if changed:
                self._changed(changed)
            return changed

    def current(self, rows: list[HostRow]) -> list[HostRow]:
        """`rows` with their readiness judged at this moment, for a page: a
        stale heartbeat's age moves every second, and the passes judge a row
        again only when its state may change."""
        now = datetime.now(UTC)
        with self.lock:
            pairs = [(x, self._host(x.name)) for x in rows]
            liveness = self._liveness
        return [x if h is None else with_readiness(x, h, now, liveness.get(x.name)) for x, h in pairs]

    # -- applying watch events ---------------------------------------------------------------------

    def apply(self, events: list[WatchEvent]) -> set[str]:
        """Apply events (idempotent for ones already loaded); the hosts touched.
        Their rows are computed now when a page follows them, else when
        something next reads the rows."""
        with self.lock:
            return self._apply(events)

    def try_apply(self, events: list[WatchEvent]) -> set[str] | None:
        """`apply` if that is quick, i.e. leaves the rows pending (no page
        follows, no policy among the events) and the lock is free now; None
        otherwise (then `apply` it on a worker thread). For the event loop."""
        return self._quick(events, None)

    def apply_here(self, kind: str, events: list[WatchEvent]) -> bool:
        """`try_apply` one revision's events of `kind` on the fan-out's thread
        as they arrive (`Subscription` `direct`): True when applied, then with
        nobody to tell (no page follows) and the revision followed if it is
        complete; False to have them queued for the loop as usual. A followed
        host write then costs no wake-up of the event loop for the dashboard.
        It never waits for the lock: the fan-out's thread serves every watch."""
        return self._quick(events, kind) is not None

    def _quick(self, events: list[WatchEvent], kind: str | None) -> set[str] | None:
        if any(e.kind == "OvercommitPolicy" for e in events):
            return None
        if not self.lock.acquire(blocking=False):
            return None
        try:
            # Asked under the lock: a page listens before it reads the rows
            # (under the lock), so either it is seen here and told by `notify`,
            # or it reads after these events are in.
            if self._listeners:
                return None
            touched = self._apply(events)
            if kind == "Hypervisor" and events[-1].last_of_revision:
                self._hosts_followed(events[-1].revision)
            return touched
        finally:
            self.lock.release()

    def _apply(self, events: list[WatchEvent]) -> set[str]:
        touched: set[str] = set()
        policy_changed = False
        for e in events:
            if e.kind == "Hypervisor":
                name = e.name
                known = self._host_revision(name)
                if known is not None and e.type != "DELETED" and known >= e.revision:
                    continue
                stored = e.stored
                if stored is not None and not e.decoded:
                    self._apply_undecoded(e, stored.raw)
                else:
                    obj = e.object
                    assert isinstance(obj, Hypervisor)
                    before = self._host(name)
                    self._undecoded.pop(name, None)
                    _apply_one(self._hosts, e, obj)
                    if e.type == "DELETED" or stored is None:
                        self._stored.pop(name, None)
                    else:
                        self._stored[name] = stored.raw
                    fields = _changed_fields(before, obj) if e.type != "DELETED" else []
                    self._note(name, _change(e, obj, fields))
                touched.add(name)
                self.revision = max(self.revision, e.revision)
                continue
            obj = e.object
            if isinstance(obj, Reservation):
                host = obj.spec.hypervisor
                _apply_one(self.reservations, e, obj)
                self._note(host, _change(e, obj, [f"phase={obj.status.phase}"]))
                touched.add(host)
            elif isinstance(obj, OvercommitPolicy):
                _apply_one(self.policies, e, obj)
                policy_changed = True
            self.revision = max(self.revision, e.revision)
        if policy_changed:  # any host's ratios may have moved
            touched |= self._recompute_all(force=True)
        elif touched:
            self._pending |= touched
            if self._listeners:
                self._settle()
        return touched

    def _apply_undecoded(self, e: WatchEvent, raw: bytes) -> None:
        """A Hypervisor event the store vouched for, applied without a decode:
        the host stands as the event until read; its change is told from the
        stored JSON, against the host's last stored JSON (decoded, or dumped
        once, when it came another way)."""
        name = e.name
        after = json.loads(raw)
        fields: list[str] = []
        if e.type != "DELETED":
            last = self._stored.get(name)
            if last is not None:
                before: dict[str, Any] | None = json.loads(last)
            else:
                h = self._hosts.get(name) if name not in self._undecoded else None
                before = None if h is None else h.to_dict()
            fields = _changed_fields_stored(before, after)
        self._note(name, Change(datetime.now(UTC).isoformat(timespec="seconds"), e.type, "Hypervisor", name,
                                str(e.revision), _last_writer_stored(after), fields))
        if e.type == "DELETED":
            self._hosts.pop(name, None)
            self._undecoded.pop(name, None)
            self._stored.pop(name, None)
        else:
            self._undecoded[name] = e
            self._stored[name] = raw

    def _note(self, host: str, change: Change) -> None:
        ring = self.recent.get(host)
        if ring is None:
            ring = self.recent[host] = deque(maxlen=self.limits.recent_changes)
        ring.appendleft(change)

    # -- reading ------------------------------------------------------------------------------------

    def sorted_rows(self) -> list[HostRow]:
        with self.lock:
            self._settle()
            if self._sorted is None:
                self._sorted = [self._rows[n] for n in sorted(self._rows)]
            return self._sorted

    def label_values(self, limit: int) -> dict[str, list[str]]:
        """Every label key that has at most `limit` values among all hosts, with
        its values, sorted: from the running sums, without a pass over the hosts."""
        with self.lock:
            self._settle()
            labels = [k for k in self._sums if k is not None]
        by: dict[str, list[str]] = {}
        for key, value in labels:
            by.setdefault(key, []).append(value)
        return {k: sorted(vs) for k, vs in sorted(by.items()) if len(vs) <= limit}

    def resource_names(self) -> list[ResourceName]:
        """`views.resource_names` of every host (cpu and memory always, then every
        resource some host has effective capacity of), without a pass over the hosts."""
        with self.lock:
            self._settle()
            found = list(self._resource_hosts)
        return sorted({*found, CPU, MEMORY}, key=resource_order)

    def select(self, selector: Selector) -> list[HostRow]:
        rows = self.sorted_rows()
        if not selector.requirements:
            return rows
        return [x for x in rows if selector.matches(x.labels)]

    def totals_for(self, selector: Selector, rows: list[HostRow],
                   label: tuple[str, str] | None = None) -> dict[str, Any]:
        """Totals of `rows` (the hosts `selector` matches, within the label value
        `label` if given): from the running sums without a selector, else added
        up once per version of the fleet."""
        with self.lock:
            self._settle()
            key = (self._version, f"{selector}|{label}")
            got = self._totals.get(key)
            if got is None and not selector.requirements:
                sums = self._sums.get(label)
                got = totals_document(sums if sums is not None else FleetTotals())
                self._totals[key] = got
        if got is None:
            got = totals_document(totals_of(rows))
            with self.lock:
                self._totals[key] = got
        return got

    def changed_since(self, version: int) -> set[str]:
        """The hosts whose row changed after `version` (every host for a
        version this state never had, e.g. one from before a restart)."""
        with self.lock:
            self._settle()
            if version > self._version:
                return set(self._rows)
            return {n for n, v in self.changed_at.items() if v > version}

    def owners_of(self, name: str) -> dict[str, str]:
        with self.lock:
            h = self._host(name)
        if h is None:
            return {}
        return {".".join(p): m for p, m in owners(h).items()}

    # -- telling the pages -------------------------------------------------------------------------

    def listen(self) -> asyncio.Queue[set[str]]:
        q: asyncio.Queue[set[str]] = asyncio.Queue(maxsize=64)
        self._listeners.add(q)
        return q

    def unlisten(self, q: asyncio.Queue[set[str]]) -> None:
        self._listeners.discard(q)

    def notify(self, names: set[str]) -> None:
        for q in list(self._listeners):
            if q.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()  # a slow page gets "everything changed" (the empty set)
                names = set()
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(set(names))


def _judged(now: datetime, hosts: dict[str, Hypervisor], rows: dict[str, HostRow],
            by_host: dict[str, list[Reservation]], policies: list[OvercommitPolicy],
            liveness: dict[str, bool], force: bool) -> dict[str, HostRow]:
    """Every host's row at `now`: computed again where it or its reservations
    may have moved (or with `force`), else only its readiness judged again."""
    out = {}
    for n, h in hosts.items():
        old, live = rows.get(n), liveness.get(n)
        if not force and old is not None and n not in by_host and old.version == h.metadata.resource_version:
            out[n] = with_readiness(old, h, now, live)  # only the clock moved
        else:
            out[n] = host_row(h, by_host.get(n, []), now, live, policies)
    return out


def _next_move(h: Hypervisor, reservations: Iterable[Reservation], now: datetime) -> float | None:
    """The next moment (epoch seconds) at which the clock alone changes the
    host's row, None if never: its heartbeat turning stale (a live lease is a
    change of liveness, seen at each pass), a reservation expiring."""
    times = [t for t in (fresh_until(h), *(r.spec.expires_at for r in reservations))
             if t is not None and t >= now]
    if not times:
        return None
    try:
        return min(times).timestamp()
    except (OverflowError, ValueError):  # a time near the end of time: never
        return None


@dataclass
class Follower:
    """The tasks that keep a FleetState current from the hub (one per kind)."""

    state: FleetState
    hub: Any  # hvfleet.server.watch.WatchHub
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self) -> None:
        """Start following; the first load runs in the background (pages wait for
        `state.loaded`), so the server answers the API at once however big the fleet."""
        self.tasks.append(asyncio.create_task(self._run()))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        kinds = ("Hypervisor", "Reservation", "OvercommitPolicy")
        # The fan-outs start before the list: what is written between the list
        # and the subscriptions (a token issued, a history point) is in their
        # kept events and replayed, not answered by listing the fleet again.
        for kind in kinds:
            self.hub.fanout(kind)
        while True:
            try:
                since = await loop.run_in_executor(None, self.state.load)
                break
            except HvfleetError:
                await asyncio.sleep(1.0)  # the store is unavailable: try again
        # The fleet just read lives as long as the server (10,000 hosts and
        # their rows: millions of objects): out of the cyclic collector's sight,
        # so that its full passes, triggered by allocation anywhere, stop
        # walking it (a second of CPU each at 10k hosts). Freed as usual when
        # no longer referenced; only a reference cycle among them would stay.
        gc.freeze()
        followers = [asyncio.create_task(self._follow(kind, since)) for kind in kinds]
        self.tasks += [*followers, asyncio.create_task(self._tick())]

    async def _follow(self, kind: str, since: int) -> None:
        loop = asyncio.get_running_loop()
        while True:
            fanout = self.hub.fanout(kind)
            # While no page follows, the fan-out's thread applies the events
            # itself (`apply_here`); they come here only when that is not quick.
            sub, replay, catch_up = fanout.subscribe(
                since, None, 10_000, loop, direct=functools.partial(self.state.apply_here, kind))
            try:
                if catch_up is not None:
                    since = await loop.run_in_executor(None, self.state.load)
                    self.state.notify(set())
                elif replay:
                    self.state.notify(self.state.apply(replay))
                sub.done()
                while not (sub.overflowed or sub.expired):
                    events, position = await sub.next_batch(5.0)
                    if events:
                        # On the loop when that is quick (no page open: rows left
                        # pending), not a hop to a worker thread and back per batch.
                        touched = self.state.try_apply(events)
                        if touched is None:
                            touched = await loop.run_in_executor(None, self.state.apply, events)
                        sub.done()
                        since = events[-1].revision
                        self.state.notify(touched)
                    if not (sub.overflowed or sub.expired):
                        self.state.followed(kind, position)
            finally:
                fanout.unsubscribe(sub)
            # Lost events (a full queue or a compacted store): start again from a list.
            since = await loop.run_in_executor(None, self.state.load)
            self.state.notify(set())

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.state.refresh_seconds)
            changed = await loop.run_in_executor(None, self.state.fresh)
            if changed:
                self.state.notify(changed)

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
