"""The CLI's entry point: all that a program running hvfleet commands (the
`hvfleet` console script, the warm worker in `hvfleet.worker`) may use of the
CLI. Nothing else of `hvfleet.cli` is for them (tests/test_layers.py).

The console script imports this module before it knows whether a worker will
run the command, so it imports nothing at load time: each function imports
what it needs when called.
"""

# No `from __future__ import annotations` either: one module fewer to load.
# Not `typing.TYPE_CHECKING`: importing typing is a cost the console script
# does not pay (mypy reads this name as it reads typing's).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import typer

# Global options (`hvfleet --store URL get ...`) that take a value: skipped
# when looking for the command's name.
GLOBAL_VALUE_OPTIONS = frozenset({"--store", "--store-prefix", "--token", "--ca", "--kubeconfig"})


def command_index(args: list[str]) -> int | None:
    """Where in `args` the top-level command's name is; None for the help, or
    for none."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("--help", "-h"):
            return None
        if arg in GLOBAL_VALUE_OPTIONS:
            i += 1
        elif not arg.startswith("-"):
            return i
        i += 1
    return None


def command_of(args: list[str]) -> str | None:
    """The top-level command `args` names; None for the help, or for none."""
    i = command_index(args)
    return None if i is None else args[i]


def main(args: list[str]) -> None:
    """Run the command `args` name in this process (exits as the command does)."""
    from hvfleet.cli.main import main as in_process

    in_process(args)


def run(args: list[str], prog_name: str | None = None) -> None:
    """Run the command in a process that is already prepared (`warm`), with the
    client's program name for help and usage lines."""
    from hvfleet.cli.main import run as in_process

    in_process(args, prog_name)


def run_app(app: "typer.Typer", args: list[str], prog_name: str) -> None:
    """Run a Typer app that is not the CLI's (the worker's own command) with the
    CLI's error handling: one line on stderr, the exit code of the error's class."""
    import typer.main

    from hvfleet.cli.main import guarded

    guarded(lambda: typer.main.get_command(app)(args=args, prog_name=prog_name))


def duration_seconds(text: str, field: str) -> float:
    """A positive duration in the CLI's one grammar (`30m`, `1h30m`), in seconds;
    bad input names `field` as the CLI's flags do."""
    from hvfleet.model.durations import parse_duration

    return parse_duration(text, field=field, positive=True).total_seconds()


def warm() -> None:
    """Import what any command imports and load the guest generator's data, so
    a process forked afterwards starts with it all."""
    import contextlib
    import importlib
    import os
    import pkgutil

    import hvfleet

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as main() does; before numpy
    from hvfleet.cli.main import prepare

    prepare()
    # Every module of hvfleet (commands import many lazily, in the function
    # that needs them: the fleet index and numpy, the guest generator, the
    # store backends), and what tables and YAML print with.
    names = [m.name for m in pkgutil.walk_packages(hvfleet.__path__, "hvfleet.")
             if not m.name.endswith("__main__")]
    for module in (*names, "rich.console", "rich.table", "rich.text", "yaml"):
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    load_data()


def load_data() -> None:
    """Load osinfo-db and cpu_map (a host without them: the commands that need
    them say so)."""
    import contextlib

    from hvfleet.guests.datasets import preload

    with contextlib.suppress(Exception):
        preload()


def code_files() -> list[str]:
    """Every file of hvfleet's code, and every `sys.path` directory (where
    installing or upgrading a package changes entries)."""
    import os
    import sys

    import hvfleet
    from hvfleet.guests import datacache

    root = os.path.dirname(os.path.abspath(hvfleet.__file__))
    out = [f for f in datacache.tree_files(root, "") if not f.endswith(".pyc")]
    out += [p for p in sys.path if p and os.path.isdir(p)]
    return sorted(out)


def file_versions(paths: list[str]) -> list[tuple[str, int, int]]:
    """What tells a changed file from the same one (modification time and size)."""
    from hvfleet.guests import datacache

    return datacache.file_versions(paths)


def data_files() -> list[str]:
    """The data files (osinfo-db, cpu_map) loaded so far."""
    from hvfleet.guests import datacache

    return datacache.watched()


def reload_changed_data() -> bool:
    """Whether loaded data changed on disk; if so it is loaded again."""
    from hvfleet.guests import datacache

    if not datacache.revalidate():
        return False
    load_data()
    return True
