"""Placement export: per hypervisor a resource provider with its inventories
(computed as Placement expects them) and usages — `hvfleet placement export`
and `POST .../placement`, one request form and one document.
"""

from __future__ import annotations

from typing import Any

from hvfleet.model.selectors import parse_selector
from hvfleet.ops.parsing import Query
from hvfleet.store.base import Store


class PlacementQuery(Query):
    label_selector: str = ""


def export(store: Store, query: PlacementQuery) -> dict[str, Any]:
    """The Placement view of the hosts the selector matches, as one document."""
    # Imported here: an HTTP client comes with the Placement module, which
    # `fit` and `reserve` do not need.
    from hvfleet.scheduling.placement import export_fleet

    return export_fleet(store, parse_selector(query.label_selector))
