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
    from hvfleet.cli import resources  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    _register()
    try:
        app(args=argv, standalone_mode=False)
    except HvfleetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except typer.Exit as exc:
        return int(exc.exit_code or 0)
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        return 1
    except Exception as exc:  # click usage errors and the like
        import click

        if isinstance(exc, click.exceptions.ClickException):
            print(f"error: {exc.format_message()}", file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
