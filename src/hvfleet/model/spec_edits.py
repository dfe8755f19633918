"""Edits of a Hypervisor's resource maps (spec.overcommit, spec.reserved,
spec.extraCapacity): set some entries, drop others, and validate the result as
the resource would be validated on write. Pure; the store write is the caller's
(`hvfleet.scheduling.fleet_edit`), for one host or for every host a selector
matches.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from hvfleet.model.errors import InvalidInput
from hvfleet.model.hypervisor import Hypervisor
from hvfleet.model.meta import validation_message
from hvfleet.model.resources import ResourceName

SpecMap = Literal["overcommit", "reserved", "extra_capacity"]


@dataclass(frozen=True)
class SpecEdit:
    """Set `changes` and drop `removals` in the spec map `spec_map`."""

    spec_map: SpecMap
    changes: Mapping[ResourceName, Any] = field(default_factory=dict)
    removals: Iterable[ResourceName] = ()

    def apply(self, h: Hypervisor) -> Hypervisor:
        values = dict(getattr(h.spec, self.spec_map))
        values.update(self.changes)
        for r in self.removals:
            values.pop(r, None)
        try:
            spec = h.spec.model_validate({**h.spec.model_dump(), self.spec_map: values})
        except ValidationError as exc:
            raise InvalidInput(validation_message(exc, f"hypervisor {h.name}: spec")) from None
        return h.model_copy(update={"spec": spec})
