"""The CLI's one table from error class to exit code (STYLE.md, docs/cli.md).
The core's error classes carry no transport code: the CLI maps them here, the
API in `hvfleet.server.errors`. A class is looked up along its MRO, so a
subclass exits as its nearest listed ancestor (`StaleVersion` as `Conflict`).

2 the input is wrong (nothing was written); 3 it does not fit, or not
everywhere (a scheduler tries elsewhere); 4 a conflict, or the server refused
(another manager owns the field, a stale version, no permission): retrying
the same request as is will not help; 1 anything else (not found, the store
or libvirt unreachable, an internal failure).
"""

from __future__ import annotations

from hvfleet.guests.errors import NotEverywhere
from hvfleet.model.errors import (
    AlreadyExists,
    Conflict,
    Forbidden,
    HvfleetError,
    InvalidInput,
    TooManyRequests,
    Unauthorized,
)
from hvfleet.scheduling.errors import DoesNotFit, NoHostFits
from hvfleet.scheduling.placement_client import GenerationConflict

BAD_INPUT, DOES_NOT_FIT, REFUSED, FAILURE = 2, 3, 4, 1

EXIT_CODES: dict[type[HvfleetError], int] = {
    InvalidInput: BAD_INPUT,
    DoesNotFit: DOES_NOT_FIT,
    NoHostFits: DOES_NOT_FIT,
    NotEverywhere: DOES_NOT_FIT,
    AlreadyExists: REFUSED,
    Conflict: REFUSED,
    GenerationConflict: REFUSED,
    Forbidden: REFUSED,
    Unauthorized: REFUSED,
    TooManyRequests: REFUSED,
    HvfleetError: FAILURE,
}


def exit_code_of(exc: HvfleetError) -> int:
    """The exit code for `exc`: that of its nearest class in EXIT_CODES."""
    return next(EXIT_CODES[c] for c in type(exc).__mro__ if c in EXIT_CODES)
