"""Placement export: per hypervisor a resource provider with its inventories
(computed as Placement expects them) and usages — `hvfleet placement export`
and `POST .../placement`, one request form and one document.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from hvfleet.model.meta import Model
from hvfleet.model.selectors import parse_selector
from hvfleet.ops.parsing import invalid
from hvfleet.store.base import Store


class PlacementQuery(Model):
    label_selector: str = ""

    @classmethod
    def from_plain(cls, doc: Mapping[str, Any]) -> PlacementQuery:
        try:
            return cls.model_validate({k: v for k, v in doc.items() if v is not None})
        except ValidationError as exc:
            raise invalid(exc) from None


def export(store: Store, query: PlacementQuery) -> dict[str, Any]:
    """The Placement view of the hosts the selector matches, as one document."""
    # Imported here: an HTTP client comes with the Placement module, which
    # `fit` and `reserve` do not need.
    from hvfleet.scheduling.placement import export_fleet

    return export_fleet(store, parse_selector(query.label_selector))
