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

A host whose figures changed while no replica ran shows the change at its
next one (a start does not read 10,000 series to compare).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hvfleet.model.dashboard import HistoryPoint, HistorySeries, HistorySeriesSpec
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


def appended(points: list[HistoryPoint], point: HistoryPoint, tier: Tier) -> list[HistoryPoint] | None:
    """The points after `point`, or None when nothing is to be written: its
    bucket (or a later one) has a point already, or the figures did not change.
    Points older than the tier's window go, except the newest of them: the
    value in force when the window starts."""
    if points and (points[-1].t >= point.t or points[-1].v == point.v):
        return None
    out = [*points, point]
    cutoff = point.t - tier.window
    first = 0
    while first + 1 < len(out) and out[first + 1].t <= cutoff:
        first += 1
    return out[first:]


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


def read_points(store: Store, series: str, tier: Tier) -> list[HistoryPoint]:
    try:
        obj = store.get(KIND, object_name(series, tier.name))
    except NotFound:
        return []
    assert isinstance(obj, HistorySeries)
    return obj.spec.points


def write_point(store: Store, series: str, tier: Tier, point: HistoryPoint, attempts: int = 5) -> bool:
    """Append `point` to the series by compare-and-swap; whether it was written
    (False: that bucket was written already, maybe by another replica, or the
    figures are the last point's)."""
    name = object_name(series, tier.name)
    for attempt in range(attempts):
        try:
            current = store.get(KIND, name)
        except NotFound:
            current = None
        assert current is None or isinstance(current, HistorySeries)
        points = appended(current.spec.points if current else [], point, tier)
        if points is None:
            return False
        try:
            if current is None:
                spec = HistorySeriesSpec(series=series, tier=tier.name, points=points)
                store.create(HistorySeries(metadata=ObjectMeta(name=name), spec=spec), MANAGER)
            else:
                spec = current.spec.model_copy(update={"points": points})
                store.update(current.model_copy(update={"spec": spec}), MANAGER)
            return True
        except (StaleVersion, AlreadyExists):
            store.pause_after_conflict(attempt)  # another replica wrote it: look again
    return False


def forget(store: Store, series: str, tiers: tuple[Tier, ...]) -> None:
    """Delete a series in every tier (its host is gone)."""
    for tier in tiers:
        try:
            store.delete(KIND, object_name(series, tier.name))
        except NotFound:
            continue


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
                points = read_points(self.store, series, tier)
                if points:
                    self.last[(series, tier.name)] = points[-1].v


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
