"""`hvfleet worker start|stop|status`: the warm worker that runs commands
without paying Python's and hvfleet's start-up each time (`worker/launch.py`,
`worker/forkserver.py`). Opt-in: nothing starts one behind the user's back.

The console script runs this command itself (`launch.main`), not through the
CLI, which knows nothing of the worker; errors read and exit as the CLI's do
(`hvfleet.cli.entry.run_app`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Annotated

import typer

import hvfleet.cli.entry as entry
from hvfleet.worker.forkserver import ensure_runtime_dir, log_path, open_log, running_pid
from hvfleet.worker.launch import socket_path

HELP = "A warm worker that runs hvfleet commands in a forked child, without the start-up."

worker = typer.Typer(help=HELP, no_args_is_help=True, add_completion=False, rich_markup_mode=None)


def main(args: list[str]) -> None:
    """`hvfleet worker ARGS`."""
    entry.run_app(worker, args, "hvfleet worker")


def _fail(message: str) -> typer.Exit:
    """A failure (exit 1) in the CLI's one-line form."""
    print(f"error: {message}", file=sys.stderr)
    return typer.Exit(1)


def _ready(path: str, pid: int) -> bool:
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError:
            return False
    return running_pid(path) == pid


@worker.command("start")
def worker_start(
    idle_timeout: Annotated[str, typer.Option(
        "--idle-timeout", help="Exit after this long without a command (e.g. 30m, 2h).")] = "30m",
    wait: Annotated[float, typer.Option(
        help="Seconds to wait for it to serve (its warm-up imports everything).")] = 30.0,
) -> None:
    """Start this installation's worker in the background (once: a running one is kept)."""
    idle = entry.duration_seconds(idle_timeout, "idle_timeout")
    path = socket_path()
    pid = running_pid(path)
    if pid is not None:
        print(f"worker already running: pid {pid}, socket {path}")
        return
    try:
        ensure_runtime_dir(os.path.dirname(path))
    except PermissionError as exc:
        raise _fail(str(exc)) from exc
    with open_log(path) as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hvfleet.worker.forkserver", path, str(idle)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            start_new_session=True, close_fds=True,
            env={**os.environ, "HVFLEET_WORKER": "0"},
        )
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise _fail(
                f"worker exited with {proc.returncode} during its warm-up; see {log_path(path)}")
        if _ready(path, proc.pid):
            print(f"worker started: pid {proc.pid}, socket {path}, idle timeout {idle_timeout}")
            return
        time.sleep(0.05)
    raise _fail(f"worker pid {proc.pid} did not serve within {wait:g} s; see {log_path(path)}")


@worker.command("stop")
def worker_stop(
    wait: Annotated[float, typer.Option(help="Seconds to wait for it to exit.")] = 30.0,
) -> None:
    """Stop this installation's worker; running commands finish first."""
    path = socket_path()
    pid = running_pid(path)
    if pid is None:
        print("no worker running")
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while running_pid(path) is not None:
        if time.monotonic() > deadline:
            raise _fail(f"worker pid {pid} still running after {wait:g} s")
        time.sleep(0.05)
    print(f"worker stopped: pid {pid}")


@worker.command("status")
def worker_status() -> None:
    """Whether this installation's worker runs (exit 1 when none does)."""
    path = socket_path()
    pid = running_pid(path)
    if pid is None:
        print(f"no worker running (socket {path})")
        raise typer.Exit(1)
    print(f"worker running: pid {pid}, socket {path}, log {log_path(path)}")
