"""The `hvfleet` command: one Typer app, one module per command family.

Errors from any layer arrive as `HvfleetError`; `main()` turns them into one
line on stderr and the error's exit code (2 for bad input, 1 for failures).
"""

from __future__ import annotations

import sys

import typer

from hvfleet.model.errors import HvfleetError

app = typer.Typer(
    name="hvfleet",
    help="A live, trustworthy picture of a libvirt/KVM fleet.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register() -> None:
    # Each command family registers itself on `app` when imported.
    from hvfleet.cli import agent  # noqa: F401
    from hvfleet.cli import resources  # noqa: F401


def main() -> None:
    """Console entry point. Usage errors are Typer's (exit 2); hvfleet's own errors
    become one line on stderr with their exit code."""
    _register()
    try:
        app()
    except HvfleetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
