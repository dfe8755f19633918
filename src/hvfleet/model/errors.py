"""The error classes every layer raises, each with a message a user can act on.

They carry no transport code: each edge maps a class (by its MRO) in one
table, the CLI to an exit code (`hvfleet.cli.exit_codes`), the API to an HTTP
status and Status reason (`hvfleet.server.errors`). Nothing below the edges
prints or exits.
"""

from __future__ import annotations


class HvfleetError(Exception):
    """Base class: `str(err)` is the one line shown to a user.

    `field`, when given, is the input the message is about, named as the core
    and the API name it (`memory`, `ttl`, `resources.VGPU`); `str(err)` starts
    with it. An edge that spells the field differently (the CLI's `--memory`)
    renders `detail` behind its own name for the field.
    """

    # The object the error is about ("Hypervisor alias"), where the message
    # does not say and an edge may need it (a batch of manifests); the API's
    # Status names its object itself.
    about: str | None = None

    def __init__(self, message: str = "", *, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.detail = message


class InvalidInput(HvfleetError):
    """The input is wrong: a value, a field, a document. Nothing was written."""


class BadRequest(InvalidInput):
    """A request the API cannot decode: malformed body, unknown field under strict
    decoding, an unsupported selector. Nothing was written."""


class NotFound(HvfleetError):
    """The object (or the thing named) does not exist."""


class AlreadyExists(HvfleetError):
    """A create named an object that exists already."""


class Conflict(HvfleetError):
    """A stale resourceVersion, or a field owned by another manager."""


class Forbidden(HvfleetError):
    """A manager wrote what it does not own (e.g. status of another agent)."""


class Unauthorized(HvfleetError):
    """No credentials, or credentials that are unknown, expired or revoked."""


class Gone(HvfleetError):
    """A watch asked for history the store no longer keeps (compacted)."""


class Unavailable(HvfleetError):
    """A backend (store, libvirt) cannot be reached. Retrying may help."""


class TooLarge(InvalidInput):
    """A request body or document larger than the limit. Nothing was written."""


class UnsupportedMediaType(InvalidInput):
    """A body in a content type the endpoint does not take."""


class TooManyRequests(HvfleetError):
    """A per-caller limit (e.g. open watches per token) is reached. Retry later."""
