"""What a scheduler asks for: resources per instance, and how many instances
must land on one host."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hvfleet.model.bounds import MAX_EFFECTIVE
from hvfleet.model.errors import InvalidInput
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import CPU, MEMORY, ResourceName, placement_alias_error, placement_class_error


@dataclass(frozen=True)
class Request:
    resources: Mapping[ResourceName, Quantity] = field(default_factory=dict)
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1:
            raise InvalidInput(f"count: {self.count} must be at least 1")
        if not self.resources:
            raise InvalidInput("request: ask for at least one resource (cpu, memory or another)")
        alias = placement_alias_error(self.resources, "resources") or placement_class_error(
            self.resources, "resources")
        if alias is not None:
            raise alias
        for name, q in self.resources.items():
            if q <= 0:
                raise InvalidInput(f"request {name}: {q} must be greater than 0")
            # Past the largest capacity any host can store it fits nowhere; refused
            # before the fit's arithmetic meets a number of thousands of digits.
            if q * self.count > MAX_EFFECTIVE:
                raise InvalidInput(
                    f"{'count × ' if self.count > 1 else ''}{str(q)[:24]} is out of range "
                    f"(at most {MAX_EFFECTIVE} in all)", field=f"resources.{name}")

    def total(self, name: ResourceName) -> Quantity:
        """What `count` instances take together."""
        return self.resources[name] * self.count

    def total_list(self) -> dict[ResourceName, Quantity]:
        return {r: self.total(r) for r in self.resources}


def parse_request(
    cpu: str | None,
    memory: str | None,
    resources: Iterable[str] = (),
    count: int = 1,
) -> Request:
    """Build a request from its fields as text (`cpu="4"`, `memory="8Gi"`,
    `resources=["VGPU=1"]`); errors name those fields."""
    out: dict[ResourceName, Quantity] = {}
    if cpu is not None:
        out[CPU] = Quantity.parse(cpu, where="cpu")
    if memory is not None:
        out[MEMORY] = Quantity.parse(memory, where="memory")
    for item in resources:
        name, sep, qty = item.partition("=")
        if not sep or not name.strip() or not qty.strip():
            raise InvalidInput(f"{item!r} is not NAME=QUANTITY (e.g. VGPU=1)", field="resources")
        r = ResourceName.parse(name.strip(), where="resources")
        if r in out:
            raise InvalidInput(f"{r} is requested twice", field="resources")
        out[r] = Quantity.parse(qty.strip(), where=f"resources.{r}")
    return Request(out, count)
