"""kubectl-like output: `-o table|wide|json|yaml`, Rich tables, human quantities."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from hvfleet.model.meta import Model
from hvfleet.model.views import human as human  # the one home of quantity formatting

# Like kubectl, never truncate columns when the output is not a terminal.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 250)
err_console = Console(stderr=True, highlight=False)


class OutputFormat(StrEnum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"


def as_document(objs: Sequence[Model] | Model) -> dict[str, Any]:
    if isinstance(objs, Model):
        return objs.to_dict()
    return {"apiVersion": "v1", "kind": "List", "items": [o.to_dict() for o in objs]}


def dump(doc: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def emit(objs: Sequence[Model] | Model, fmt: str) -> None:
    sys.stdout.write(dump(as_document(objs), fmt))


def table(columns: Sequence[str], rows: Sequence[Sequence[str]], title: str | None = None) -> Table:
    t = Table(title=title, box=None, pad_edge=False, header_style="bold")
    for c in columns:
        t.add_column(c, no_wrap=True)
    for r in rows:
        t.add_row(*r)
    return t
