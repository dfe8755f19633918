"""`plain_table` writes what Rich writes for the CLI's tables when stdout is
not a terminal, byte for byte (a differential test against Rich itself), and
declines where Rich would do more than pad columns."""

from __future__ import annotations

import io
import string

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from hvfleet.cli.output import PIPE_WIDTH, plain_table, table

# Printable ASCII, markup and emoji characters included, so some cells decline.
cell = st.text(alphabet=string.printable[:95], max_size=14) | st.sampled_from(
    ["True", "1/64", "12:00", ":smile:", "[bold]x", "a  b", " lead", "trail ", "", "-", "\x1b[2J", "a\tb"])


def rich(columns: list[str], rows: list[list[str]]) -> str:
    out = io.StringIO()
    # As cli/output.py makes it for a non-terminal.
    Console(file=out, width=PIPE_WIDTH, highlight=False).print(table(columns, rows))
    return out.getvalue()


@st.composite
def tables(draw: st.DrawFn) -> tuple[list[str], list[list[str]]]:
    n = draw(st.integers(1, 8))
    columns = draw(st.lists(cell, min_size=n, max_size=n))
    rows = draw(st.lists(st.lists(cell, min_size=n, max_size=n), max_size=12))
    return columns, rows


@settings(max_examples=400, deadline=None)
@given(tables())
def test_plain_is_rich_wherever_it_answers(t: tuple[list[str], list[list[str]]]) -> None:
    columns, rows = t
    plain = plain_table(columns, rows)
    if plain is not None:
        assert plain == rich(columns, rows), (columns, rows)


def test_it_answers_for_the_tables_the_cli_prints_and_declines_the_rest() -> None:
    cols = ["NAME", "READY", "CPU", "MEMORY", "AGE"]
    rows = [[f"hv{i:05d}", "True", f"{i % 64}/64", "12Gi/256Gi", "3d"] for i in range(200)]
    assert plain_table(cols, rows) == rich(cols, rows)
    assert plain_table(["A"], [["x" * (PIPE_WIDTH + 1)]]) is None  # Rich would cut it
    # Markup and emoji codes are literal text in both; control characters their escapes.
    for cell in ("[bold]x", ":smile: a:b:c", "\x1b[2Jx\x00"):
        assert plain_table(["A"], [[cell]]) == rich(["A"], [[cell]])
    assert plain_table(["A"], [["\x1b[2J"]]) == "A      \n\\x1b[2J\n"
    assert plain_table(["A"], [["naïve"]]) is None  # not ASCII: Rich measures cells
    assert plain_table(["A"], [["a\tb"]]) == rich(["A"], [["a\tb"]])  # a tab, shown as its escape
