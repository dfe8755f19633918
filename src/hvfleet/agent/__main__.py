"""`python -m hvfleet.agent ...`: the `hvfleet agent` command on its own, without
the CLI's other command families (numpy, rich, the guest generator), so a
long-running agent on every host stays small in memory. `hvfleet agent ...`
dispatches here too."""

from __future__ import annotations

import sys

import typer

from hvfleet.cli.agent import agent
from hvfleet.cli.main import error_line
from hvfleet.model.errors import HvfleetError


def main(argv: list[str] | None = None, prog_name: str = "python -m hvfleet.agent") -> None:
    standalone = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    standalone.command()(agent)
    try:
        standalone(args=argv, prog_name=prog_name)
    except HvfleetError as exc:
        print(error_line(exc), file=sys.stderr)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
