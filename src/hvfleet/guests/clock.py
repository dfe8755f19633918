"""Clock offset and timers.

Windows keeps the RTC in local time; everything else in UTC (the policy's
`clock_offset_windows` / `clock_offset`). The policy's timers: the RTC
catches up after the guest was descheduled and the PIT delays ticks instead
of bunching them (both avoid time drift under load); the HPET is off because
it is unneeded and costly to emulate. Windows gets the Hyper-V reference
clock (hypervclock) when its Hyper-V timers are enabled.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvfleet.guests.decision import Decision
from hvfleet.guests.osinfo import OSInfo
from hvfleet.guests.policy import Policy


@dataclass(frozen=True)
class Clock:
    offset: str
    hypervclock: bool
    timers: tuple[tuple[str, str, str], ...] = ()  # (name, attribute, value)


def _timer_text(t: tuple[str, str, str]) -> str:
    name, attr, value = t
    return f"{name} off" if (attr, value) == ("present", "no") else f"{name} {value}"


def decide_clock(os: OSInfo, hyperv: frozenset[str], policy: Policy) -> Decision[Clock]:
    offset = policy.clock_offset_windows if os.is_windows else policy.clock_offset
    hvclock = os.is_windows and policy.hypervclock_with_stimer and "stimer" in hyperv
    timers = ", ".join(_timer_text(t) for t in policy.timers) + (", hypervclock" if hvclock else "")
    return Decision(
        "clock",
        Clock(offset, hvclock, policy.timers),
        f"{offset}; {timers}",
        ("Windows expects the RTC in local time" if os.is_windows else "the RTC in UTC")
        + "; timers that avoid drift, no HPET"
        + ("; hypervclock backs the stimer enlightenment" if hvclock else ""),
        (f"osinfo {os.short_id}: family {os.family or '?'}",),
    )
