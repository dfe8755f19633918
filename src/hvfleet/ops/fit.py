"""`fit`: which hosts a request fits on, best first, and why not the others.

One request form for every edge: `FitQuery` is the API's body as it is, the
dashboard's form and the CLI's options mapped to the same dict (`cpu` and
`memory` may be given beside `resources`). One answer: `FitAnswer.document()`
is what `hvfleet fit -o json`, `POST .../fit` and the dashboard's fit page
show (exact quantities, or human ones for a page), `FitAnswer.table()` what a
table shows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StrictBool, StrictInt

from hvfleet.model.errors import InvalidInput
from hvfleet.model.meta import API_VERSION
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import CPU, MEMORY, ResourceName
from hvfleet.model.selectors import Selector, parse_selector
from hvfleet.model.spec_sync import SpecSync
from hvfleet.ops.parsing import Query
from hvfleet.ops.quantities import exact, readable
from hvfleet.scheduling.errors import NoHostFits
from hvfleet.scheduling.fit import Rejection
from hvfleet.scheduling.request import Request

if TYPE_CHECKING:
    # numpy comes with the index; `reserve` and the parsers need none of it.
    from hvfleet.scheduling.index import FleetIndex

Weigher = Literal["binpack", "spread"]
Form = Literal["exact", "human"]


def _amount(v: Any) -> Any:
    """An amount as the Quantity type takes it in a stored object: text or a
    JSON number, never a boolean (pydantic's lax mode would read `true` as 1)."""
    if isinstance(v, bool):
        raise ValueError("expected a quantity, got a boolean")
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"{v!r} is not a finite quantity")
        return repr(v)
    return v


# Parsed into a Quantity by `SpaceQuery.request`, where the field is named.
Amount = Annotated[str | int, BeforeValidator(_amount)]


class SpaceQuery(Query):
    """The space a request asks for, as fit and claim take it: `cpu` and
    `memory` beside the other `resources`, for `count` instances. Numbers and
    flags are strict: a boolean is no count, nor "yes" a flag."""

    resources: dict[str, Amount] = Field(default_factory=dict)
    cpu: Amount | None = None
    memory: Amount | None = None
    count: StrictInt = 1

    def request(self) -> Request:
        """The scheduling request: each amount parsed where its field names it
        (`cpu`, `memory`, `resources.VGPU`)."""
        out: dict[ResourceName, Quantity] = {}
        for r, value, where in ((CPU, self.cpu, "cpu"), (MEMORY, self.memory, "memory")):
            if value is not None and value != "":
                out[r] = Quantity.parse(value, where=where)
        for name, value in self.resources.items():
            r = ResourceName.parse(name, where="resources")
            if r in out:
                raise InvalidInput(f"{r} is requested twice", field="resources")
            out[r] = Quantity.parse(value, where=f"resources.{r}")
        return Request(out, self.count)


class FitQuery(SpaceQuery):
    """A fit request in its plain form (JSON keys in camelCase)."""

    label_selector: str = ""
    weigher: Weigher = "binpack"
    limit: StrictInt | None = Field(default=None, ge=1)
    why: StrictBool = False

    def selector(self) -> Selector:
        return parse_selector(self.label_selector)


def resource_pairs(items: Iterable[str], where: str = "resources") -> dict[str, str]:
    """`NAME=QUANTITY` entries (the CLI's `--resource`, the form's list) as the
    `resources` map; the amounts are parsed later, with the rest of the query."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, qty = item.partition("=")
        if not sep or not name.strip() or not qty.strip():
            raise InvalidInput(f"{item!r} is not NAME=QUANTITY (e.g. VGPU=1)", field=where)
        key = name.strip()
        if key in out:
            raise InvalidInput(f"{key} is requested twice", field=where)
        out[key] = qty.strip()
    return out


@dataclass(frozen=True)
class FitCandidate:
    name: str
    score: float
    free: Mapping[ResourceName, Any]
    synced: SpecSync


@dataclass(frozen=True)
class FitAnswer:
    request: Request
    weigher: str
    considered: int
    fitting: int
    candidates: list[FitCandidate]
    rejected: Mapping[str, list[Rejection]] | None

    @property
    def fits(self) -> bool:
        return bool(self.candidates)

    def document(self, form: Form = "exact") -> dict[str, Any]:
        """The answer as JSON, a FitResult (`POST .../fit` answers it as it is):
        `exact` quantities for programs, `human` for a page."""
        show = exact if form == "exact" else readable
        doc: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": "FitResult",
            "request": request_document(self.request),
            "weigher": self.weigher,
            "considered": self.considered,
            "fitting": self.fitting,
            "candidates": [
                {"name": c.name, "score": round(c.score, 6),
                 "free": {str(r): show(r, v) for r, v in sorted(c.free.items(), key=lambda kv: str(kv[0]))},
                 "synced": c.synced.to_dict()}
                for c in self.candidates
            ],
        }
        if self.rejected is not None:
            doc["rejected"] = {n: [r.to_dict() for r in found] for n, found in self.rejected.items()}
        return doc

    def table(self) -> list[list[str]]:
        """Header and one row per candidate, quantities in human form."""
        rows = [["HOST", "SCORE", "FREE CPU", "FREE MEMORY", "SYNCED"]]
        for c in self.candidates:
            rows.append([c.name, f"{c.score:.4f}",
                         readable(CPU, c.free[CPU]) if CPU in c.free else "-",
                         readable(MEMORY, c.free[MEMORY]) if MEMORY in c.free else "-",
                         c.synced.state])
        return rows

    def nothing_fits(self) -> NoHostFits:
        """The error an edge that exits on it raises (the CLI: exit 3)."""
        return NoHostFits(f"no host fits {describe(self.request)}")


def request_document(request: Request) -> dict[str, Any]:
    return {"resources": {str(r): exact(r, q) for r, q in sorted(request.resources.items(), key=str)},
            "count": request.count}


def describe(request: Request) -> str:
    """The request in one line (`cpu=4, memory=8Gi`, `2 × (cpu=4)`)."""
    parts = ", ".join(f"{r}={exact(r, q)}" for r, q in sorted(request.resources.items(), key=str))
    return parts if request.count == 1 else f"{request.count} × ({parts})"


def fit(index: FleetIndex, query: FitQuery) -> FitAnswer:
    """Run `query` on the fleet index (the caller holds it current)."""
    request = query.request()
    result = index.fit(request, selector=query.selector(), weigher=query.weigher, limit=query.limit,
                       why=query.why)
    return FitAnswer(
        request=result.request, weigher=result.weigher, considered=result.considered,
        fitting=result.fitting,
        candidates=[FitCandidate(n, s, index.free(n), index.synced(n))
                    for n, s in zip(result.names, result.scores, strict=True)],
        rejected=result.rejected if query.why else None,
    )
