"""One table at each edge maps an error class to its transport code: the CLI's
exit code (cli/exit_codes.py, STYLE: 2 bad input, 3 does not fit, 4 conflict or
refused, 1 anything else) and the API's HTTP status and Status reason
(server/errors.py). The core's classes carry neither."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import hvfleet
from hvfleet.cli.exit_codes import exit_code_of
from hvfleet.guests.check import NotEverywhere
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
from hvfleet.scheduling.errors import ConsumerAlreadyHolds, DoesNotFit, NoHostFits
from hvfleet.server.errors import http_status_of
from hvfleet.store.base import OwnershipConflict, StaleVersion


def _every_error_class() -> set[type[HvfleetError]]:
    for info in pkgutil.walk_packages(hvfleet.__path__, "hvfleet."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    seen: set[type[HvfleetError]] = set()
    todo: list[type[HvfleetError]] = [HvfleetError]
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.add(cls)
            todo += cls.__subclasses__()
    return seen


def test_no_error_class_carries_a_transport_code() -> None:
    carrying = sorted(f"{c.__module__}.{c.__qualname__}" for c in _every_error_class()
                      if any(hasattr(c, a) for a in ("exit_code", "http_status")))
    assert not carrying


@pytest.mark.parametrize(("error", "code"), [
    (InvalidInput("x"), 2), (BadRequest("x"), 2), (TooLarge("x"), 2), (UnsupportedMediaType("x"), 2),
    (DoesNotFit("h", []), 3), (NoHostFits("x"), 3), (NotEverywhere("x"), 3),
    (AlreadyExists("x"), 4), (Conflict("x"), 4), (StaleVersion("x"), 4),
    (OwnershipConflict("x", [("spec.overcommit.cpu", "cortex")]), 4),
    (ConsumerAlreadyHolds("c", "r", "h"), 4), (Forbidden("x"), 4), (Unauthorized("x"), 4),
    (TooManyRequests("x"), 4),
    (NotFound("x"), 1), (Gone("x"), 1), (Unavailable("x"), 1), (HvfleetError("x"), 1),
])
def test_exit_codes_follow_style(error: HvfleetError, code: int) -> None:
    assert exit_code_of(error) == code


@pytest.mark.parametrize(("error", "status"), [
    (InvalidInput("x"), (422, "Invalid")), (BadRequest("x"), (400, "BadRequest")),
    (TooLarge("x"), (413, "RequestEntityTooLarge")),
    (UnsupportedMediaType("x"), (415, "UnsupportedMediaType")),
    (NotFound("x"), (404, "NotFound")), (AlreadyExists("x"), (409, "AlreadyExists")),
    (Conflict("x"), (409, "Conflict")), (StaleVersion("x"), (409, "Conflict")),
    (DoesNotFit("h", []), (409, "Conflict")), (NoHostFits("x"), (409, "Conflict")),
    (NotEverywhere("x"), (409, "Conflict")),
    (Forbidden("x"), (403, "Forbidden")), (Unauthorized("x"), (401, "Unauthorized")),
    (Gone("x"), (410, "Expired")), (TooManyRequests("x"), (429, "TooManyRequests")),
    (Unavailable("x"), (503, "ServiceUnavailable")), (HvfleetError("x"), (500, "InternalError")),
])
def test_http_statuses_are_kubernetes_ones(error: HvfleetError, status: tuple[int, str]) -> None:
    assert http_status_of(error) == status
