"""The Placement core's errors: Placement's detail text and error code, and
no transport status (hvfleet.server.placement maps each class to its HTTP
status in one table). The `code` is Placement's (placement.undefined unless
Placement names the case)."""

from __future__ import annotations

UNDEFINED = "placement.undefined_code"
DUPLICATE_NAME = "placement.duplicate_name"
CONCURRENT_UPDATE = "placement.concurrent_update"
INVENTORY_INUSE = "placement.inventory.inuse"
PROVIDER_IN_USE = "placement.resource_provider.inuse"
PROVIDER_CANNOT_DELETE_PARENT = "placement.resource_provider.cannot_delete_parent"
RESOURCE_PROVIDER_NOT_FOUND = "placement.resource_provider.not_found"
ILLEGAL_DUPLICATE_QUERYPARAM = "placement.query.duplicate_key"
QUERYPARAM_BAD_VALUE = "placement.query.bad_value"
QUERYPARAM_MISSING_VALUE = "placement.query.missing_value"


class PlacementError(Exception):
    code_default = UNDEFINED

    def __init__(self, detail: str, code: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.code = code or self.code_default


class PlacementBadRequest(PlacementError):
    """The request is malformed or names what cannot be (Placement's 400)."""


class PlacementNotFound(PlacementError):
    """What the request names does not exist (404)."""


class PlacementConflict(PlacementError):
    """A generation is stale, a name is taken, or something is in use (409)."""


class PlacementForbidden(PlacementError):
    """The caller's role may not do this (403)."""
