"""Spec edits: overcommit set/unset, reserved and extra capacity, maintenance
and drain, on one host or on every host a selector matches.

One path for every edge: the CLI's `overcommit set -l …`, `maintenance` on the
dashboard's host page and any future API verb build a `SpecEditRequest` and
call `edit_spec`, which writes every changed host in one all-or-nothing
`Store.write_all`, each as an apply of the fields the edit changes (so a field
another manager owns is a conflict unless forced).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hvfleet.model.errors import InvalidInput
from hvfleet.model.hypervisor import Hypervisor
from hvfleet.model.spec_edits import HostEdit, MaintenanceEdit, MaintenanceMode, SpecEdit, SpecMap
from hvfleet.scheduling.fleet_edit import edit_hosts
from hvfleet.store.base import Store

__all__ = ["MaintenanceEdit", "SpecEdit", "SpecEditAnswer", "SpecEditRequest", "SpecMap", "edit_spec",
           "maintenance_edit"]


@dataclass(frozen=True)
class SpecEditRequest:
    """`edit` on hypervisor `name`, or on every hypervisor `selector` matches."""

    edit: HostEdit
    name: str | None = None
    selector: str | None = None
    force: bool = False

    def __post_init__(self) -> None:
        if (self.name is None) == (self.selector is None):
            raise InvalidInput("give a hypervisor name or a label selector, not both")


@dataclass(frozen=True)
class SpecEditAnswer:
    """The hosts as stored after the edit, by name (those it did not change as read)."""

    hosts: list[Hypervisor]


MAINTENANCE_MODES: tuple[MaintenanceMode, ...] = ("", "manual", "drain")


def maintenance_edit(mode: str, reason: str) -> MaintenanceEdit:
    """The edit of `mode` (`""` ends maintenance); manual maintenance needs a reason."""
    for known in MAINTENANCE_MODES:
        if mode == known:
            if known == "manual" and not reason.strip():
                raise InvalidInput("required when maintenance is manual: say why", field="reason")
            return MaintenanceEdit(known, reason)
    raise InvalidInput(f"{mode!r} is not one of: none, manual, drain", field="mode")


def edit_spec(store: Store, request: SpecEditRequest, manager: str,
              check: Callable[[Hypervisor, Hypervisor], None] | None = None) -> SpecEditAnswer:
    """Make the edit, all or nothing; `check(old, new)` sees each changed host
    before anything is written (the server authorizes there)."""
    return SpecEditAnswer(edit_hosts(store, request.edit, manager, name=request.name,
                                     selector=request.selector, force=request.force, check=check))
