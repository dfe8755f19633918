"""The one readable form of a quantity (`human`) and of a resource map (`pairs`).

Presentation, but kept in the model because the model's own judgments say
quantities in their messages (`hvfleet.model.spec_sync`), and those messages
must read as every table does. Every view (`hvfleet.views`) takes them from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import ResourceName


def human(resource: ResourceName | str, q: Quantity | None) -> str:
    """A quantity as a person reads it: bytes in the largest binary unit they
    reach (Ki to Ei) with one decimal, counts of five digits or more with
    thousands separators. (The memory of 10,000 hosts read "4498.2Ti".)"""
    if q is None:
        return "-"
    if ResourceName(resource).counts_bytes:
        v = float(q.value)
        for suffix, mult in (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20),
                             ("Ki", 2**10)):
            if abs(v) >= mult:
                text = f"{v / mult:.1f}".removesuffix(".0")
                return f"{text}{suffix}"
        return f"{v:.0f}"
    if q.is_integer() and abs(q.value) >= 10_000:
        # Large counts with thousands separators (738,278): four digits read at a glance.
        return f"{q.floor():,}"
    return str(q)


def pairs(values: Mapping[Any, Any], fmt: Any = str) -> str:
    return ",".join(f"{k}={fmt(k, v)}" for k, v in sorted(values.items(), key=lambda kv: str(kv[0]))) or "-"
