"""The error classes every layer raises, each with a message a user can act on.

The CLI maps them to exit codes (bad input → 2, failures → 1) and the HTTP API
to status codes; nothing below the edges prints or exits.
"""

from __future__ import annotations


class HvfleetError(Exception):
    """Base class: `str(err)` is the one line shown to a user.

    `field`, when given, is the input the message is about, named as the core
    and the API name it (`memory`, `ttl`, `resources.VGPU`); `str(err)` starts
    with it. An edge that spells the field differently (the CLI's `--memory`)
    renders `detail` behind its own name for the field.
    """

    exit_code = 1
    http_status = 500

    def __init__(self, message: str = "", *, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.detail = message


class InvalidInput(HvfleetError):
    """The input is wrong: a value, a field, a document. Nothing was written."""

    exit_code = 2
    http_status = 422


class BadRequest(InvalidInput):
    """A request the API cannot decode: malformed body, unknown field under strict
    decoding, an unsupported selector. Nothing was written."""

    http_status = 400


class NotFound(HvfleetError):
    exit_code = 1
    http_status = 404


class AlreadyExists(HvfleetError):
    exit_code = 2
    http_status = 409


class Conflict(HvfleetError):
    """A stale resourceVersion, or a field owned by another manager."""

    exit_code = 2
    http_status = 409


class Forbidden(HvfleetError):
    """A manager wrote what it does not own (e.g. status of another agent)."""

    exit_code = 2
    http_status = 403


class Unauthorized(HvfleetError):
    """No credentials, or credentials that are unknown, expired or revoked."""

    exit_code = 1
    http_status = 401


class Gone(HvfleetError):
    """A watch asked for history the store no longer keeps (compacted)."""

    exit_code = 1
    http_status = 410


class Unavailable(HvfleetError):
    """A backend (store, libvirt) cannot be reached. Retrying may help."""

    exit_code = 1
    http_status = 503


class TooLarge(InvalidInput):
    """A request body or document larger than the limit. Nothing was written."""

    http_status = 413


class UnsupportedMediaType(InvalidInput):
    """A body in a content type the endpoint does not take."""

    http_status = 415


class TooManyRequests(HvfleetError):
    """A per-caller limit (e.g. open watches per token) is reached. Retry later."""

    exit_code = 1
    http_status = 429


# Each error class as a Kubernetes meta/v1 Status names it: (class, reason, code),
# most specific first (TooLarge and BadRequest are InvalidInput too). The API
# answers with it and the remote store reads answers back with it.
STATUS_REASONS: tuple[tuple[type[HvfleetError], str, int], ...] = (
    (TooLarge, "RequestEntityTooLarge", 413),
    (UnsupportedMediaType, "UnsupportedMediaType", 415),
    (BadRequest, "BadRequest", 400),
    (InvalidInput, "Invalid", 422),
    (NotFound, "NotFound", 404),
    (AlreadyExists, "AlreadyExists", 409),
    (Conflict, "Conflict", 409),
    (Forbidden, "Forbidden", 403),
    (Unauthorized, "Unauthorized", 401),
    # Kubernetes says "Expired" for a watch or continue token past compaction.
    (Gone, "Expired", 410),
    (TooManyRequests, "TooManyRequests", 429),
    (Unavailable, "ServiceUnavailable", 503),
)
