"""The words and cells every table is made of: quantities (`human`, from
`hvfleet.model.readable`), ages, resource maps, and the Kubernetes `Table`
column definition (name, type, format, description, priority): priority 0 is
the default table, 1 shows only with `-o wide`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from hvfleet.model.overcommit import SPEC
from hvfleet.model.quantity import Quantity
from hvfleet.model.readable import human as human
from hvfleet.model.readable import pairs as pairs
from hvfleet.model.resources import ResourceName


def age(ts: datetime | None, now: datetime) -> str:
    """kubectl's AGE: the largest whole unit (`3d`, `5h`, `12m`, `40s`)."""
    if ts is None:
        return "-"
    seconds = int((now - ts).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def used_of(r: ResourceName, used: Quantity | None, of: Quantity | None) -> str:
    return f"{human(r, used if used is not None else Quantity(0))}/{human(r, of)}"


def strs(values: Mapping[ResourceName, Quantity]) -> dict[str, str]:
    # The exact quantity in the resource's canonical form (bytes in binary units),
    # as every JSON answer gives it (hvfleet.ops.quantities.exact).
    return {str(k): str(ResourceName(k).quantity(v))
            for k, v in sorted(values.items(), key=lambda kv: str(kv[0]))}


@dataclass(frozen=True)
class Column:
    """One column of a table, as a Kubernetes Table's columnDefinitions entry."""

    name: str
    type: Literal["string", "integer", "number", "boolean"] = "string"
    description: str = ""
    priority: int = 0
    format: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "type": self.type, "format": self.format,
            "description": self.description, "priority": self.priority,
        }


def visible(columns: Sequence[Column], wide: bool) -> list[Column]:
    return [c for c in columns if wide or c.priority == 0]


# The column that says whether an object can be trusted, per kind.
STATE_COLUMNS = frozenset({"READY", "PHASE", "LIVE"})


def unknown_row(columns: Sequence[Column], name: str) -> list[str]:
    """The row of an object that cannot be read (it does not decode): its name,
    `Unknown` in the kind's state column, nothing else."""
    return [name if c.format == "name" else "Unknown" if c.name in STATE_COLUMNS else "-"
            for c in columns]


def ratio_text(value: float, source: str) -> str:
    """`4`, or `4(compute-default)` when OvercommitPolicy compute-default gives it."""
    return f"{value:g}" if source == SPEC else f"{value:g}({source.removeprefix('OvercommitPolicy/')})"
