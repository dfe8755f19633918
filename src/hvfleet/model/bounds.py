"""The bounds of every value a write stores, one type per kind of field.

The rule (docs/design ARCHITECTURE): every value a write stores is one every
reader accepts. A reader decodes a stored object with the same model a write
is validated with, and computes with its values (capacity arithmetic, lease
expiry, heartbeat age, the fleet index's columns, Kubernetes clients that hold
counters as int64): so each field type below carries the bound
past which one of them would fail, and a write past it is refused
(InvalidInput, the API's 422 Invalid naming the field) with nothing written.
The limits are listed, with what a caller gets past each, in docs/security.md.

Quantities are bounded in `hvfleet.model.quantity` (`QuantityBound`), ratios
in `hvfleet.model.hypervisor.check_ratio`, label keys and values in
`hvfleet.model.meta`; the numbers are all here.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Final

from pydantic import AfterValidator, Field

from hvfleet.model.quantity import Quantity, QuantityBound

INT64_MAX: Final = 2**63 - 1
INT64_MIN: Final = -(2**63)

# An amount of one resource that a caller sets (capacity, allocation, reserve,
# extra capacity, a reservation's or an instance's resources): 10^21 (1000E, a
# thousand exabytes), far past any host (8Ei of memory is 9.2 × 10^18), and
# small enough that what is computed from it (below) prints in 25 digits.
MAX_QUANTITY: Final = 10**21
# Overcommit ratios: a finite number in this range (below 1 keeps part free).
MIN_RATIO: Final = 0.001
MAX_RATIO: Final = 1000.0
# What the agent computes from those: (capacity + extraCapacity) × ratio.
MAX_EFFECTIVE: Final = 2 * MAX_QUANTITY * int(MAX_RATIO)

# Timestamps: from the epoch to the end of year 2999 (UTC). A reader adds
# durations to them (lease expiry, heartbeat staleness, reservation ttl), which
# must stay inside what a datetime can hold (year 9999).
EARLIEST: Final = datetime(1970, 1, 1, tzinfo=UTC)
LATEST: Final = datetime(3000, 1, 1, tzinfo=UTC)
# A Lease's duration: one day at most (an agent renews it every third of it;
# the default is 30 s).
MAX_LEASE_SECONDS: Final = 86_400

# Text: any string field holds at most MAX_TEXT characters (Kubernetes' limit of
# a condition message), metadata at most MAX_ANNOTATIONS_BYTES of annotations
# (Kubernetes' total), a condition's reason MAX_REASON and type MAX_NAME.
MAX_TEXT: Final = 32_768
# C0 and C1 control characters and DEL: what a value for libvirt's XML never
# holds (guests.request refuses them) and what a terminal acts on (the CLI
# prints them as escapes: cli.output.shown).
CONTROL_CHARACTERS: Final = re.compile("[\x00-\x1f\x7f-\x9f]")
MAX_ANNOTATIONS_BYTES: Final = 256 * 1024
MAX_REASON: Final = 1024
MAX_NAME: Final = 253
MAX_MANAGER: Final = 128  # a field manager's name (Kubernetes' bound too)
MAX_LABELS: Final = 256

# Collections.
MAX_RESOURCES: Final = 128  # entries of one resource map (capacity, overcommit, ...)
MAX_CONDITIONS: Final = 64
MAX_CELLS: Final = 1024  # NUMA cells of one host
MAX_INSTANCES: Final = 10_000  # guests listed in one host's status
MAX_INSTANCE_NAME: Final = 1024  # a guest's name in that list (libvirt has no bound)
MAX_LIST: Final = 4096  # any other list (CPU features, machine types, notes, selector values)
MAX_SELECTOR_TERMS: Final = 64


def _timestamp(value: datetime) -> datetime:
    """A time in [EARLIEST, LATEST); one without a zone is UTC (so every reader
    can compare it with an aware `now`)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    if not EARLIEST <= value < LATEST:
        raise ValueError(
            f"{value.isoformat()} is out of range (from {EARLIEST.date()} to the end of "
            f"{LATEST.year - 1}, UTC)"
        )
    return value


Timestamp = Annotated[datetime, AfterValidator(_timestamp)]
# (checked with its own message by hvfleet.model.hypervisor.check_ratio first;
# the constraint here puts the range in the published schema.)
Ratio = Annotated[float, Field(ge=MIN_RATIO, le=MAX_RATIO)]
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
Reason = Annotated[str, Field(max_length=MAX_REASON)]
ShortName = Annotated[str, Field(max_length=MAX_NAME)]
# Quantities a caller sets, and the effective capacity computed from them.
Amount = Annotated[Quantity, QuantityBound(MAX_QUANTITY)]
EffectiveAmount = Annotated[Quantity, QuantityBound(MAX_EFFECTIVE)]

__all__ = [
    "CONTROL_CHARACTERS", "EARLIEST", "INT64_MAX", "LATEST", "MAX_CELLS", "MAX_CONDITIONS", "MAX_EFFECTIVE",
    "MAX_INSTANCES", "MAX_INSTANCE_NAME", "MAX_LABELS", "MAX_LEASE_SECONDS", "MAX_LIST", "MAX_MANAGER",
    "MAX_NAME",
    "MAX_QUANTITY", "MAX_RATIO", "MAX_REASON", "MAX_RESOURCES", "MAX_SELECTOR_TERMS", "MAX_TEXT",
    "MIN_RATIO",
    "Amount", "Count", "EffectiveAmount", "Int64", "Ratio", "Reason", "ShortName", "Timestamp",
]
