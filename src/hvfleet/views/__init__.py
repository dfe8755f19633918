"""What a person sees of the fleet, the same for every edge (the CLI's tables,
the API's `Table` output and JSON, the dashboard): presentation, above the
model and scheduling, below the edges. Pure: values in, strings and dicts out.

- `hvfleet.views.text`: human quantities and ages, the `Column` definition;
- `hvfleet.views.tables`: one table (columns, rows, inputs) per kind;
- `hvfleet.views.capacity`: a host's capacity and cells, the fleet's capacity,
  and `FleetTotals`, the one fleet-totals implementation (full and incremental).

The names below are those modules' own, gathered so an edge can say
`views.hypervisor_row`.
"""

from __future__ import annotations

from hvfleet.views.capacity import (
    LOW_FREE,
    CapacityRow,
    FleetCapacity,
    FleetTotals,
    FreeLevel,
    HostCapacity,
    capacity_columns,
    capacity_detail_columns,
    capacity_detail_rows,
    capacity_rows,
    cell_columns,
    cell_rows,
    fleet_summary,
    free_level,
    host_capacity,
    resource_names,
    resource_order,
)
from hvfleet.views.tables import (
    TABLES,
    FleetReader,
    KindTable,
    TableInputs,
    hypervisor_columns,
    hypervisor_row,
    lease_columns,
    lease_row,
    policy_columns,
    policy_row,
    reservation_columns,
    reservation_row,
    rows_for,
    table_inputs,
)
from hvfleet.views.text import (
    STATE_COLUMNS,
    Column,
    age,
    human,
    pairs,
    ratio_text,
    unknown_row,
)

__all__ = [
    "LOW_FREE", "STATE_COLUMNS", "TABLES", "CapacityRow", "Column", "FleetCapacity", "FleetReader",
    "FleetTotals", "FreeLevel", "HostCapacity", "KindTable", "TableInputs", "age",
    "capacity_columns", "capacity_detail_columns", "capacity_detail_rows", "capacity_rows",
    "cell_columns", "cell_rows", "fleet_summary", "free_level", "host_capacity",
    "human", "hypervisor_columns", "hypervisor_row", "lease_columns", "lease_row", "pairs",
    "policy_columns", "policy_row", "ratio_text", "reservation_columns", "reservation_row",
    "resource_names", "resource_order", "rows_for", "table_inputs", "unknown_row",
]
