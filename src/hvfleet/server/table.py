"""meta.k8s.io/v1 Table output: the columns `hvfleet get` shows, for kubectl.

A client asks with `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`
(hvfleet.server.negotiation); lists, single objects and every watch event are
then answered as Tables. The
columns and rows come from the one place `hvfleet get` takes them from
(`hvfleet.views.tables`, one table per kind); the wide columns have priority
1, which kubectl shows with `-o wide`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from hvfleet.model.hypervisor import Resource
from hvfleet.store.undecodable import Undecodable
from hvfleet.views.tables import TABLES
from hvfleet.views.tables import TableInputs as TableInputs
from hvfleet.views.tables import rows_for as table_rows
from hvfleet.views.text import unknown_row


def rows_for(kind: str, objs: Sequence[Resource],
             inputs: TableInputs) -> tuple[list[dict[str, Any]], list[list[str]]]:
    """Column definitions and one row of cells per object, exactly as
    `hvfleet get -o wide` (hvfleet.views.tables); wide columns have priority 1."""
    cols, rows = table_rows(kind, objs, inputs, datetime.now(UTC), wide=True)
    return [c.to_dict() for c in cols], rows


def _row_object(obj: Resource, include: str, api_version: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return obj.to_dict()
    meta = obj.to_dict()["metadata"]
    return {"kind": "PartialObjectMetadata", "apiVersion": api_version, "metadata": meta}


def undecodable_row(kind: str, err: Undecodable, include: str,
                    api_version: str = "meta.k8s.io/v1") -> dict[str, Any]:
    """The row of an object that does not decode: its name, `Unknown` in the
    kind's state column, nothing else (the reason is in the answer's Warning)."""
    row: dict[str, Any] = {"cells": unknown_row(TABLES[kind].columns(True), err.name)}
    if include != "None":
        meta: dict[str, Any] = {"name": err.name, "resourceVersion": str(err.revision)}
        if err.uid:
            meta["uid"] = err.uid
        row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": api_version,
                         "metadata": meta}
    return row


def table(kind: str, objs: Sequence[Resource], inputs: TableInputs,
          resource_version: str, include_object: str = "Metadata",
          continue_token: str = "", undecodable: Sequence[Undecodable] = (),
          api_version: str = "meta.k8s.io/v1") -> dict[str, Any]:
    """The Table of `objs`; `include_object` as kube's includeObject
    (Metadata, Object, None), `api_version` meta.k8s.io/v1 or v1beta1."""
    cols, rows = rows_for(kind, objs, inputs)
    out_rows = []
    for obj, cells in zip(objs, rows, strict=True):
        row: dict[str, Any] = {"cells": cells}
        o = _row_object(obj, include_object, api_version)
        if o is not None:
            row["object"] = o
        out_rows.append(row)
    if undecodable:
        out_rows += [undecodable_row(kind, err, include_object, api_version) for err in undecodable]
        out_rows.sort(key=lambda r: str(r["cells"][0]))
    meta: dict[str, Any] = {"resourceVersion": resource_version}
    if continue_token:
        meta["continue"] = continue_token
    return {
        "kind": "Table", "apiVersion": api_version, "metadata": meta,
        "columnDefinitions": cols, "rows": out_rows,
    }
