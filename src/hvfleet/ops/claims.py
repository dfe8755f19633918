"""Claim and release: `hvfleet reserve|release`, the dashboard's reserve form
and `POST .../reservations/{name}/release`.

A claim's request is the fit request's form (`cpu`, `memory`, `resources`,
`count`; parsed by `SpaceQuery`, which `FitQuery` extends) plus who it is for and for how long; `claim`
takes it on a named host or, with `auto`, on the best one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import StrictBool

from hvfleet.model.durations import parse_expiry
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hypervisor import Reservation
from hvfleet.model.readiness import DEFAULT_STALENESS
from hvfleet.model.selectors import parse_selector
from hvfleet.ops.fit import SpaceQuery, Weigher
from hvfleet.scheduling.claims import release as release_claim
from hvfleet.scheduling.claims import reserve, reserve_auto
from hvfleet.store.base import Store


class ClaimQuery(SpaceQuery):
    host: str | None = None
    auto: StrictBool = False
    consumer: str = ""
    ttl: str = "10m"
    label_selector: str | None = None
    weigher: Weigher = "binpack"

    def life(self) -> timedelta | None:
        return parse_expiry(self.ttl, field="ttl")

    def check(self) -> None:
        """Every rule of the request, before anything is read or written."""
        if not self.consumer.strip():
            raise InvalidInput("required (the UUID of the instance the space is for)", field="consumer")
        if self.auto == (self.host is not None):
            raise InvalidInput("give either a host or auto, not both", field="host")
        if self.label_selector is not None and not self.auto:
            raise InvalidInput("only with auto (a named host is not selected)", field="labelSelector")
        self.request()
        self.life()


@dataclass(frozen=True)
class ClaimAnswer:
    reservation: Reservation

    def document(self) -> dict[str, Any]:
        return self.reservation.to_dict()


def claim(store: Store, query: ClaimQuery, manager: str,
          staleness: timedelta = DEFAULT_STALENESS) -> ClaimAnswer:
    """Take the space (DoesNotFit / NoHostFits when it does not fit)."""
    query.check()
    request, life = query.request(), query.life()
    if query.host is not None:
        made = reserve(store, query.host, request, query.consumer.strip(), life, staleness=staleness,
                       manager=manager)
    else:
        made = reserve_auto(store, request, query.consumer.strip(), life,
                            selector=parse_selector(query.label_selector), weigher=query.weigher,
                            staleness=staleness, manager=manager).reservation
    return ClaimAnswer(made)


def release(store: Store, name: str, manager: str) -> Reservation:
    """Give a reservation's space back (Released from this write on)."""
    return release_claim(store, name, manager=manager)
