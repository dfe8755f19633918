"""Readiness: the one judgement of whether a hypervisor's numbers can be trusted
and it may take new guests, used by every reader (`get`, `capacity`,
`describe`, fit and claims, the fleet index, the agent's summary, the API).

`readiness(h, now, lease_live, staleness)` weighs, in this order (the first
that applies decides the state):

| state | when | reason |
|---|---|---|
| Maintenance (stale) | `spec.maintenance` is set and the agent's liveness lease expired | `Maintenance` |
| NotReady | the store says the agent's liveness lease expired (`lease_live is False`) | `AgentLeaseExpired` |
| Unknown | there is no `Ready` condition (no agent has reported yet) | `NoReadyCondition` |
| Unknown | `Ready` is `Unknown` | the condition's reason, else `ReadyUnknown` |
| NotReady | `Ready` is `False` | the condition's reason, else `ReadyFalse` |
| Maintenance (stale) | `spec.maintenance` is set, no live lease, no or an old heartbeat | `Maintenance` |
| Stale | no live lease, and no `lastHeartbeatTime` | `NoHeartbeat` |
| Stale | no live lease, and `lastHeartbeatTime` older than `staleness` | `HeartbeatStale` |
| Maintenance | healthy, but `spec.maintenance` is set | `Maintenance` |
| Ready | otherwise | the condition's reason, else `Ready` |

An expired lease comes first: the stored status is then the dead agent's last
word, so a `Ready=True` and a young heartbeat prove nothing. Health comes
before maintenance because a host in maintenance whose agent is gone has
numbers nobody should read, which matters more than that it is cordoned,
with one exception: a host an operator put in maintenance is expected to
go quiet (its agent stopped for the work), so an aged heartbeat or an
expired lease keeps it Maintenance, with `stale` set and the staleness in
its message (`shown` reads `Maintenance,Stale`, as kubectl shows
`Ready,SchedulingDisabled`). A NotReady or Unknown the agent reported
while its lease lived still wins: that is news about the host, not silence.
Only `Ready` is `ready` (a scheduling candidate). `lease_live` is what the
store knows of the agent's liveness lease: True, False, or None where it has
no information (a host whose agent never held a lease, e.g. `--once` runs or a
store without leases). A live lease is the agent's heartbeat: its renewals
are more recent than any status write, so the heartbeat's age is judged only
where there is no live lease.

`host_readiness(h, lease, now, staleness)` is the same judgement with the
agent's Lease judged at `now` (`lease_live`), as the claim makes it; and
`readiness_turn` says when that judgement may next change with nothing
written (a live Lease lapsing, a heartbeat growing old), so a reader that
keeps judgements (the Placement snapshot) knows when to judge again.

The staleness default is three agent resync periods (the agent's default
resync is `DEFAULT_RESYNC`): one missed resync is no reason to distrust a host.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from hvfleet.model.hypervisor import Hypervisor
from hvfleet.model.lease import Lease, lease_expiry, lease_live
from hvfleet.model.meta import find_condition

ReadinessState = Literal["Ready", "NotReady", "Stale", "Unknown", "Maintenance"]
READINESS_STATES: tuple[ReadinessState, ...] = ("Ready", "NotReady", "Stale", "Unknown", "Maintenance")

# The node agent's default full-resync period; its heartbeat is written at least
# once per period.
DEFAULT_RESYNC = timedelta(seconds=60)
DEFAULT_STALENESS = 3 * DEFAULT_RESYNC

READY_CONDITION = "Ready"

# Reasons readiness itself gives (others come from the Ready condition).
AGENT_LEASE_EXPIRED = "AgentLeaseExpired"
NO_READY_CONDITION = "NoReadyCondition"
NO_HEARTBEAT = "NoHeartbeat"
HEARTBEAT_STALE = "HeartbeatStale"
MAINTENANCE = "Maintenance"


@dataclass(frozen=True)
class Readiness:
    """What a reader shows and decides on: `state` (one of READINESS_STATES),
    `ready` (True only for Ready), a CamelCase `reason` and a sentence."""

    state: ReadinessState
    ready: bool
    reason: str
    message: str
    # A host in maintenance whose heartbeat aged or lease expired (see above).
    stale: bool = False

    @property
    def shown(self) -> str:
        """The state as a table shows it: `Maintenance,Stale` for a stale one."""
        return f"{self.state},Stale" if self.stale else self.state

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"state": self.state, "ready": self.ready, "reason": self.reason,
                                  "message": self.message}
        if self.stale:
            out["stale"] = True
        return out


def _not(state: ReadinessState, reason: str, message: str) -> Readiness:
    return Readiness(state, False, reason, message)


def fresh_until(h: Hypervisor, staleness: timedelta = DEFAULT_STALENESS) -> datetime | None:
    """The last instant at which the host's heartbeat still counts as fresh
    (None: there is no heartbeat, so it never is)."""
    beat = h.status.last_heartbeat_time
    if beat is None:
        return None
    try:
        return beat + staleness
    except OverflowError:  # a heartbeat near the end of time (stored before the bounds)
        return datetime.max.replace(tzinfo=beat.tzinfo)


def readiness(
    h: Hypervisor,
    now: datetime | None,
    lease_live: bool | None = None,
    staleness: timedelta = DEFAULT_STALENESS,
) -> Readiness:
    """The host's readiness at `now` (rules in the module docstring).

    `now=None` leaves the heartbeat's age unjudged (a missing heartbeat still
    counts): for a reader that compares `fresh_until(h)` with the time itself
    and the lease separately, as the vectorised fleet index does, so that its
    answer is this function's."""
    silent = _silence(h, now, lease_live, staleness)
    if silent is not None and h.spec.maintenance and lease_live is False:
        return _quiet_maintenance(h, silent[1])
    if lease_live is False and silent is not None:
        return _not("NotReady", *silent)
    cond = find_condition(h.status.conditions, READY_CONDITION)
    if cond is None:
        return _not("Unknown", NO_READY_CONDITION, "no Ready condition: no agent has reported this host yet")
    detail = f": {cond.message}" if cond.message else ""
    if cond.status == "Unknown":
        return _not("Unknown", cond.reason or "ReadyUnknown", f"Ready condition is Unknown{detail}")
    if cond.status == "False":
        why = f" ({cond.reason})" if cond.reason else ""
        return _not("NotReady", cond.reason or "ReadyFalse", f"Ready condition is False{why}{detail}")
    if silent is not None:
        return _quiet_maintenance(h, silent[1]) if h.spec.maintenance else _not("Stale", *silent)
    if h.spec.maintenance:
        return _not("Maintenance", MAINTENANCE, _maintenance(h))
    return Readiness("Ready", True, cond.reason or "Ready", cond.message or "ready")


def host_readiness(
    h: Hypervisor, lease: Lease | None, now: datetime, staleness: timedelta = DEFAULT_STALENESS
) -> Readiness:
    """`readiness` at `now` with the agent's Lease (None: it never held one)
    judged at `now` too, as a claim judges it inside its write."""
    return readiness(h, now, None if lease is None else lease_live(lease, now), staleness)


def readiness_turn(
    h: Hypervisor, lease: Lease | None, now: datetime, staleness: timedelta = DEFAULT_STALENESS
) -> datetime | None:
    """The first instant after `now` at which `host_readiness` may answer
    otherwise with nothing written (the host and its Lease as they are):
    when a live Lease lapses, or, with no Lease, when the heartbeat grows
    older than `staleness`. None: only a write changes the answer (a lapsed
    or released Lease stays so until it is renewed; no heartbeat, or an old
    one, until the next)."""
    if lease is not None:
        return lease_expiry(lease) if lease_live(lease, now) else None
    fresh = fresh_until(h, staleness)
    if fresh is None or fresh < now:
        return None
    try:
        return fresh + timedelta(microseconds=1)  # stale once older than `staleness`, not at it
    except OverflowError:
        return None


def _quiet_maintenance(h: Hypervisor, staleness: str) -> Readiness:
    return Readiness("Maintenance", False, MAINTENANCE, f"{_maintenance(h)}; {staleness}", stale=True)


def _maintenance(h: Hypervisor) -> str:
    why = f" ({h.spec.maintenance_reason})" if h.spec.maintenance_reason else ""
    return f"in maintenance ({h.spec.maintenance}){why}"


def _silence(
    h: Hypervisor, now: datetime | None, lease_live: bool | None, staleness: timedelta
) -> tuple[str, str] | None:
    """(reason, message) when the agent went quiet: its lease expired, or with
    no live lease its heartbeat is missing or older than `staleness`."""
    if lease_live is False:
        return AGENT_LEASE_EXPIRED, "the agent's liveness lease expired (its last status may be stale)"
    if lease_live is True:
        return None  # the live lease is the heartbeat
    beat = h.status.last_heartbeat_time
    if beat is None:
        return NO_HEARTBEAT, "no heartbeat recorded"
    if now is not None and now - beat > staleness:  # (no `now - staleness`: it may underflow)
        age = int((now - beat).total_seconds())
        return HEARTBEAT_STALE, f"last heartbeat {age}s ago, older than {int(staleness.total_seconds())}s"
    return None
