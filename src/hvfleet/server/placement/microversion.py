"""Placement's microversions: `OpenStack-API-Version: placement X.Y` (or
`latest`), 1.0 when absent; 406 for a version outside 1.0-1.39, 400 for one
that does not parse, as Placement 16.0 answers."""

from __future__ import annotations

import re
from collections.abc import Mapping

from hvfleet.placement.errors import PlacementBadRequest, PlacementError

MIN_VERSION = (1, 0)
MAX_VERSION = (1, 39)
HEADER = "openstack-api-version"
SERVICE = "placement"


class NotAcceptableVersion(PlacementError):
    """The version asked for is outside what is served (Placement's 406)."""


def version_text(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


def negotiate(headers: Mapping[str, str]) -> tuple[int, int]:
    raw = headers.get(HEADER)
    if raw is None:
        return MIN_VERSION
    wanted = None
    for part in raw.split(","):
        service, _, value = part.strip().partition(" ")
        if service.lower() == SERVICE:
            wanted = value.strip()
    if wanted is None:
        return MIN_VERSION
    if wanted == "latest":
        return MAX_VERSION
    m = re.fullmatch(r"(\d+)\.(\d+)", wanted)
    if m is None:
        raise PlacementBadRequest(f"invalid version string: {wanted}")
    v = (int(m.group(1)), int(m.group(2)))
    if not MIN_VERSION <= v <= MAX_VERSION:
        raise NotAcceptableVersion(f"Unacceptable version header: {wanted}")
    return v
