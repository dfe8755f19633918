"""What the dashboard keeps in the store, so that every `hvfleet serve`
replica over one store shows the same history and a restart loses nothing
(its signing key is a server secret, hvfleet.server.dashboard.session):

- `HistorySeries`: one capacity series (the fleet, one label value, or one
  host) at one resolution (tier), as change points: each point gives, per
  resource, what is allocated, what reservations hold and the effective
  capacity, and holds until the next point (a host whose figures do not
  change costs no write). Points are bucketed to the tier's resolution (the
  latest state within a bucket wins), so replicas writing the same bucket
  write it once. The series' own object holds its latest points (a few
  dozen at most); earlier ones are parts, objects of the same kind that it
  lists, each written once, so that a point's write costs the same after a
  week as after a minute. Each part (and the series' own object) carries
  `lead`, the point in force before its first, so parts wholly before the
  tier's window are dropped and the value in force at the window's start is
  still known.

It is a stored kind that is not public (like AccessToken): no CRD, not
exported, not served by the API, not in an all-kinds watch.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import pairwise
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

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
                refused = _refusal(figure)
                if refused is not None:
                    raise ValueError(f"v.{resource}: {refused}")
        return v


@lru_cache(maxsize=4096)
def _refusal(figure: str) -> str | None:
    """Why `figure` is not a quantity, or None. Kept per text: a series
    repeats the same few figures (a host's capacity, "0") in every point, and
    it is decoded whole at each of its reads and writes."""
    try:
        Quantity.parse(figure)
    except InvalidInput as exc:
        return exc.detail
    return None


class HistoryPart(Model):
    """An earlier part of a series, listed by the series' own object: the
    times of its first and last points (the part's object is named after the
    series' and `first`)."""

    first: int = Field(ge=0, le=2**40)
    last: int = Field(ge=0, le=2**40)

    @model_validator(mode="after")
    def _ordered(self) -> HistoryPart:
        if self.last < self.first:
            raise ValueError(f"last ({self.last}) is before first ({self.first})")
        return self


class HistorySeriesSpec(Model):
    # What the series adds up: "fleet", "label:KEY=VALUE" or "host:NAME".
    series: str = Field(max_length=2 * MAX_NAME + 8)
    tier: str = Field(pattern=TIER_PATTERN)
    points: list[HistoryPoint] = Field(default_factory=list, max_length=MAX_POINTS)
    # The point in force before the first of `points` (the last of the part before, kept or dropped).
    lead: HistoryPoint | None = None
    # On the series' own object: its earlier parts still kept, oldest first.
    parts: list[HistoryPart] = Field(default_factory=list, max_length=MAX_POINTS)

    @property
    def last(self) -> HistoryPoint | None:
        """The series' last point: the last of `points`, else the lead."""
        return self.points[-1] if self.points else self.lead

    @model_validator(mode="after")
    def _in_order(self) -> HistorySeriesSpec:
        times = [p.t for p in self.points]
        if any(b <= a for a, b in pairwise(times)):
            raise ValueError("points: times must increase")
        if self.lead is not None and times and self.lead.t >= times[0]:
            raise ValueError(f"lead: its time ({self.lead.t}) is not before the first point's ({times[0]})")
        if any(b.first <= a.last for a, b in pairwise(self.parts)):
            raise ValueError("parts: each must start after the one before ends")
        if self.parts and times and times[0] <= self.parts[-1].last:
            raise ValueError("parts: the last must end before the first point")
        return self


class HistorySeries(StoredObject):
    kind: Literal["HistorySeries"] = "HistorySeries"
    spec: HistorySeriesSpec
    status: NoStatus = Field(default_factory=NoStatus)
