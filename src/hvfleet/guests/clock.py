"""Clock offset and timers.

Windows keeps the RTC in local time; everything else in UTC. The RTC catches
up after the guest was descheduled and the PIT delays ticks instead of
bunching them (both avoid time drift under load); the HPET is off because it is
unneeded and costly to emulate. Windows gets the Hyper-V reference clock
(hypervclock) when its Hyper-V timers are enabled.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvfleet.guests.decision import Decision
from hvfleet.guests.osinfo import OSInfo


@dataclass(frozen=True)
class Clock:
    offset: str
    hypervclock: bool


def decide_clock(os: OSInfo, hyperv: frozenset[str]) -> Decision[Clock]:
    offset = "localtime" if os.is_windows else "utc"
    hvclock = os.is_windows and "stimer" in hyperv
    timers = "rtc catchup, pit delay, hpet off" + (", hypervclock" if hvclock else "")
    return Decision(
        "clock",
        Clock(offset, hvclock),
        f"{offset}; {timers}",
        ("Windows expects the RTC in local time" if os.is_windows else "the RTC in UTC")
        + "; timers that avoid drift, no HPET"
        + ("; hypervclock backs the stimer enlightenment" if hvclock else ""),
        (f"osinfo {os.short_id}: family {os.family or '?'}",),
    )
