"""A decision of the generator: its value, why, and on what evidence.

Every decision area (cpu, machine, firmware, clock, ...) returns `Decision`s;
`--explain` prints them, the renderer turns their values into XML. The reason
is data, not a comment, so an operator can see why a guest looks as it does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Decision(Generic[T]):
    area: str
    value: T
    shown: str  # the value as one line for humans
    reason: str
    evidence: tuple[str, ...] = ()


def hosts_list(names: list[str] | tuple[str, ...], limit: int = 6) -> str:
    """'a, b, c' or 'a, b, c … (+N more)' so evidence stays readable for big groups."""
    names = list(names)
    if len(names) <= limit:
        return ", ".join(names)
    return ", ".join(names[:limit]) + f" … (+{len(names) - limit} more)"
