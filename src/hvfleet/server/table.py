"""meta.k8s.io/v1 Table output: the columns `hvfleet get` shows, for kubectl.

A client asks with `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`;
lists, single objects and every watch event are then answered as Tables. The
rows themselves come from one place shared with `hvfleet get` (`rows_for`):
the wide columns are sent with priority 1, which kubectl shows with `-o wide`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from hvfleet.model import views
from hvfleet.model.hypervisor import Hypervisor, Reservation, Resource

TABLE_MEDIA = "as=Table"
# Columns kubectl shows only with -o wide.
_WIDE = {"OVERCOMMIT", "RESERVED", "LABELS"}


def wants_table(accept: str | None) -> bool:
    """True when the client's first acceptable type is a meta.k8s.io/v1 Table."""
    if not accept:
        return False
    for part in accept.split(","):
        params = {k.strip(): v.strip() for k, _, v in
                  (p.partition("=") for p in part.split(";")[1:])}
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io" and params.get("v") == "v1":
            return True
    return False


def rows_for(kind: str, objs: Sequence[Resource],
             liveness: Mapping[str, bool] | None) -> tuple[list[str], list[list[str]]]:
    """Column names and one row of cells per object, exactly as `hvfleet get -o wide`
    (hvfleet.model.views). A reservation's phase is derived without its host here."""
    now = datetime.now(UTC)
    if kind == "Hypervisor":
        live = liveness or {}
        return ([c.name for c in views.hypervisor_columns(True)],
                [views.hypervisor_row(o, now, live.get(o.name), True)
                 for o in objs if isinstance(o, Hypervisor)])
    return ([c.name for c in views.reservation_columns(True)],
            [views.reservation_row(o, None, now, True) for o in objs if isinstance(o, Reservation)])


def _column(name: str) -> dict[str, Any]:
    return {
        "name": "Name" if name == "NAME" else name,
        "type": "string",
        "format": "name" if name == "NAME" else "",
        "description": "",
        "priority": 1 if name in _WIDE else 0,
    }


def _row_object(obj: Resource, include: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return obj.to_dict()
    meta = obj.to_dict()["metadata"]
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta}


def table(kind: str, objs: Sequence[Resource], liveness: Mapping[str, bool] | None,
          resource_version: str, include_object: str = "PartialObjectMetadata",
          continue_token: str = "") -> dict[str, Any]:
    cols, rows = rows_for(kind, objs, liveness)
    out_rows = []
    for obj, cells in zip(objs, rows, strict=True):
        row: dict[str, Any] = {"cells": cells}
        o = _row_object(obj, include_object)
        if o is not None:
            row["object"] = o
        out_rows.append(row)
    meta: dict[str, Any] = {"resourceVersion": resource_version}
    if continue_token:
        meta["continue"] = continue_token
    return {
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
        "columnDefinitions": [_column(c) for c in cols], "rows": out_rows,
    }
