"""The `hvfleet` command: one Typer app, one module per command family.

Errors from any layer arrive as `HvfleetError`; `main()` turns them into one
line on stderr and the error's exit code (2 for bad input, 1 for failures).
The core names the field an error is about (`ttl`, `memory`); `FLAGS` is where
the CLI says which of its flags sets that field, so the line names the flag.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from typing import Annotated

import typer

from hvfleet.model.errors import HvfleetError

app = typer.Typer(
    name="hvfleet",
    help="A live, trustworthy picture of a libvirt/KVM fleet.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _global_options(
    store_prefix: Annotated[
        str | None,
        typer.Option(
            "--store-prefix", envvar="HVFLEET_STORE_PREFIX",
            help="Key prefix of this fleet in a shared etcd (default /hvfleet); ignored by SQLite.",
        ),
    ] = None,
) -> None:
    """A live, trustworthy picture of a libvirt/KVM fleet."""
    if store_prefix:
        # open_store() reads it, wherever a command opens the store.
        os.environ["HVFLEET_STORE_PREFIX"] = store_prefix


# field (as the core names it) → the flag that sets it. A dotted field
# (`resources.VGPU`) is its head's flag and the rest (`--resource VGPU`).
FLAGS = {
    "cpu": "--cpu",
    "memory": "--memory",
    "resources": "--resource",
    "count": "--count",
    "ttl": "--ttl",
    "staleness": "--staleness",
    "resync": "--resync",
    "lease_ttl": "--lease-ttl",
    "status_resync": "--status-resync",
    "name": "--name",
    "metrics_addr": "--metrics-addr",
    "vcpus": "--vcpus",
    "disks": "--disk",
    "nics": "--nic",
    "firmware": "--firmware",
    "secure_boot": "--secure-boot",
    "os": "--os",
    "policy": "--policy",
    "mode": "--mode",
    "caps_dir": "--caps-dir",
    "hosts": "--hosts",
    "force": "--force",
    "drivers": "--drivers",
    "allow_abi_change": "--allow-abi-change",
    "dump_location": "--dump-dir",
}


def error_line(exc: HvfleetError) -> str:
    """The one line a user sees for `exc`, its field named by the flag that sets it."""
    if exc.field is None:
        return f"error: {exc}"
    head, dot, rest = exc.field.partition(".")
    flag = FLAGS.get(head)
    shown = exc.field if flag is None else f"{flag} {rest}" if dot else flag
    return f"error: {shown}: {exc.detail}"


# Modules of this package that hold no commands.
_NOT_COMMANDS = frozenset({"main", "common", "output"})


def _register() -> None:
    """Import every command family; each registers itself on `app` when imported."""
    import hvfleet.cli

    for module in pkgutil.iter_modules(hvfleet.cli.__path__):
        if module.name not in _NOT_COMMANDS and not module.name.startswith("_"):
            importlib.import_module(f"hvfleet.cli.{module.name}")


def main(argv: list[str] | None = None) -> None:
    """Console entry point. Usage errors are Typer's (exit 2); hvfleet's own errors
    become one line on stderr with their exit code."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["agent"]:
        # The long-running node agent loads only its own command, not every
        # family's dependencies: 69 instead of 84 MiB RSS (docs/benchmarks.md).
        from hvfleet.cli.agent import standalone

        standalone(args[1:])
        return
    _register()
    try:
        app(args=argv)
    except HvfleetError as exc:
        print(error_line(exc), file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
