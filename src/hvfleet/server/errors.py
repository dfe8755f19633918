"""The API's one table from error class to HTTP status and Kubernetes Status
`reason`. The core's error classes carry no transport code (ARCHITECTURE.md):
the server maps them here, the CLI in `hvfleet.cli.exit_codes`. A class is
looked up along its MRO, so a subclass answers as its nearest listed ancestor
(`StaleVersion` as `Conflict`, `TooLarge` as itself before `InvalidInput`).
"""

from __future__ import annotations

from hvfleet.guests.errors import NotEverywhere
from hvfleet.model.errors import HvfleetError
from hvfleet.scheduling.errors import DoesNotFit, NoHostFits
from hvfleet.store.statuses import STATUS_OF

# class → (HTTP status, Status reason): the model's classes as the remote store
# reads them back (hvfleet.store.statuses), and the refusals of the layers
# above. A claim that does not fit is refused as a Conflict, as Placement
# answers an allocation that exceeds capacity.
HTTP_STATUS: dict[type[HvfleetError], tuple[int, str]] = {
    **STATUS_OF,
    DoesNotFit: (409, "Conflict"),
    NoHostFits: (409, "Conflict"),
    NotEverywhere: (409, "Conflict"),
}


def http_status_of(exc: HvfleetError) -> tuple[int, str]:
    """(HTTP status, Status reason) of `exc`: its nearest class in HTTP_STATUS."""
    return next(HTTP_STATUS[c] for c in type(exc).__mro__ if c in HTTP_STATUS)
