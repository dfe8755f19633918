"""The dashboard's capacity history, kept in the store (model.dashboard.HistorySeries)
so that it survives a restart and every replica over one store serves the
same one: for the fleet, each label value (labels with at most
`MAX_LABEL_VALUES` values, as the overview groups them) and each host, per
resource what is allocated, what reservations hold and the effective
capacity.

A series is kept per tier (resolution and window: 10 s for an hour, 1 min
for a day, 10 min for a week by default, all cut at the retention) as change
points: a point holds until the next, so a host whose figures did not change
costs no write, and a heartbeat that changes nothing is not history. One
replica at a time keeps the history (`SamplerTurn`: a record the servers
over the store share, taken by compare-and-swap and renewed at every
sample; another replica takes it over once it went `ttl` without renewal,
or at once when its holder stops cleanly). It samples its live picture
(live.FleetState) at every tier's bucket boundary and appends a point only
when the figures differ from the series' last point and that bucket has no
point yet, by compare-and-swap, so a replica taking over never writes a
bucket twice. The others only note which hosts changed, to sample them if
they take over: following a write costs them no row and no store read.

A series is stored in parts (model.dashboard): its own object holds its
latest `PART_POINTS` points at most and, once full, moves them to a part of
their own, written once; parts wholly before the tier's window are deleted.
So a point costs one small write whatever the series' age (the whole series
of a day at 1 min, 1,440 points, was read and written for each before), and
a chart reads the parts its range covers.

A host whose figures changed while no replica ran shows the change at its
next one (a start does not read 10,000 series to compare).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hvfleet.model.dashboard import HistoryPart, HistoryPoint, HistorySeries, HistorySeriesSpec
from hvfleet.model.durations import parse_duration
from hvfleet.model.errors import AlreadyExists, HvfleetError, InvalidInput, NotFound
from hvfleet.model.meta import ObjectMeta
from hvfleet.model.quantity import Quantity
from hvfleet.model.readable import human
from hvfleet.model.resources import ResourceName
from hvfleet.model.selectors import Selector
from hvfleet.server.dashboard.feed import HostRow
from hvfleet.store.base import StaleVersion, Store

log = logging.getLogger(__name__)

KIND = "HistorySeries"
MANAGER = "hvfleet-serve/dashboard"
# The shared record (Store.server_secret) naming the replica that keeps the history.
SAMPLER = "dashboard-history-sampler"
SAMPLER_TTL_S = 30.0
FLEET = "fleet"
MAX_LABEL_VALUES = 50
# The views a page offers, and how far back each reaches.
RANGES: dict[str, int] = {"hour": 3600, "day": 86_400, "week": 7 * 86_400}
DEFAULT_TIERS = "10s:1h,1m:1d,10m:7d"
DEFAULT_RETENTION = "7d"
# Points the series' own object holds before it moves them to a part.
PART_POINTS = 60
# Per resource: [allocated, held by reservations, effective capacity].
Figures = dict[str, list[str]]


@dataclass(frozen=True)
class Tier:
    name: str  # its resolution as written: "10s"
    step: int  # seconds per bucket
    window: int  # seconds of points kept


@dataclass(frozen=True)
class HistorySettings:
    tiers: tuple[Tier, ...]
    retention: int

    @classmethod
    def parse(cls, tiers: str = DEFAULT_TIERS, retention: str = DEFAULT_RETENTION) -> HistorySettings:
        """`tiers` as RESOLUTION:WINDOW,... (finest first), `retention` a
        duration that cuts every window; InvalidInput naming the option."""
        keep = _seconds(retention, "history-retention")
        out: list[Tier] = []
        for part in (p.strip() for p in tiers.split(",") if p.strip()):
            step_text, sep, window_text = part.partition(":")
            if not sep:
                raise InvalidInput(f"{part!r}: expected RESOLUTION:WINDOW, e.g. 10s:1h",
                                   field="history-tiers")
            step = _seconds(step_text, "history-tiers")
            window = min(_seconds(window_text, "history-tiers"), keep)
            if window < step:
                raise InvalidInput(f"{part!r}: the window is shorter than the resolution (after the "
                                   f"retention of {retention})", field="history-tiers")
            if out and step <= out[-1].step:
                raise InvalidInput(f"{part!r}: list the tiers from the finest resolution to the coarsest",
                                   field="history-tiers")
            if window // step > 100_000:
                raise InvalidInput(f"{part!r}: more than 100,000 points per series", field="history-tiers")
            out.append(Tier(step_text.strip().lower(), step, window))
        if not out:
            raise InvalidInput("give at least one RESOLUTION:WINDOW", field="history-tiers")
        return cls(tuple(out), keep)

    def tier_for(self, seconds: int) -> Tier:
        """The finest tier whose window covers `seconds` back (else the coarsest)."""
        return next((t for t in self.tiers if t.window >= seconds), self.tiers[-1])


def _seconds(text: str, option: str) -> int:
    value = int(parse_duration(text.strip(), field=option, positive=True).total_seconds())
    if value < 1:
        raise InvalidInput(f"{text!r}: at least one second", field=option)
    return value


# -- series and their points (pure) --------------------------------------------------------------

def object_name(series: str, tier: str) -> str:
    """The stored object of one series in one tier (a label value or a host name
    may not fit a name as it is)."""
    return f"hs-{hashlib.sha256(series.encode()).hexdigest()[:24]}-{tier}"


def label_series(key: str, value: str) -> str:
    return f"label:{key}={value}"


def host_series(name: str) -> str:
    return f"host:{name}"


def host_figures(row: HostRow) -> Figures:
    c = row.capacity
    zero = Quantity(0)
    return {str(r): [str(c.allocation.get(r, zero)), str(row.held.get(r, zero)),
                     str(c.effective.get(r, zero))]
            for r in sorted(set(c.effective) | set(c.allocation), key=str)}


def totals_figures(doc: Mapping[str, Any]) -> Figures:
    """The figures of a totals document (live.FleetState.totals_for)."""
    return {r: [x.get("allocation") or "0", x.get("held") or "0", x.get("effective") or "0"]
            for r, x in sorted(doc["resources"].items())}


def part_name(series_object: str, first: int) -> str:
    """The stored object of a series' part whose first point is at `first`."""
    return f"{series_object}-{first}"


@dataclass(frozen=True)
class Appending:
    """What appending a point writes (`appending`): the series object's new
    spec; when it was full, its points before as a part of their own (to be
    written before it); the parts (by their first point's time) that fell
    wholly before the window (to be deleted after it)."""

    head: HistorySeriesSpec
    moved: HistorySeriesSpec | None = None
    dropped: tuple[int, ...] = ()


def appending(current: HistorySeriesSpec | None, series: str, tier: Tier, point: HistoryPoint,
              part_points: int = PART_POINTS) -> Appending | None:
    """What appending `point` to the series (its object's spec `current`, None
    when it has none yet) writes, or None when nothing is to be written: its
    bucket (or a later one) has a point already, or the figures did not
    change. A full object's points move to a part, and it keeps the last of
    them as its `lead`; parts whose last point is at or before the window's
    start are dropped (the next part's lead, or the object's, is the value in
    force then)."""
    if current is None:
        return Appending(HistorySeriesSpec(series=series, tier=tier.name, points=[point]))
    last = current.last
    if last is not None and (last.t >= point.t or last.v == point.v):
        return None
    if len(current.points) < part_points:
        return Appending(current.model_copy(update={"points": [*current.points, point]}))
    cutoff = point.t - tier.window
    moved = HistorySeriesSpec(series=series, tier=tier.name, points=current.points, lead=current.lead)
    parts = [*current.parts, HistoryPart(first=current.points[0].t, last=current.points[-1].t)]
    kept = [p for p in parts if p.last > cutoff]
    head = HistorySeriesSpec(series=series, tier=tier.name, points=[point], lead=current.points[-1],
                             parts=kept)
    # The moved points may themselves be wholly before the window (a series idle that long).
    return Appending(head, moved if parts[-1].last > cutoff else None,
                     tuple(p.first for p in current.parts if p.last <= cutoff))


def assembled(head: HistorySeriesSpec, parts: list[HistorySeriesSpec]) -> list[HistoryPoint]:
    """A series' points from its object and the parts read of it (a run of
    its latest parts, oldest first), led by the point in force before them."""
    lead = parts[0].lead if parts else head.lead
    out = [lead] if lead is not None else []
    for part in parts:
        out.extend(part.points)
    out.extend(head.points)
    return out


def stored_series(series: str, tier: Tier, points: list[HistoryPoint],
                  part_points: int = PART_POINTS) -> list[HistorySeries]:
    """The objects `write_point` leaves after writing `points` one by one (the
    series' own object first, then its parts kept), made in memory: to seed
    a store with a history in one write per object."""
    head: HistorySeriesSpec | None = None
    parts: dict[int, HistorySeriesSpec] = {}
    for point in points:
        step = appending(head, series, tier, point, part_points)
        if step is None:
            continue
        if step.moved is not None:
            parts[step.moved.points[0].t] = step.moved
        for first in step.dropped:
            parts.pop(first, None)
        head = step.head
    if head is None:
        return []
    name = object_name(series, tier.name)
    return [HistorySeries(metadata=ObjectMeta(name=name), spec=head),
            *(HistorySeries(metadata=ObjectMeta(name=part_name(name, p.first)), spec=parts[p.first])
              for p in head.parts)]


def in_window(points: list[HistoryPoint], start: int) -> list[HistoryPoint]:
    """The points from `start` on, led by the one in force at `start` (moved to it)."""
    before = [p for p in points if p.t <= start]
    after = [p for p in points if p.t > start]
    lead = [before[-1].model_copy(update={"t": start})] if before else []
    return lead + after


def chart_document(series: str, range_name: str, tier: Tier, points: list[HistoryPoint],
                   now: int) -> dict[str, Any]:
    """A series over one range as pages draw it: per resource the three lines
    as numbers (for the chart's geometry) and as the core's human strings (for
    its text and data table), and the time of every point."""
    start = now - RANGES[range_name]
    shown = in_window(points, start)
    resources = sorted({r for p in shown for r in p.v}, key=lambda r: (r not in ("cpu", "memory"), r))
    out: dict[str, Any] = {"series": series, "range": range_name, "resolution": tier.name,
                           "start": start, "end": now, "t": [p.t for p in shown], "resources": {}}
    for r in resources:
        name = ResourceName.parse(r, where="resource")
        lines: dict[str, Any] = {}
        for i, key in enumerate(("allocated", "held", "effective")):
            qs = [Quantity.parse(p.v[r][i]) if r in p.v else None for p in shown]
            lines[key] = {"values": [float(q.value) if q is not None else None for q in qs],
                          "text": [human(name, q) if q is not None else "-" for q in qs]}
        out["resources"][r] = {"unit": "bytes" if name.counts_bytes else "count", **lines}
    return out


# -- reading and writing them -----------------------------------------------------------------

def parse_series(text: str) -> tuple[str, str | None]:
    """A feed's `series` argument: ("fleet" | "label" | "host", the host's name
    for a host); InvalidInput naming `series` otherwise."""
    if text == FLEET:
        return FLEET, None
    what, sep, rest = text.partition(":")
    if sep and rest and what == "host":
        return "host", rest
    if sep and what == "label" and "=" in rest and rest.split("=", 1)[0]:
        return "label", None
    raise InvalidInput(f"{text!r}: expected fleet, label:KEY=VALUE or host:NAME", field="series")


def _series_object(store: Store, name: str) -> HistorySeries | None:
    try:
        obj = store.get(KIND, name)
    except NotFound:
        return None
    assert isinstance(obj, HistorySeries)
    return obj


def read_points(store: Store, series: str, tier: Tier, since: int | None = None) -> list[HistoryPoint]:
    """The series' points, or (`since` given) those after `since` led by the
    one in force then: only the parts that reach past `since` are read."""
    name = object_name(series, tier.name)
    head = _series_object(store, name)
    if head is None:
        return []
    parts = []
    for part in head.spec.parts:
        if since is not None and part.last <= since:
            continue
        got = _series_object(store, part_name(name, part.first))
        if got is not None:  # else dropped since the series was read: it was before the window
            parts.append(got.spec)
    return assembled(head.spec, parts)


def last_figures(store: Store, series: str, tier: Tier) -> Figures | None:
    """The figures of the series' last point (read from its own object only)."""
    head = _series_object(store, object_name(series, tier.name))
    if head is None:
        return None
    last = head.spec.last
    return last.v if last is not None else None


def write_point(store: Store, series: str, tier: Tier, point: HistoryPoint, attempts: int = 5,
                part_points: int = PART_POINTS) -> bool:
    """Append `point` to the series by compare-and-swap of its own object; whether
    it was written (False: that bucket was written already, maybe by another
    replica, or the figures are the last point's). A part is written before the
    object that lists it (the same points, whoever writes it), and dropped parts
    are deleted after, so a reader never misses a listed part it needs."""
    name = object_name(series, tier.name)
    for attempt in range(attempts):
        current = _series_object(store, name)
        step = appending(current.spec if current else None, series, tier, point, part_points)
        if step is None:
            return False
        try:
            if step.moved is not None:
                _put_part(store, part_name(name, step.moved.points[0].t), step.moved)
            if current is None:
                store.create(HistorySeries(metadata=ObjectMeta(name=name), spec=step.head), MANAGER)
            else:
                store.update(current.model_copy(update={"spec": step.head}), MANAGER)
        except (StaleVersion, AlreadyExists):
            store.pause_after_conflict(attempt)  # another replica wrote it: look again
            continue
        for first in step.dropped:
            _delete(store, part_name(name, first))
        return True
    return False


def _put_part(store: Store, name: str, spec: HistorySeriesSpec) -> None:
    try:
        store.create(HistorySeries(metadata=ObjectMeta(name=name), spec=spec), MANAGER)
    except AlreadyExists:  # an attempt (here or on another replica) wrote it and lost the object's CAS
        got = _series_object(store, name)
        if got is not None and got.spec != spec:
            store.update(got.model_copy(update={"spec": spec}), MANAGER)


def _delete(store: Store, name: str) -> None:
    with contextlib.suppress(NotFound):
        store.delete(KIND, name)


def forget(store: Store, series: str, tiers: tuple[Tier, ...]) -> None:
    """Delete a series in every tier, parts and all (its host is gone)."""
    for tier in tiers:
        name = object_name(series, tier.name)
        head = _series_object(store, name)
        if head is None:
            continue
        for part in head.spec.parts:
            _delete(store, part_name(name, part.first))
        _delete(store, name)


@dataclass
class SamplerTurn:
    """Whether this replica keeps the history now: the shared record names the
    replica that does and until when; it is taken (when free or lapsed) and
    renewed by compare-and-swap, so two replicas never both hold it."""

    store: Store
    ttl: float = SAMPLER_TTL_S
    me: str = field(default_factory=lambda: uuid.uuid4().hex)

    def hold(self, now: float) -> bool:
        """Take or renew the turn at `now` (seconds since the epoch); whether this replica has it."""
        try:
            got = self.store.server_secret(SAMPLER)
        except NotImplementedError:
            return True  # a store with no shared records: each replica samples (the CAS writes once)
        replaces: int | None = None
        if got is not None:
            value, replaces = got
            try:
                record = json.loads(value)
                holder, until = str(record["holder"]), float(record["until"])
            except (ValueError, KeyError, TypeError):
                holder, until = "", 0.0
            if holder != self.me and until > now:
                return False
        mine = json.dumps({"holder": self.me, "until": now + self.ttl}).encode()
        return self.store.put_server_secret(SAMPLER, mine, replaces)

    def release(self) -> None:
        """Give the turn up (a clean stop): another replica takes it at its next sample."""
        try:
            got = self.store.server_secret(SAMPLER)
        except NotImplementedError:
            return
        if got is not None and json.loads(got[0]).get("holder") == self.me:
            self.store.put_server_secret(SAMPLER, json.dumps({"holder": "", "until": 0}).encode(), got[1])


@dataclass
class HistoryKeeper:
    """Samples one replica's live picture into the store, tier by tier, while
    this replica has the turn (`turn` None: always)."""

    store: Store
    settings: HistorySettings
    turn: SamplerTurn | None = None
    holding: bool | None = None  # None until the first sample
    # The figures each (series, tier) last had in the store, as far as this replica knows.
    last: dict[tuple[str, str], Figures] = field(default_factory=dict)
    # Hosts whose row changed since each tier's last sample.
    dirty: dict[str, set[str]] = field(default_factory=dict)
    buckets: dict[str, int] = field(default_factory=dict)
    writes: int = 0

    def touched(self, hosts: set[str]) -> None:
        for tier in self.settings.tiers:
            self.dirty.setdefault(tier.name, set()).update(hosts)

    def holds(self, now: float) -> bool:
        """Whether this replica keeps the history at `now` (taking the turn if free)."""
        held = self.turn is None or self.turn.hold(now)
        if held and self.holding is False:
            # Taken over: another replica wrote meanwhile, so what this one last
            # knew of the store is no guide (each series is read again once).
            self.last.clear()
        self.holding = held
        return held

    def due(self, now: float) -> list[Tier]:
        """The tiers whose bucket moved on since their last sample."""
        out = []
        for tier in self.settings.tiers:
            bucket = int(now) // tier.step * tier.step
            if self.buckets.get(tier.name) != bucket:
                out.append(tier)
        return out

    def sample(self, tier: Tier, now: float, groups: Mapping[str, Figures],
               rows: Mapping[str, HostRow]) -> int:
        """Write tier `tier`'s bucket at `now`: the fleet and label series in
        `groups`, and every host touched since the tier's last sample (a host
        gone from `rows` loses its series). Returns the points written."""
        bucket = int(now) // tier.step * tier.step
        self.buckets[tier.name] = bucket
        written = 0
        hosts = self.dirty.pop(tier.name, set())
        wanted: dict[str, Figures] = dict(groups)
        for name in sorted(hosts):
            row = rows.get(name)
            if row is None:
                if tier is self.settings.tiers[0]:
                    forget(self.store, host_series(name), self.settings.tiers)
                    for t in self.settings.tiers:
                        self.last.pop((host_series(name), t.name), None)
                continue
            wanted[host_series(name)] = host_figures(row)
        for series, figures in wanted.items():
            key = (series, tier.name)
            if self.last.get(key) == figures:
                continue
            try:
                if write_point(self.store, series, tier, HistoryPoint(t=bucket, v=figures)):
                    written += 1
                self.last[key] = figures
            except HvfleetError as exc:  # the store is unavailable: the next bucket tries again
                log.warning("history: %s (%s): %s", series, tier.name, exc)
                if series.startswith("host:"):
                    self.dirty.setdefault(tier.name, set()).add(series.removeprefix("host:"))
        self.writes += written
        return written

    def prime(self, groups: Mapping[str, Figures]) -> None:
        """After a start: what the store's fleet and label series end with, so an
        unchanged fleet writes nothing (hosts are not read: see the module)."""
        for series in groups:
            for tier in self.settings.tiers:
                figures = last_figures(self.store, series, tier)
                if figures is not None:
                    self.last[(series, tier.name)] = figures


def group_figures(state: Any) -> dict[str, Figures]:
    """The fleet's and every label value's figures from a live.FleetState."""
    out = {FLEET: totals_figures(state.totals_for(Selector(), state.sorted_rows()))}
    # From the state's running sums: sampled every second, so no pass over every host.
    for k, values in state.label_values(MAX_LABEL_VALUES).items():
        for v in values:
            out[label_series(k, v)] = totals_figures(state.totals_for(Selector(), [], (k, v)))
    return out


def sample_due(keeper: HistoryKeeper, state: Any, now: float) -> int:
    """Every tier whose bucket moved on, from the live picture as it is now,
    if this replica keeps the history; else only note the hosts that changed
    (without computing their rows), to sample them should it take over."""
    try:
        held = keeper.holds(now)
    except HvfleetError as exc:  # the store is unavailable: the next bucket tries again
        log.warning("history: cannot tell which replica keeps it: %s", exc)
        return 0
    if not held:
        keeper.touched(state.take_noted())
        return 0
    keeper.touched(state.take_touched())
    written = 0
    for tier in keeper.due(now):
        with state.lock:
            groups = group_figures(state)
            rows = dict(state.rows)
        written += keeper.sample(tier, now, groups, rows)
    return written


async def keep(keeper: HistoryKeeper, state: Any) -> None:
    """Sample at every bucket boundary of the finest tier, for ever."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, state.loaded.wait)
    state.take_touched()  # the first load: every host, unchanged as far as anyone knows

    def prime() -> None:
        with state.lock:
            groups = group_figures(state)
        keeper.prime(groups)

    while True:
        try:
            await loop.run_in_executor(None, prime)
            break
        except HvfleetError as exc:
            log.warning("history: cannot read the store yet: %s", exc)
            await asyncio.sleep(1.0)
    step = keeper.settings.tiers[0].step
    while True:
        try:
            await loop.run_in_executor(None, sample_due, keeper, state, time.time())
        except Exception:  # one bad sample must not end the history: the next bucket tries again
            log.exception("history: sampling failed")
        await asyncio.sleep(step - time.time() % step + 0.01)
