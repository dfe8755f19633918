"""The API's one table from error class to HTTP status and Kubernetes Status
`reason`. The core's error classes carry no transport code (ARCHITECTURE.md):
the server maps them here, the CLI in `hvfleet.cli.exit_codes`. A class is
looked up along its MRO, so a subclass answers as its nearest listed ancestor
(`StaleVersion` as `Conflict`, `TooLarge` as itself before `InvalidInput`).
"""

from __future__ import annotations

from hvfleet.guests.errors import NotEverywhere
from hvfleet.model.errors import (
    AlreadyExists,
    BadRequest,
    Conflict,
    Forbidden,
    Gone,
    HvfleetError,
    InvalidInput,
    NotFound,
    TooLarge,
    TooManyRequests,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
)
from hvfleet.scheduling.errors import DoesNotFit, NoHostFits

# class → (HTTP status, Status reason). A claim that does not fit is refused as
# a Conflict, as Placement answers an allocation that exceeds capacity.
HTTP_STATUS: dict[type[HvfleetError], tuple[int, str]] = {
    InvalidInput: (422, "Invalid"),
    BadRequest: (400, "BadRequest"),
    TooLarge: (413, "RequestEntityTooLarge"),
    UnsupportedMediaType: (415, "UnsupportedMediaType"),
    NotFound: (404, "NotFound"),
    AlreadyExists: (409, "AlreadyExists"),
    Conflict: (409, "Conflict"),
    DoesNotFit: (409, "Conflict"),
    NoHostFits: (409, "Conflict"),
    NotEverywhere: (409, "Conflict"),
    Forbidden: (403, "Forbidden"),
    Unauthorized: (401, "Unauthorized"),
    # Kubernetes says "Expired" for a watch or continue token past compaction.
    Gone: (410, "Expired"),
    TooManyRequests: (429, "TooManyRequests"),
    Unavailable: (503, "ServiceUnavailable"),
    HvfleetError: (500, "InternalError"),
}


def http_status_of(exc: HvfleetError) -> tuple[int, str]:
    """(HTTP status, Status reason) of `exc`: its nearest class in HTTP_STATUS."""
    return next(HTTP_STATUS[c] for c in type(exc).__mro__ if c in HTTP_STATUS)
