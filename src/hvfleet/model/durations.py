"""Durations: the one grammar for every length of time a user types.

Go's and Kubernetes' form (`1h30m`, `1.5m`, `90s`, `500ms`), plus days (`30d`)
and a bare number meaning seconds (`60`). Terms may carry a decimal fraction
and add up; the result is kept to the microsecond (timedelta's resolution).
`0` is zero; where a caller allows no expiry at all, `0` and `never` mean
none (`parse_expiry`). Every flag and API field that takes a duration (the
agent's resync, a reservation's ttl, fit's staleness, ...) parses it here.
"""

from __future__ import annotations

import re
from datetime import timedelta
from fractions import Fraction

from hvfleet.model.errors import InvalidInput

_MICROS = {"ms": 1000, "s": 10**6, "m": 60 * 10**6, "h": 3600 * 10**6, "d": 86400 * 10**6}
_TERM = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")
_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")
_MAX_LEN = 64
EXAMPLES = "e.g. 90s, 10m, 1h30m, 1.5m, 500ms, 30d"


def _micros(text: str, field: str) -> Fraction:
    s = text.strip()
    if len(s) > _MAX_LEN:
        raise InvalidInput(f"{s[:_MAX_LEN]!r}...: too long for a duration", field=field)
    if _NUMBER.fullmatch(s):
        return Fraction(s) * _MICROS["s"]
    pos, total = 0, Fraction(0)
    for m in _TERM.finditer(s):
        if m.start() != pos:
            break
        total += Fraction(m[1]) * _MICROS[m[2]]
        pos = m.end()
    if not s or pos != len(s):
        raise InvalidInput(f"{text!r} is not a duration ({EXAMPLES})", field=field)
    return total


def parse_duration(text: str, *, field: str, positive: bool = False) -> timedelta:
    """`text` as a timedelta (zero allowed unless `positive`)."""
    micros = round(_micros(text, field))
    if positive and micros <= 0:
        raise InvalidInput(f"{text!r} must be longer than 0 ({EXAMPLES})", field=field)
    try:
        return timedelta(microseconds=micros)
    except OverflowError:
        raise InvalidInput(f"{text!r} is longer than any date", field=field) from None


def parse_expiry(text: str, *, field: str) -> timedelta | None:
    """A lifetime: a positive duration, or None for `0`/`never` (no expiry)."""
    if text.strip() == "never":
        return None
    life = parse_duration(text, field=field)
    return None if life == timedelta(0) else life


def format_duration(d: timedelta) -> str:
    """The shortest text `parse_duration` reads back as `d` (`1d2h30m`, `1.5s`, `0`)."""
    micros = (d.days * 86400 + d.seconds) * 10**6 + d.microseconds
    if micros < 0:
        raise ValueError(f"negative duration {d}")
    if micros == 0:
        return "0"
    out = []
    for unit in ("d", "h", "m"):
        n, micros = divmod(micros, _MICROS[unit])
        if n:
            out.append(f"{n}{unit}")
    if micros:
        whole, frac = divmod(micros, 10**6)
        out.append(f"{whole}.{frac:06d}".rstrip("0").removesuffix(".") + "s" if frac else f"{whole}s")
    return "".join(out)
