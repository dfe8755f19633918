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

from hvfleet.model.bounds import CONTROL_CHARACTERS
from hvfleet.model.meta import Model
from hvfleet.views.text import human as human  # the one home of quantity formatting

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
            self._console = Console(highlight=False, width=None if sys.stdout.isatty() else PIPE_WIDTH)
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


# Like kubectl, never truncate columns when the output is not a terminal: a
# width no table of the CLI reaches (Rich cuts cells only past it).
PIPE_WIDTH = 1 << 16

def shown(text: str) -> str:
    """`text` as it is printed: each control character as its escape
    (`\\x1b`), so text a user wrote (a maintenance reason, a label, a
    condition's message) never moves the cursor, clears the screen or
    retitles the terminal of the person reading it."""
    return CONTROL_CHARACTERS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def literal(text: object) -> str:
    """`text` to put inside Rich markup: shown as written, never read as markup."""
    from rich.markup import escape

    return escape(shown(str(text)))


def print_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A table to stdout: on a terminal through Rich (bold header, laid out
    for its width); elsewhere the same bytes Rich would write there, made
    without it (`plain_table`). Rich takes ~60 ms to lay out 200 rows that
    a pipe or a file receive as plain padded columns."""
    text = None if _rich_terminal() else plain_table(columns, rows)
    if text is None:
        console.print(table(columns, rows))
    else:
        sys.stdout.write(text)


def _rich_terminal() -> bool:
    """Whether Rich would treat stdout as a terminal (and style its output)."""
    import os

    return sys.stdout.isatty() or "FORCE_COLOR" in os.environ or "TTY_COMPATIBLE" in os.environ


def plain_table(columns: Sequence[str], rows: Sequence[Sequence[str]],
                width: int = PIPE_WIDTH) -> str | None:
    """`table(columns, rows)` as Rich prints it to a non-terminal `width`
    columns wide: each column padded to its widest cell, two spaces between
    columns, none at the edges. None where Rich would do more than pad: a
    character that is not printable ASCII (control characters are shown as
    their escapes first, as `table` shows them), an empty column, or a table
    wider than `width` (Rich would cut cells). Markup and emoji codes are text
    in both (`table` makes each cell a literal Text).
    tests/cli/test_plain_table.py checks the equality against Rich."""
    grid = [[shown(c) for c in columns], *([shown(c) for c in r] for r in rows)]
    for line in grid:
        for cell in line:
            if not (cell.isascii() and cell.isprintable()):
                return None
    widths = [max(len(line[i]) for line in grid) for i in range(len(columns))]
    if not widths or 0 in widths or sum(widths) + 2 * (len(widths) - 1) > width:
        return None  # (Rich gives an all-empty column a width of its own)
    return "".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + "\n"
                   for line in grid)


def table(columns: Sequence[str], rows: Sequence[Sequence[str]], title: str | None = None) -> Table:
    from rich.table import Table
    from rich.text import Text

    t = Table(title=title, box=None, pad_edge=False, header_style="bold")
    for c in columns:
        t.add_column(Text(shown(c)), no_wrap=True)
    for r in rows:
        # Literal text: a label `[red]x` or `:smile:` is shown as written.
        t.add_row(*(Text(shown(cell)) for cell in r))
    return t
