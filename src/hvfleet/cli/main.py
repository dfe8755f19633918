"""The `hvfleet` command: one Typer app, one module per command family.

Errors from any layer arrive as `HvfleetError`; `main()` turns them into one
line on stderr and the exit code of their class (`cli/exit_codes.py`: 2 bad
input, 3 does not fit, 4 conflict or refused, 1 anything else).
The core names the field an error is about (`ttl`, `memory`); `FLAGS` is where
the CLI says which of its flags sets that field, so the line names the flag.
"""

from __future__ import annotations

import copy
import functools
import importlib
import os
import pkgutil
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer
import typer.core
import typer.main

from hvfleet.cli.entry import command_of
from hvfleet.model.errors import HvfleetError

# Plain help and usage errors, as kubectl and virsh print them: Rich's help
# renderer alone costs ~100 ms of every `--help` (docs/benchmarks.md).
PLAIN = {"pretty_exceptions_enable": False, "add_completion": False, "rich_markup_mode": None}

app = typer.Typer(
    name="hvfleet",
    help="A live, trustworthy picture of a libvirt/KVM fleet.",
    no_args_is_help=True,
    **PLAIN,  # type: ignore[arg-type]
)


def _global_options(
    # Named apart from any command's own parameters (token revoke's TOKEN
    # argument, a command's own --store): with_connection_options adds them to
    # every command.
    global_store: Annotated[str | None, typer.Option(
        "--store", callback=_exporting("HVFLEET_STORE"), show_default=False,
        help="Store URL for every command (default $HVFLEET_STORE); also taken after the "
        "command's name.")] = None,
    global_store_prefix: Annotated[str | None, typer.Option(
        "--store-prefix", callback=_exporting("HVFLEET_STORE_PREFIX"), show_default=False,
        help="Key prefix of this fleet in a shared etcd (default $HVFLEET_STORE_PREFIX, else "
        "/hvfleet); ignored by SQLite.")] = None,
    remote_token: Annotated[str | None, typer.Option(
        "--token", callback=_exporting("HVFLEET_TOKEN"), show_default=False,
        help="Bearer token for an https:// store (default $HVFLEET_TOKEN, else the "
        "kubeconfig's for that server).")] = None,
    remote_ca: Annotated[str | None, typer.Option(
        "--ca", callback=_exporting("HVFLEET_CA"), show_default=False,
        help="CA certificate (PEM) to verify an https:// store's server with (default "
        "$HVFLEET_CA, else the kubeconfig's, else the system's).")] = None,
    remote_kubeconfig: Annotated[str | None, typer.Option(
        "--kubeconfig", callback=_exporting("KUBECONFIG"), show_default=False,
        help="kubeconfig holding an https:// store's token and CA (default $KUBECONFIG, "
        "else ~/.kube/config).")] = None,
) -> None:
    """A live, trustworthy picture of a libvirt/KVM fleet.

    The global options may also follow a command's name: each sets the
    environment variable every command reads, wherever it opens its store."""


app.callback()(_global_options)


# field (as the core names it) → the flag that sets it. A dotted field
# (`resources.VGPU`) is its head's flag and the rest (`--resource VGPU`).
FLAGS = {
    "cpu": "--cpu",
    "memory": "--memory",
    "resources": "--resource",
    "count": "--count",
    "limit": "--limit",
    "consumer": "--consumer",
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
    "idle_timeout": "--idle-timeout",
}


def error_line(exc: HvfleetError) -> str:
    """The one line a user sees for `exc`, its field named by the flag that sets
    it, after the object it is about where the message does not name it."""
    line = _error_line(exc)
    if exc.about and exc.about not in line:
        return line.replace("error: ", f"error: {exc.about}: ", 1)
    return line


def _error_line(exc: HvfleetError) -> str:
    if exc.field is None:
        return f"error: {exc}"
    head, dot, rest = exc.field.partition(".")
    if head == "resources" and rest in ("cpu", "memory"):
        head, dot, rest = rest, "", ""  # set by --cpu / --memory, as a request is written
    flag = FLAGS.get(head)
    shown = exc.field if flag is None else f"{flag} {rest}" if dot else flag
    return f"error: {shown}: {exc.detail}"


# How a command reaches its store. hvfleet.store reads these from the
# environment, so a store opened anywhere in a command sees them.
def _export(env: str, value: str | None) -> str | None:
    if value:
        os.environ[env] = value
    return value


def _exporting(env: str) -> Callable[[str | None], str | None]:
    return lambda value: _export(env, value)


# The global options as a command's (with_connection_options adds them to each).
_global = typer.Typer(add_completion=False)
_global.command()(_global_options)


def _usage_of(argument: typer.core.TyperArgument, _ctx: object) -> list[str]:
    """An argument in the usage line as kubectl and virsh write it (NAME,
    [NAME], ENTRY...; its metavar as given), not Typer's `{name}`."""
    if argument.metavar is not None:
        return [argument.metavar]
    name = (argument.name or "").upper()
    name = name if argument.required else f"[{name}]"
    return [f"{name}..." if argument.nargs != 1 else name]


@functools.cache
def _global_params() -> tuple[Any, ...]:
    """The global options' definitions, built once per process: Typer builds a
    command's options from its signature, and every command (each stand-in of
    the help listing too) gets a copy of these."""
    return tuple(typer.main.get_command(_global).params)


def with_connection_options(command: Any) -> Any:
    """Give every command the global options, so they may follow its name as
    well as precede it: a command that opens a store (it has --store) gets
    the options of a remote one, --token, --ca and --kubeconfig, shown in its
    help, so no command has to thread them to where its store is opened (each
    sets its environment variable); the others take them too, hidden.
    `serve` takes none: its --store is its own backend, not a client's."""
    if isinstance(command, typer.core.TyperGroup):
        for sub in command.commands.values():
            with_connection_options(sub)
        return command
    for param in command.params:
        if isinstance(param, typer.core.TyperArgument):
            param.get_usage_pieces = functools.partial(_usage_of, param)  # type: ignore[method-assign]
    if command.name == "serve":
        return command
    opens_store = "store" in {p.name for p in command.params}
    flags = {flag for p in command.params for flag in getattr(p, "opts", ())}
    for param in _global_params():
        if not flags & set(getattr(param, "opts", ())):  # a command's own --token etc. win
            param = copy.copy(param)
            param.expose_value = False  # the command's function does not take it
            param.hidden = not opens_store or param.name == "global_store_prefix"
            command.params.append(param)
    return command


# Modules of this package that hold no commands.
_NOT_COMMANDS = frozenset({"main", "common", "output", "entry", "exit_codes"})

# Each top-level command → (the module of this package that registers it, the
# line `hvfleet --help` shows for it). A command imports only its own module,
# so `get` never pays for numpy, libvirt or the guest generator, and the help
# imports none. tests/cli/test_import_budget.py checks this table against what
# the modules register; a command missing here still runs, after every
# module is imported.
COMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("agent", "Keep one hypervisor's status (capacity, allocation, instances, host "
                       "capabilities, effective capacity) true, from libvirt."),
    "apply": ("resources", "Create or update objects from Kubernetes-style manifests (server-side "
                           "apply), all or nothing."),
    "capacity": ("resources", "Effective, allocated and free capacity per host, with a total row."),
    "cpu": ("guest", "CPU definitions for host groups."),
    "crd": ("resources", "Print CustomResourceDefinitions for Hypervisor, Reservation and "
                         "OvercommitPolicy."),
    "delete": ("resources", "Delete one object (kubectl delete)."),
    "describe": ("resources", "Capacity, cells, conditions and instances of one hypervisor."),
    "export": ("resources", "Print manifests (YAML) that `apply -f` turns back into the same objects."),
    "extra-capacity": ("resources", "Capacity libvirt cannot see (spec.extraCapacity)."),
    "fit": ("scheduling", "Hosts a request fits on, best first."),
    "get": ("resources", "List objects, or show one (kubectl get)."),
    "guest": ("guest", "Guest definitions that run everywhere in a group."),
    "overcommit": ("resources", "Set or unset overcommit ratios (spec.overcommit)."),
    "placement": ("scheduling", "The Placement-compatible view, and mirroring Placement."),
    "release": ("scheduling", "Give a reservation's space back."),
    "reservations": ("scheduling", "List reservations; `gc` removes ended ones."),
    "reserve": ("scheduling", "Take space on a host before the VM exists; prints the reservation "
                              "name."),
    "reserved": ("resources", "Set or unset the host reserve (spec.reserved)."),
    "kubeconfig": ("kubeconfig", "Write a kubeconfig (CA embedded) that kubectl and the Kubernetes "
                                 "clients use as is."),
    "serve": ("serve", "Serve the hvfleet.io/v1 API (kubectl and Kubernetes clients work against it)."),
    "token": ("token", "Bearer tokens for the API (hvfleet serve)."),
}

# Commands the `hvfleet` console script serves itself, outside the CLI
# (hvfleet.worker): `hvfleet --help` lists them too.
ELSEWHERE: dict[str, str] = {
    "worker": "A warm worker that runs hvfleet commands in a forked child, without the start-up.",
}


def load_all_commands() -> None:
    """Import every command family; each registers itself on `app` when imported."""
    import hvfleet.cli

    for module in pkgutil.iter_modules(hvfleet.cli.__path__):
        if module.name not in _NOT_COMMANDS and not module.name.startswith("_"):
            importlib.import_module(f"hvfleet.cli.{module.name}")


def _listing() -> typer.Typer:
    """`hvfleet --help` from COMMANDS: the same app, each command a stand-in that
    carries its help line, so the help imports no command family."""
    listing = typer.Typer(name=app.info.name, help=app.info.help, no_args_is_help=True, **PLAIN)  # type: ignore[arg-type]
    listing.callback()(_global_options)
    lines = {name: line for name, (_module, line) in COMMANDS.items()} | ELSEWHERE
    for name, line in lines.items():
        listing.command(name, help=line)(lambda: None)
    return listing


def main(argv: list[str] | None = None) -> None:
    """The CLI in this process (the console script, hvfleet.worker.launch, calls
    it through hvfleet.cli.entry when no worker runs the command). Usage
    errors are Typer's (exit 2); hvfleet's own errors become
    one line on stderr with their exit code."""
    args = sys.argv[1:] if argv is None else argv
    # The fleet index compares numpy vectors and never multiplies matrices, yet
    # OpenBLAS starts a thread per core when numpy loads: ~50 ms of every `fit`.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if args[:1] == ["agent"]:
        # The long-running node agent loads only its own command, not every
        # family's dependencies: 69 instead of 84 MiB RSS (docs/benchmarks.md).
        from hvfleet.cli.agent import standalone

        standalone(args[1:])
        return
    run(args)


def run(args: list[str], prog_name: str | None = None) -> None:
    """Run the command `args` name: here, or in a worker's child (hvfleet.worker),
    which has every family loaded and the commands built, and is given the
    client's program name (Click would name the worker's)."""
    guarded(lambda: _command(_which(args), *_registered())(args=args, prog_name=prog_name))


def guarded(command: Callable[[], object]) -> None:
    """Run `command`: hvfleet's errors become one line on stderr and the exit
    code of their class (cli/exit_codes.py); Ctrl-C exits 130."""
    try:
        command()
    except HvfleetError as exc:
        from hvfleet.cli.exit_codes import exit_code_of  # only on the way out

        print(error_line(exc), file=sys.stderr)
        sys.exit(exit_code_of(exc))
    except KeyboardInterrupt:
        sys.exit(130)


def _which(args: list[str]) -> str | None:
    """None for the help listing; else "app", once the family that registers the
    command is imported (every family, for a name not in COMMANDS)."""
    name = command_of(args)
    if name is None:
        return None
    if name in COMMANDS:
        importlib.import_module(f"hvfleet.cli.{COMMANDS[name][0]}")
    else:
        load_all_commands()  # not in the table: load everything, so it runs (or Typer says it is unknown)
    return "app"


def _registered() -> tuple[int, int]:
    return len(app.registered_commands), len(app.registered_groups)


@functools.cache
def _command(which: str | None, *_registered: int) -> Any:
    """The Click command for the help listing (None) or the app: built once per
    process and set of registered families (a process running several commands
    in turn, as the tests do, may load more), so a worker builds it before it forks."""
    if which is None:  # the listing's stand-ins run nothing: they need no options
        return typer.main.get_command(_listing())
    return with_connection_options(typer.main.get_command(app))


def prepare() -> None:
    """Everything a command needs before it parses its arguments (a worker's
    warm-up): every family, both commands built, and each option's converter
    (Typer builds one per option on first use: ~10 ms of a 20-option command)."""
    load_all_commands()
    pending = [_command(None, *_registered()), _command("app", *_registered())]
    while pending:
        command = pending.pop()
        pending += getattr(command, "commands", {}).values()
        for param in command.params:
            if hasattr(param, "get_runtime_param"):
                param.get_runtime_param()


if __name__ == "__main__":
    main()
