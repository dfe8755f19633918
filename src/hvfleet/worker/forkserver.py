"""The warm worker behind `hvfleet worker start`: one process that has imported
every command family and loaded the guest generator's data, and forks a child
per command that `worker/launch.py` hands it.

The worker is single-threaded (a fork copies only the forking thread, so no
thread may hold a lock at that moment) and serves requests from one selector
loop: the listening socket, each child's pidfd and the worker's end of its
socketpair, each waiting client's connection (its end of file means the
client died: the child gets SIGHUP, as a terminal's hang-up sends) and a
wake-up pipe for SIGTERM. One child is always forked ahead (the spare); a
request goes to it with the client's stdin, stdout and stderr, argv,
environment, working directory and umask, and it runs the CLI's entry point
(`hvfleet.cli.entry.run`) as the client's own process would. The worker sends
the client the child's pid, then how it ended: the exit code the child reports just before it
exits, or the signal that ended it. A request the worker cannot take
(malformed, too large, a spare that died) is declined: the client then runs
the command itself.

A worker never serves code or data that is no longer installed. Before each
request it reads its inotify watch (`worker/changes.py`) of every directory
holding hvfleet's source files and of every `sys.path` directory (an
installed, upgraded or removed package changes its entries there) and of the
osinfo-db and cpu_map files it loaded; after an event it compares the files'
modification times and sizes with those it started with, and revalidates the
data (`hvfleet.cli.entry.reload_changed_data`). Changed code answers "stale": the
client runs the command itself and the worker exits. Changed data is
reloaded, and the spare forked before it replaced.

It serves only its own user: the socket's directory is 0700 and owned by that
user, and each connection's peer uid (SO_PEERCRED) must be the worker's. It
exits after `idle` seconds without a request. A JSON log line per start, stop
and command (its name, exit status and time; never its arguments, which may
hold a token) goes to `worker-TAG.log` beside the socket.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import hvfleet.cli.entry as entry
from hvfleet.worker import launch
from hvfleet.worker.changes import Changes

MAX_REQUEST = 1 << 20  # argv + environment; ARG_MAX is 2 MiB, a shell's env far less
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def ensure_runtime_dir(path: str) -> None:
    """Create `path` 0700, or refuse one another user owns or can open: whoever
    can reach the socket can run commands as this user."""
    with contextlib.suppress(FileExistsError):
        os.makedirs(path, mode=0o700)
    st = os.lstat(path)
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or not os.path.isdir(path):
        raise PermissionError(
            f"{path}: must be a directory owned by uid {os.getuid()} that only it can open "
            f"(owner uid {st.st_uid}, mode {st.st_mode & 0o777:o})"
        )


@dataclass
class _Child:
    """A forked child: the spare waiting for a request (no `conn` yet), or one
    running a client's command."""

    pid: int
    pidfd: int
    handoff: socket.socket | None = None  # the worker's end of its socketpair
    conn: socket.socket | None = None  # the client's connection, once it runs a command
    command: str | None = None
    reported: int | None = None  # the exit code it reported before exiting
    started: float = field(default_factory=time.monotonic)


def _receive(sock: socket.socket, nfds: int) -> tuple[bytes, list[int]]:
    """One request from `sock`: its length as 8 hex digits with `nfds` file
    descriptors, then that many bytes. The descriptors are closed on error."""
    head, fds, _flags, _addr = socket.recv_fds(sock, 8, nfds)
    try:
        if len(fds) != nfds or len(head) != 8:
            raise ValueError(f"a request carries a length and {nfds} file descriptors")
        size = int(head, 16)
        if size > MAX_REQUEST:
            raise ValueError(f"request of {size} bytes (at most {MAX_REQUEST})")
        body = bytearray()
        while len(body) < size:
            chunk = sock.recv(size - len(body))
            if not chunk:
                raise ValueError("request cut short")
            body += chunk
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return bytes(body), fds


class Worker:
    """The selector loop. One child is always forked ahead (the spare): a
    request is handed to it over a socketpair, with the client's standard
    descriptors, so neither the fork (~2.5 ms of copying page tables) nor the
    child's exit (it reports its exit code back over the socketpair before
    tearing down its address space, and the worker tells the client at once)
    is on the client's path."""

    def __init__(self, path: str, idle: float, log: TextIO, lock_fd: int) -> None:
        self.path = path
        self.lock_fd = lock_fd
        self.idle = idle
        self.log = log
        self.children: dict[int, _Child] = {}  # running commands, by pidfd
        self.by_conn: dict[int, _Child] = {}  # the same, by the client connection's fd
        self.by_handoff: dict[int, _Child] = {}  # the same, by the socketpair's fd
        self.spare: _Child | None = None
        self.spare_deaths: list[float] = []
        self.stopping = False
        self.served = 0

    def note(self, event: str, **fields: Any) -> None:
        doc = {"ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "event": event,
               "pid": os.getpid(), **fields}
        self.log.write(json.dumps(doc) + "\n")
        self.log.flush()

    def serve(self) -> None:
        entry.warm()
        self.code_files = entry.code_files()
        self.code = entry.file_versions(self.code_files)
        self.changes = self.watch()
        if threading.active_count() != 1:  # pragma: no cover - a dependency started one
            raise RuntimeError("a thread runs after warm-up: forking would be unsafe")
        gc.collect()
        gc.freeze()  # the warm heap stays shared with the children, untouched by their GC

        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a dead worker's: the lock says none lives
        self.listener.bind(self.path)
        os.chmod(self.path, 0o600)
        self.listener.listen(64)
        self.listener.setblocking(False)
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGTERM, lambda *_: None)  # the wake-up pipe carries it
        signal.signal(signal.SIGINT, lambda *_: None)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, "listen")
        self.sel.register(wake_r, selectors.EVENT_READ, "signal")
        # What a child closes first: it holds none of the worker's descriptors.
        self.own_fds = {self.listener.fileno(), wake_r, wake_w, self.sel.fileno(),
                        self.lock_fd, self.log.fileno()}
        self.spawn_spare()
        self.note("start", socket=self.path, idle_s=self.idle, modules=len(sys.modules))
        last = time.monotonic()
        while not (self.stopping and not self.children and self.spare is None):
            timeout = None if self.children else max(0.0, last + self.idle - time.monotonic())
            if self.stopping:
                timeout = 1.0
            events = self.sel.select(timeout)
            if not events and not self.children and not self.stopping:
                self.note("idle", served=self.served)
                self.stop()
            for key, _mask in events:
                # A descriptor closed earlier in this batch (a child's report
                # and its exit arrive together) is skipped: its object says so.
                if isinstance(key.data, tuple):
                    kind, child = key.data
                    if kind == "report" and self.by_handoff.get(key.fd) is child:
                        self.report(key.fd)
                    elif kind == "client" and self.by_conn.get(key.fd) is child:
                        self.client_gone(key.fd)
                elif key.data == "listen":
                    self.accept()
                    last = time.monotonic()
                elif key.data == "signal":
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_r, 64)
                    self.stop()
                elif key.data == "child":
                    self.reap(key.fd)
        self.note("stop", served=self.served)

    def stop(self) -> None:
        """Take no more requests (clients then run commands themselves); the
        running children finish, the spare is ended."""
        if self.stopping:
            return
        self.stopping = True
        self.sel.unregister(self.listener)
        self.own_fds.discard(self.listener.fileno())
        self.listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        if self.spare is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.spare.pid, signal.SIGKILL)

    def spawn_spare(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child's coverage is its command's
            ours.close()
            self.await_request(theirs)
        theirs.close()
        self.spare = _Child(pid, os.pidfd_open(pid), handoff=ours)
        self.own_fds |= {self.spare.pidfd, ours.fileno()}
        self.sel.register(self.spare.pidfd, selectors.EVENT_READ, "child")

    def accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        try:
            self.handle(conn)
        except Exception as exc:  # one bad request never stops the worker
            # Nothing ran: the client runs the command itself.
            reason = f"{type(exc).__name__}: {exc}"
            self.note("declined", reason=reason)
            with contextlib.suppress(OSError):
                conn.sendall(f"decline {reason}\n".encode())
            conn.close()

    def handle(self, conn: socket.socket) -> None:
        conn.setblocking(True)
        conn.settimeout(5.0)  # a client sends its request at once
        _pid, uid, _gid = _UCRED.unpack(
            conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        if uid != os.getuid():
            raise PermissionError(f"uid {uid} may not use uid {os.getuid()}'s worker")
        if not conn.recv(1, socket.MSG_PEEK):
            conn.close()  # a probe (`worker start` waiting for it to serve): nothing to run
            return
        body, fds = _receive(conn, 3)
        try:
            args = launch.decode_request(body).args  # refused here if malformed
            if self.stale():
                conn.sendall(b"stale\n")
                conn.close()
                self.note("stale")
                self.stop()
                return
            if self.spare is None:
                self.spawn_spare()
            child, self.spare = self.spare, None
            assert child is not None and child.handoff is not None
            try:
                socket.send_fds(child.handoff, [b"%08x" % len(body)], fds)
                child.handoff.sendall(body)
            except OSError:
                self.spare = child  # it died: reaped as a spare, and the client declined
                raise
        finally:
            for fd in fds:
                os.close(fd)
        conn.settimeout(None)
        with contextlib.suppress(OSError):  # a client gone by now gets its child a SIGHUP
            conn.sendall(b"pid %d\n" % child.pid)
        child.conn, child.command, child.started = conn, entry.command_of(args), time.monotonic()
        self.served += 1
        self.children[child.pidfd] = child
        self.by_conn[conn.fileno()] = child
        self.by_handoff[child.handoff.fileno()] = child
        self.own_fds.add(conn.fileno())
        self.sel.register(conn, selectors.EVENT_READ, ("client", child))
        self.sel.register(child.handoff, selectors.EVENT_READ, ("report", child))
        self.spawn_spare()  # for the next request, while this one runs

    def watch(self) -> Changes:
        """inotify on every directory holding the code and data this worker
        serves: a request then costs one read unless something changed."""
        paths = [*self.code_files, *entry.data_files()]
        return Changes([p if os.path.isdir(p) else os.path.dirname(p) for p in paths])

    def stale(self) -> bool:
        """Whether the code changed (the exact comparison runs only after an
        inotify event); changed data is reloaded here, and the spare, forked
        with the old data, replaced."""
        if not self.changes.changed():
            return False
        if entry.file_versions(self.code_files) != self.code:
            return True
        if entry.reload_changed_data():  # the next children get the new data warm
            self.changes.close()
            self.changes = self.watch()  # a new data directory is watched too
            if self.spare is not None:
                spare, self.spare = self.spare, None
                os.kill(spare.pid, signal.SIGKILL)
                os.waitpid(spare.pid, 0)
                self.sel.unregister(spare.pidfd)
                os.close(spare.pidfd)
                assert spare.handoff is not None
                spare.handoff.close()
                self.own_fds -= {spare.pidfd, spare.handoff.fileno()}
        return False

    def reap(self, pidfd: int) -> None:
        self.sel.unregister(pidfd)
        child = self.children.pop(pidfd, None)
        if child is None:  # the spare ended without a request
            spare, self.spare = self.spare, None
            assert spare is not None and spare.pidfd == pidfd and spare.handoff is not None
            os.waitpid(spare.pid, 0)
            os.close(pidfd)
            self.own_fds -= {pidfd, spare.handoff.fileno()}
            spare.handoff.close()
            now = time.monotonic()
            self.spare_deaths = [t for t in self.spare_deaths if t > now - 10] + [now]
            if len(self.spare_deaths) > 5:  # pragma: no cover - a crash at every fork
                self.note("spares-dying")
                self.stop()
            return
        _, status = os.waitpid(child.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        os.close(pidfd)
        self.own_fds.discard(pidfd)
        if child.reported is None:  # a signal ended it, or it exited some other way
            self.tell(child, b"exit %d\n" % code if code >= 0 else b"signal %d\n" % -code)
        self.close_handoff(child)
        self.note("command", command=child.command,
                  exit=code if child.reported is None else child.reported,
                  ms=round((time.monotonic() - child.started) * 1000, 1))

    def report(self, fd: int) -> None:
        """A child's exit code, sent just before it exits: the client is told
        now, while the child tears down."""
        child = self.by_handoff[fd]
        assert child.handoff is not None
        line = b""
        with contextlib.suppress(OSError):
            line = child.handoff.recv(64)
        word, _, value = line.partition(b" ")
        if word == b"exit" and value.strip().lstrip(b"-").isdigit():
            child.reported = int(value)
            self.tell(child, b"exit %d\n" % child.reported)
        self.close_handoff(child)

    def close_handoff(self, child: _Child) -> None:
        if child.handoff is not None:
            fd = child.handoff.fileno()
            if self.by_handoff.pop(fd, None) is not None:
                self.sel.unregister(fd)
            self.own_fds.discard(fd)
            child.handoff.close()
            child.handoff = None

    def tell(self, child: _Child, line: bytes) -> None:
        """The client's last word; its connection is closed."""
        if child.conn is None:
            return
        fd = child.conn.fileno()
        if self.by_conn.pop(fd, None) is not None:
            self.sel.unregister(fd)
        self.own_fds.discard(fd)
        with contextlib.suppress(OSError):
            child.conn.sendall(line)
        child.conn.close()
        child.conn = None

    def client_gone(self, fd: int) -> None:
        child = self.by_conn[fd]
        assert child.conn is not None
        with contextlib.suppress(OSError):
            if child.conn.recv(1):
                return  # a client says nothing after its request; ignore it
        # Its client was killed: the child loses its terminal, as on a hang-up.
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGHUP)
        self.tell(child, b"")

    def await_request(self, handoff: socket.socket) -> None:
        """In the spare: wait for a request, become the client's process, run
        the command, tell the client how it ended, and exit."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for fd in self.own_fds | {self.changes.fd}:
                with contextlib.suppress(OSError):
                    os.close(fd)
            # A fresh interpreter's dispositions.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGHUP, signal.SIG_DFL)
            try:
                body, fds = _receive(handoff, 3)
            except BaseException:
                # The worker went away (its end closed), or the handoff broke:
                # EX_SOFTWARE, which the worker passes on to a waiting client.
                os._exit(70)
            req = launch.decode_request(body)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            os.environ.clear()
            os.environ.update(req.env)
            time.tzset()
            os.umask(req.umask)
            _fresh_stdio()
            sys.argv = [req.prog, *req.args]
            os.chdir(req.cwd)
            entry.run(req.args, prog_name=req.prog)
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except KeyboardInterrupt:
            code = 130
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            import atexit

            atexit._run_exitfuncs()
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            with contextlib.suppress(OSError):
                handoff.sendall(b"exit %d\n" % code)
            os._exit(code)


def _fresh_stdio() -> None:
    """sys.stdin, stdout and stderr over descriptors 0-2 as a starting
    interpreter makes them (stdout line-buffered on a terminal, stderr always):
    the worker's were made for /dev/null."""
    tty = os.isatty(1)
    # They live as long as the process: no context manager.
    streams = {
        "stdin": open(0, encoding="utf-8", errors="surrogateescape", closefd=False),  # noqa: SIM115
        "stdout": open(1, "w", encoding="utf-8", errors="surrogateescape",  # noqa: SIM115
                       buffering=1 if tty else -1, closefd=False),
        "stderr": open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1,  # noqa: SIM115
                       closefd=False),
    }
    for name, stream in streams.items():
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)  # what shutil.get_terminal_size() asks


def lock_path(path: str) -> str:
    return path.removesuffix(".sock") + ".lock"


def log_path(path: str) -> str:
    return path.removesuffix(".sock") + ".log"


def running_pid(path: str) -> int | None:
    """The pid of the worker holding `path`'s lock, or None when none does."""
    try:
        fd = os.open(lock_path(path), os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = f.read().strip()
            return int(text) if text.isdecimal() else -1
        return None


def open_log(path: str) -> TextIO:
    """The worker's log beside its socket, readable by its user only."""
    fd = os.open(log_path(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    return open(fd, "a", encoding="utf-8")


def run_worker(path: str, idle: float) -> None:
    """Serve at `path` until idle or stopped; exit 0 at once if another worker
    already serves it (two `worker start` racing)."""
    ensure_runtime_dir(os.path.dirname(path))
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return
    os.ftruncate(fd, 0)
    os.write(fd, b"%d\n" % os.getpid())
    with open_log(path) as log:
        Worker(path, idle, log, fd).serve()


if __name__ == "__main__":
    run_worker(sys.argv[1], float(sys.argv[2]))
