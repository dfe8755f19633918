"""kubectl-like output: `-o table|wide|json|yaml`, Rich tables, human quantities.

Rich and PyYAML are imported when a table or YAML is printed, not before: a
command that prints JSON or one line pays for neither (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any, cast

from hvfleet.model.meta import Model
from hvfleet.model.views import human as human  # the one home of quantity formatting

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


class _ConsoleOnFirstUse:
    """Stands for the Rich Console until something is printed through it."""

    def __init__(self) -> None:
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            # Like kubectl, never truncate columns when the output is not a terminal.
            self._console = Console(highlight=False, width=None if sys.stdout.isatty() else 250)
        return getattr(self._console, name)


console = cast("Console", _ConsoleOnFirstUse())


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
    import yaml

    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def emit(objs: Sequence[Model] | Model, fmt: str) -> None:
    sys.stdout.write(dump(as_document(objs), fmt))


def table(columns: Sequence[str], rows: Sequence[Sequence[str]], title: str | None = None) -> Table:
    from rich.table import Table

    t = Table(title=title, box=None, pad_edge=False, header_style="bold")
    for c in columns:
        t.add_column(c, no_wrap=True)
    for r in rows:
        t.add_row(*r)
    return t
