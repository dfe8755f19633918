"""`hvfleet worker start|stop|status`: the warm worker that runs commands
without paying Python's and hvfleet's start-up each time (`cli/launch.py`,
`cli/forkserver.py`). Opt-in: nothing starts one behind the user's back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Annotated

import typer

from hvfleet.cli.forkserver import ensure_runtime_dir, log_path, open_log, running_pid
from hvfleet.cli.launch import socket_path
from hvfleet.cli.main import app
from hvfleet.model.durations import parse_duration
from hvfleet.model.errors import HvfleetError

worker = typer.Typer(
    help="A warm worker that runs hvfleet commands in a forked child, without the start-up.",
    no_args_is_help=True, add_completion=False, rich_markup_mode=None,
)
app.add_typer(worker, name="worker")


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
    idle = parse_duration(idle_timeout, field="idle_timeout", positive=True).total_seconds()
    path = socket_path()
    pid = running_pid(path)
    if pid is not None:
        print(f"worker already running: pid {pid}, socket {path}")
        return
    try:
        ensure_runtime_dir(os.path.dirname(path))
    except PermissionError as exc:
        raise HvfleetError(str(exc)) from exc
    with open_log(path) as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hvfleet.cli.forkserver", path, str(idle)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            start_new_session=True, close_fds=True,
            env={**os.environ, "HVFLEET_WORKER": "0"},
        )
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise HvfleetError(
                f"worker exited with {proc.returncode} during its warm-up; see {log_path(path)}")
        if _ready(path, proc.pid):
            print(f"worker started: pid {proc.pid}, socket {path}, idle timeout {idle_timeout}")
            return
        time.sleep(0.05)
    raise HvfleetError(f"worker pid {proc.pid} did not serve within {wait:g} s; see {log_path(path)}")


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
            raise HvfleetError(f"worker pid {pid} still running after {wait:g} s")
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
