"""Edits of a Hypervisor's spec: its resource maps (spec.overcommit,
spec.reserved, spec.extraCapacity: set some entries, drop others) and its
maintenance mode, each validated as the resource would be validated on write.
Pure; the store write is the caller's (`hvfleet.scheduling.fleet_edit`), for
one host or for every host a selector matches, from the CLI and the dashboard
alike (`hvfleet.ops.spec`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import ValidationError

from hvfleet.model.errors import InvalidInput
from hvfleet.model.hypervisor import Hypervisor
from hvfleet.model.meta import validation_message
from hvfleet.model.resources import ResourceName

SpecMap = Literal["overcommit", "reserved", "extra_capacity"]
MaintenanceMode = Literal["", "manual", "drain"]


class HostEdit(Protocol):
    def apply(self, h: Hypervisor) -> Hypervisor:
        """The host with the edit made (InvalidInput when the result is not a valid spec)."""
        ...


def _with_spec(h: Hypervisor, fields: dict[str, Any]) -> Hypervisor:
    try:
        spec = h.spec.model_validate({**h.spec.model_dump(), **fields})
    except ValidationError as exc:
        raise InvalidInput(validation_message(exc, f"hypervisor {h.name}: spec")) from None
    return h.model_copy(update={"spec": spec})


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
        return _with_spec(h, {self.spec_map: values})


@dataclass(frozen=True)
class MaintenanceEdit:
    """Put the host in maintenance (`manual` with a reason, or `drain`), or take it out (``)."""

    mode: MaintenanceMode
    reason: str = ""

    def apply(self, h: Hypervisor) -> Hypervisor:
        return _with_spec(h, {"maintenance": self.mode,
                              "maintenance_reason": self.reason.strip() if self.mode else ""})
