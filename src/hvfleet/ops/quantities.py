"""The two forms every edge shows an amount of a resource in: the exact
Kubernetes quantity (JSON and YAML answers) and the human form (tables, pages,
log lines). Memory, disk and hugepages count bytes and are written in binary
units in both (docs/api.md, "Quantities").
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from hvfleet.model.quantity import Quantity
from hvfleet.model.readable import human
from hvfleet.model.resources import ResourceName


def exact(r: ResourceName, value: int | Fraction | Quantity) -> str:
    """The canonical quantity: bytes with the largest binary suffix that is exact
    (`64Gi`, `8742684Ki`), else the plain number of bytes; counts as integers or
    decimal quantities. Parses back to the same value."""
    return str(r.quantity(value))


def readable(r: ResourceName, value: int | Fraction | Quantity | None) -> str:
    """What a person reads: bytes as `69.6Gi` (one decimal), large counts with
    thousands separators (`738,278`)."""
    return human(r, None if value is None else r.quantity(value))


def exact_map(values: Mapping[ResourceName, int | Fraction | Quantity]) -> dict[str, str]:
    """A resource map in exact form, sorted by resource name."""
    return {str(r): exact(r, v) for r, v in sorted(values.items(), key=lambda kv: str(kv[0]))}


def readable_map(values: Mapping[ResourceName, int | Fraction | Quantity]) -> dict[str, str]:
    return {str(r): readable(r, v) for r, v in sorted(values.items(), key=lambda kv: str(kv[0]))}
