"""What the dashboard keeps in the store, so that every `hvfleet serve`
replica over one store shows the same history and a restart loses nothing
(its signing key is a server secret, hvfleet.server.dashboard.session):

- `HistorySeries`: one capacity series (the fleet, one label value, or one
  host) at one resolution (tier), as change points: each point gives, per
  resource, what is allocated, what reservations hold and the effective
  capacity, and holds until the next point (a host whose figures do not
  change costs no write). Points are bucketed to the tier's resolution (the
  latest state within a bucket wins), so replicas writing the same bucket
  write it once; the oldest points beyond the tier's window are dropped, one
  kept as the value in force at the window's start.

It is a stored kind that is not public (like AccessToken): no CRD, not
exported, not served by the API, not in an all-kinds watch.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from hvfleet.model.bounds import MAX_NAME, MAX_RESOURCES
from hvfleet.model.errors import InvalidInput
from hvfleet.model.meta import Model, NoStatus, StoredObject
from hvfleet.model.quantity import Quantity

# A tier's name is its resolution: "10s", "1m", "10m".
TIER_PATTERN = r"^[0-9]{1,6}[smhd]$"
# Points one series keeps in one tier at most (a week at 10 s would be 60,480).
MAX_POINTS = 100_000


# One resource's [allocated, held, effective], each a quantity's text.
Figures = Annotated[list[Annotated[str, Field(max_length=64)]], Field(min_length=3, max_length=3)]


class HistoryPoint(Model):
    # Seconds since the epoch, at the start of the tier's bucket.
    t: int = Field(ge=0, le=2**40)
    # Per resource: [allocated, held by reservations, effective capacity].
    v: dict[str, Figures] = Field(default_factory=dict, max_length=MAX_RESOURCES)

    @field_validator("v")
    @classmethod
    def _figures(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for resource, figures in v.items():
            if len(figures) != 3:
                raise ValueError(f"{resource}: expected [allocated, held, effective], got {figures!r}")
            for figure in figures:
                try:
                    Quantity.parse(figure, where=f"v.{resource}")
                except InvalidInput as exc:
                    raise ValueError(str(exc)) from None
        return v


class HistorySeriesSpec(Model):
    # What the series adds up: "fleet", "label:KEY=VALUE" or "host:NAME".
    series: str = Field(max_length=2 * MAX_NAME + 8)
    tier: str = Field(pattern=TIER_PATTERN)
    points: list[HistoryPoint] = Field(default_factory=list, max_length=MAX_POINTS)


class HistorySeries(StoredObject):
    kind: Literal["HistorySeries"] = "HistorySeries"
    spec: HistorySeriesSpec
    status: NoStatus = Field(default_factory=NoStatus)
