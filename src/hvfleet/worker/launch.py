"""The `hvfleet` console entry: run a command in a warm worker when one is
running for this installation, else in this process.

Starting Python and importing Typer, the pydantic models and Rich costs about
200 ms before a command does anything; kubectl and virsh start in 14–40 ms. A
worker (`hvfleet worker start`, `worker/forkserver.py`) has imported every command
family and loaded osinfo-db and cpu_map once; for each command it forks a
child that takes this process's argv, environment, working directory, umask
and its standard input, output and error themselves (passed over a Unix socket
with SCM_RIGHTS), so the command runs exactly as it would here, with the
terminal, pipes and redirections it was given. This process waits for the
child's exit status, forwards the signals a user sends it (Ctrl-C), and exits
the same way. This is the client/server start-up of Bazel or Gradle, and
the forkserver of Python's multiprocessing.

This module is what every command imports first, so it imports nothing beyond
the interpreter's own built-in modules (no `socket`, `json` or `re`: ~10 ms
together, as much as the rest of the client) and the CLI's entry point
(`hvfleet.cli.entry`, itself free of imports until one of its functions is
called). The socket lives in a
directory only this user can open, and each side checks the other's uid.

Before it sends anything the client checks that the process listening is
this user's (SO_PEERCRED): a socket path under a shared /tmp could have been
taken by someone else first. `HVFLEET_WORKER=0` never uses a worker. `agent`, `serve` and `worker` always
run in this process; `hvfleet worker ...` is this package's own command
(`worker/command.py`), every other one the CLI's (`hvfleet.cli.entry.main`).
"""

import os
import sys

from hvfleet.cli.entry import command_index

# Commands that never run in a worker: long-lived daemons of their own, and the
# worker's own management.
IN_PROCESS = frozenset({"agent", "serve", "worker"})

# The request: MAGIC, then NUL-separated fields (see `encode_request`), its
# length first as 8 hex digits, sent with the three standard file descriptors.
MAGIC = b"hvfleet-worker-1"
# The worker's answers, one line each: "pid N" once the child runs, then
# "exit N" (its exit code) or "signal N" (the signal that ended it); "stale"
# when the worker's code is no longer what is installed (it then exits), or
# "decline REASON" when it cannot take the request: the command then runs in
# this process.


def runtime_dir() -> str:
    """This user's directory for worker sockets: `$XDG_RUNTIME_DIR/hvfleet`,
    else `/tmp/hvfleet-UID` (created 0700 by the worker, which refuses one it
    does not own or others can open)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base:
        return os.path.join(base, "hvfleet")
    return f"/tmp/hvfleet-{os.getuid()}"


def installation_tag() -> str:
    """Which installation a worker serves: this interpreter and this copy of
    hvfleet. Two virtualenvs or checkouts each get their own worker."""
    import zlib  # built into the interpreter: no import cost to speak of

    where = f"{sys.executable}\0{os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}"
    return f"{zlib.crc32(where.encode()):08x}"


def socket_path() -> str:
    return os.path.join(runtime_dir(), f"worker-{installation_tag()}.sock")


def encode_request(args: list[str]) -> bytes:
    """cwd, umask, the program's name (as help and usage lines show it), argc,
    the args, then every environment entry as K=V; all as the bytes the OS
    gave them (no argument or variable can hold a NUL)."""
    umask = os.umask(0)
    os.umask(umask)
    prog = os.fsencode(os.path.basename(sys.argv[0]) or "hvfleet")
    fields = [MAGIC, os.fsencode(os.getcwd()), b"%o" % umask, prog, b"%d" % len(args)]
    fields += [os.fsencode(a) for a in args]
    fields += [k + b"=" + v for k, v in os.environb.items()]
    return b"\0".join(fields)


class Request:
    """What a client hands its worker."""

    def __init__(self, cwd: str, umask: int, prog: str, args: list[str], env: dict[str, str]) -> None:
        self.cwd, self.umask, self.prog, self.args, self.env = cwd, umask, prog, args, env


def decode_request(data: bytes) -> Request:
    """The request in `encode_request`'s bytes."""
    fields = data.split(b"\0")
    if len(fields) < 5 or fields[0] != MAGIC:
        raise ValueError("not an hvfleet worker request")
    cwd, umask, prog = os.fsdecode(fields[1]), int(fields[2], 8), os.fsdecode(fields[3])
    argc = int(fields[4])
    if argc < 0 or 5 + argc > len(fields):
        raise ValueError("truncated hvfleet worker request")
    args = [os.fsdecode(a) for a in fields[5 : 5 + argc]]
    env = {}
    for entry in fields[5 + argc :]:
        key, eq, value = entry.partition(b"=")
        if eq:
            env[os.fsdecode(key)] = os.fsdecode(value)
    return Request(cwd, umask, prog, args, env)


def _in_worker(args: list[str]) -> int | None:
    """Run `args` in this installation's worker: the exit code to end with, or
    None when no worker takes it (none running, or a stale one)."""
    import _socket  # the C module: `socket` would import enum, selectors, ...

    path = socket_path()
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.connect(path)
        # The worker gets this process's environment (tokens too) and its
        # terminal: only one of this user's own will do. /tmp is shared, and
        # another user could have made the directory and listened there first.
        cred = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # pid, uid, gid
    except OSError:
        return None
    uid = int.from_bytes(cred[4:8], sys.byteorder)
    if uid != os.getuid():
        sock.close()
        sys.stderr.write(f"warning: not using {path}: it is served by uid {uid}, not this user\n")
        return None
    try:
        try:
            body = encode_request(args)
        except OSError:  # no working directory (removed): as the command itself will say
            return None
        # stdin, stdout, stderr as the C ints SCM_RIGHTS carries (no `array` import).
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))
        try:
            sock.sendmsg([b"%08x" % len(body)], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
            sock.sendall(body)
        except OSError:
            return None
        return _wait(sock)
    finally:
        sock.close()


def _wait(sock: object) -> int | None:
    import _signal as signal  # type: ignore[import-not-found]  # C module; `signal` imports enum

    recv = sock.recv  # type: ignore[attr-defined]
    child = 0
    pending: list[int] = []  # signals that came before the child's pid

    def forward(signum: int, _frame: object) -> None:
        if child:
            os.kill(child, signum)
        else:
            pending.append(signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, forward)

    buffered = b""
    while True:
        while b"\n" not in buffered:
            try:
                chunk = recv(256)
            except InterruptedError:  # pragma: no cover - retried by Python itself
                continue
            if not chunk:
                if child:
                    sys.stderr.write("error: the hvfleet worker stopped before the command ended\n")
                    return 1
                return 128 + pending[0] if pending else None
            buffered += chunk
        line, _, buffered = buffered.partition(b"\n")
        word, _, value = line.decode().partition(" ")
        if word == "pid":
            child = int(value)
            for signum in pending:
                os.kill(child, signum)
        elif word == "exit":
            return int(value)
        elif word == "signal":
            # End the way the child ended, so a shell sees the same status.
            signum = int(value)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return 128 + signum
        elif word in ("stale", "decline") and not child:
            # Not taken: the command runs here, unless the user already interrupted it.
            return 128 + pending[0] if pending else None
        else:
            sys.stderr.write(f"error: hvfleet worker: {line.decode(errors='replace')}\n")
            return 1


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    at = command_index(args)
    command = None if at is None else args[at]
    if command == "worker":
        from hvfleet.worker.command import main as worker_command

        worker_command(args[at + 1 :])  # type: ignore[operator]
        return
    if os.environ.get("HVFLEET_WORKER", "1") != "0" and command not in IN_PROCESS:
        code = _in_worker(args)
        if code is not None:
            sys.stdout.flush()
            os._exit(code)  # nothing of this process's own is left to clean up
    from hvfleet.cli.entry import main as in_process

    in_process(args)


if __name__ == "__main__":
    main()
