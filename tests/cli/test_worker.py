"""The warm worker (`hvfleet worker start`, worker/launch.py, worker/forkserver.py):
a command run through it is the same command, with the same output, exit
code, standard input, working directory, environment and terminal as in its
own process; Ctrl-C and a killed client reach the command; changed code is
never served; and nobody else's socket is ever used.

Every test runs the real console script as a subprocess, with its own
XDG_RUNTIME_DIR so its worker is its own, and reads the worker's log to know
the worker (not a silent fallback) ran the command."""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HVFLEET = str(Path(sys.executable).with_name("hvfleet"))
GROUP = ROOT / "examples" / "hosts" / "groups" / "intel-mixed"
GENERATE = ["guest", "generate", "--os", "rhel9.1", "--name", "w", "--vcpus", "2",
            "--memory", "4Gi", "--disk", "kind=qcow2,source=/var/lib/img/w.qcow2",
            "--nic", "network=default"]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    # A short directory: a Unix socket's path has at most 107 bytes.
    run = tempfile.mkdtemp(prefix="hvw-", dir="/tmp")
    e = {**os.environ, "XDG_RUNTIME_DIR": run, "HVFLEET_STORE": f"sqlite:///{tmp_path}/db.sqlite"}
    e.pop("HVFLEET_WORKER", None)
    yield e
    subprocess.run([HVFLEET, "worker", "stop"], env=e, capture_output=True, timeout=60)
    shutil.rmtree(run, ignore_errors=True)


def hv(env: dict[str, str], *args: str, worker: bool = True,
       **kw: object) -> subprocess.CompletedProcess[str]:
    e = {**env, **({} if worker else {"HVFLEET_WORKER": "0"})}
    return subprocess.run([HVFLEET, *args], env=e, capture_output=True, text=True,
                          timeout=120, **kw)  # type: ignore[call-overload, no-any-return]


def start(env: dict[str, str], *extra: str) -> None:
    r = hv(env, "worker", "start", *extra)
    assert r.returncode == 0, r.stderr
    assert "worker started" in r.stdout


def log(env: dict[str, str]) -> list[dict[str, object]]:
    [path] = Path(env["XDG_RUNTIME_DIR"], "hvfleet").glob("worker-*.log")
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def served(env: dict[str, str], at_least: int = 0) -> list[dict[str, object]]:
    """The commands the worker ran, once at least `at_least` of them are
    logged (the worker logs a command when its child is reaped, just after
    the client was told how it ended)."""
    deadline = time.monotonic() + 15
    while True:
        got = [e for e in log(env) if e["event"] == "command"]
        if len(got) >= at_least or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


def _aged(text: str) -> str:
    """`text` with ages (AGE columns: 0s, 12m) made alike: the two runs of a
    command compared are a second apart, and a wider age pads its column (a
    last column's too: `9s ` under `AGE`, then `10s`)."""
    return re.sub(r" +(?=\n|$)", "", re.sub(r" +", " ", re.sub(r"\b\d+[smhd]\b", "AGE", text)))


def seed(env: dict[str, str]) -> None:
    """edge-01 in the store, as its agent reports it."""
    edge = ROOT / "examples" / "fleet" / "edge-01.xml"
    r = hv(env, "agent", "--connect", f"test://{edge}", "--once")
    assert r.returncode == 0, r.stderr


def test_commands_in_the_worker_print_and_exit_as_in_their_own_process(env: dict[str, str]) -> None:
    start(env)
    seed(env)
    cases = [
        [*GENERATE, "--caps-dir", str(GROUP)],
        ["guest", "generate", "--os", "no-such-os", "--name", "x", "--vcpus", "1", "--memory", "1Gi",
         "--caps-dir", str(GROUP)],  # exit 2, one line on stderr
        ["get", "hypervisors", "-o", "json"],
        ["get", "hypervisors"],
        ["get", "hypervisor", "no-such-host"],  # NotFound: exit 1
        ["describe", "hypervisor", "edge-01"],
        ["capacity", "-o", "json"],
        ["fit", "--cpu", "1", "-o", "json"],
        ["guest", "policies"],
        ["--help"],
        ["get", "--no-such-flag"],  # a usage error: Click's exit 2
        ["no-such-command"],
    ]
    for args in cases:
        alone = hv(env, *args, worker=False)
        before = len(served(env))
        warm = hv(env, *args)
        got = (warm.returncode, _aged(warm.stdout), warm.stderr)
        assert got == (alone.returncode, _aged(alone.stdout), alone.stderr), args
        assert len(served(env, before + 1)) == before + 1, f"{args} did not run in the worker"
    codes = {e["exit"] for e in served(env)}
    assert {0, 1, 2} <= codes


def test_stdin_cwd_umask_and_environment_are_the_clients(env: dict[str, str], tmp_path: Path) -> None:
    start(env)
    manifest = (
        "apiVersion: hvfleet.io/v1\nkind: OvercommitPolicy\nmetadata: {name: from-stdin}\n"
        "spec: {priority: 1, overcommit: {cpu: 2}}\n"
    )
    r = hv(env, "apply", "-f", "-", input=manifest)
    assert r.returncode == 0, r.stderr
    # The same store, read without the worker: the write landed there.
    got = hv(env, "get", "overcommitpolicies", "-o", "json", worker=False)
    assert "from-stdin" in got.stdout
    # A relative path resolves against the client's working directory.
    work = tmp_path / "work"
    shutil.copytree(GROUP, work / "group")
    out = work / "guest.xml"
    r = hv(env, *GENERATE, "--caps-dir", "group", "--output", "guest.xml", cwd=work)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == hv(env, *GENERATE, "--caps-dir", str(GROUP), worker=False).stdout
    # The file is created under the client's umask.
    (work / "guest.xml").unlink()
    r = subprocess.run(["sh", "-c", f"umask 077 && exec {HVFLEET} \"$@\"", "sh", *GENERATE,
                        "--caps-dir", "group", "--output", "guest.xml"],
                       env=env, cwd=work, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_mode & 0o777 == 0o600
    # Another store named by the environment is the one used.
    other = {**env, "HVFLEET_STORE": f"sqlite:///{tmp_path}/other.db"}
    assert "from-stdin" not in hv(other, "get", "overcommitpolicies", "-o", "json").stdout
    assert len(served(env, 4)) == 4


def test_a_terminal_is_the_clients_terminal(env: dict[str, str]) -> None:
    """On a pseudo-terminal 70 columns wide, a Rich table is laid out for it,
    as in its own process (which sees a terminal and asks its size)."""
    start(env)
    seed(env)

    def on_pty(worker: bool) -> bytes:
        master, slave = pty.openpty()
        termios.tcsetwinsize(slave, (40, 70))
        e = {**env, **({} if worker else {"HVFLEET_WORKER": "0"})}
        e.pop("COLUMNS", None)
        proc = subprocess.Popen([HVFLEET, "describe", "hypervisor", "edge-01"], env=e,
                                stdin=slave, stdout=slave, stderr=slave)
        os.close(slave)
        out = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other end is closed
                break
            if not chunk:
                break
            out += chunk
        proc.wait(60)
        os.close(master)
        return out

    alone = on_pty(False)
    before = len(served(env))
    assert on_pty(True) == alone
    assert len(served(env, before + 1)) == before + 1
    text = re.sub(r"\x1b\[[0-9;]*m", "", alone.decode())
    assert "\x1b[1m" in alone.decode()  # bold headers: it saw a terminal
    assert max(len(line) for line in text.splitlines()) <= 70


def _blocked(env: dict[str, str]) -> subprocess.Popen[str]:
    """`apply -f -` waiting for the manifest on a pipe that stays open."""
    proc = subprocess.Popen([HVFLEET, "apply", "-f", "-"], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None
    pipe = f"pipe:[{os.fstat(proc.stdin.fileno()).st_ino}]"
    deadline = time.monotonic() + 60
    while not _reading(pipe):  # the command itself, here or in the worker's child
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    return proc


def _reading(pipe: str) -> bool:
    """Whether some process is blocked in read(2) on its stdin, `pipe`."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/fd/0") != pipe:
                continue
            with open(f"/proc/{pid}/syscall") as f:
                call = f.read().split()
        except OSError:
            continue
        if call[:2] == ["0", "0x0"]:  # x86-64 read, fd 0
            return True
    return False


def test_ctrl_c_reaches_the_command_and_its_exit_code_comes_back(env: dict[str, str]) -> None:
    start(env)
    alone = _blocked({**env, "HVFLEET_WORKER": "0"})
    alone.send_signal(signal.SIGINT)
    alone_code = alone.wait(30)
    warm = _blocked(env)
    warm.send_signal(signal.SIGINT)
    assert warm.wait(30) == alone_code == 130
    assert served(env, 1)[-1]["exit"] == 130


def test_a_killed_client_takes_its_command_with_it(env: dict[str, str]) -> None:
    start(env)
    warm = _blocked(env)
    warm.send_signal(signal.SIGKILL)
    warm.wait(30)
    assert served(env, 1), "the command outlived its client"
    assert served(env)[-1]["exit"] == -signal.SIGHUP


def test_changed_code_is_never_served(env: dict[str, str], tmp_path: Path) -> None:
    """A package installed into a directory on sys.path (here one on
    PYTHONPATH) changes what a fresh process would import: the worker says
    stale, the client runs the command itself, and the worker exits."""
    extra = tmp_path / "site"
    extra.mkdir()
    env = {**env, "PYTHONPATH": f"{extra}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep)}
    start(env)
    want = hv(env, *GENERATE, "--caps-dir", str(GROUP), worker=False).stdout
    assert hv(env, *GENERATE, "--caps-dir", str(GROUP)).stdout == want
    assert len(served(env, 1)) == 1
    (extra / "newly_installed.py").write_text("")
    r = hv(env, *GENERATE, "--caps-dir", str(GROUP))
    assert (r.returncode, r.stdout) == (0, want)
    assert len(served(env)) == 1
    assert [e["event"] for e in log(env)][-2:] == ["stale", "stop"]
    assert hv(env, "worker", "status").returncode == 1


def test_a_socket_someone_else_serves_is_not_used(env: dict[str, str]) -> None:
    """Another user who made the socket first gets nothing: not the
    environment (it may hold a token), not the terminal."""
    from hvfleet.worker.launch import installation_tag

    if os.getuid() != 0:  # CI runs as root, which can act as another user
        pytest.skip("acting as another user needs root")
    os.chmod(env["XDG_RUNTIME_DIR"], 0o755)  # the other user can reach its directory
    directory = Path(env["XDG_RUNTIME_DIR"], "hvfleet")
    directory.mkdir(mode=0o700)
    os.chown(directory, 65534, 65534)
    path = directory / f"worker-{installation_tag()}.sock"
    ready_r, ready_w = os.pipe()
    got_r, got_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user: listen, and report whatever a client sends
        try:
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(str(path))
            s.listen(1)
            os.write(ready_w, b"1")
            conn, _ = s.accept()
            conn.settimeout(10)
            data = b""
            try:
                while chunk := conn.recv(65536):
                    data += chunk
            except OSError:
                pass
            os.write(got_w, struct.pack("I", len(data)))
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(got_w)
    assert os.read(ready_r, 1) == b"1"
    r = hv({**env, "HVFLEET_TOKEN": "secret"}, *GENERATE, "--caps-dir", str(GROUP))
    assert r.returncode == 0
    assert r.stdout == hv(env, *GENERATE, "--caps-dir", str(GROUP), worker=False).stdout
    assert "served by uid 65534" in r.stderr
    assert struct.unpack("I", os.read(got_r, 4)) == (0,)
    os.waitpid(pid, 0)
    # And no worker of ours starts in a directory that user owns.
    r = hv(env, "worker", "start")
    assert r.returncode == 1
    assert "owned by uid 0" in r.stderr or f"owned by uid {os.getuid()}" in r.stderr


def test_a_bad_request_is_declined_and_the_worker_keeps_serving(env: dict[str, str]) -> None:
    start(env)
    [path] = Path(env["XDG_RUNTIME_DIR"], "hvfleet").glob("worker-*.sock")
    for garbage in (b"not a request", b"%08x" % (2 << 20)):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(path))
            s.sendall(garbage)
            s.shutdown(socket.SHUT_WR)
            answer = s.recv(4096)
        assert answer.startswith(b"decline "), answer
    r = hv(env, *GENERATE, "--caps-dir", str(GROUP))
    assert r.returncode == 0 and "<domain" in r.stdout
    assert len(served(env, 1)) == 1
    # A client whose request is too large (an environment of 1.2 MB; one
    # variable holds at most 128 KiB) is declined and runs the command itself.
    big = {f"BIG{i}": "x" * 120_000 for i in range(10)}
    r = hv({**env, **big}, *GENERATE, "--caps-dir", str(GROUP))
    assert r.returncode == 0 and "<domain" in r.stdout, r.stderr
    assert len(served(env)) == 1
    assert [e["event"] for e in log(env)].count("declined") == 3, log(env)


def test_start_stop_status_and_the_idle_timeout(env: dict[str, str]) -> None:
    assert hv(env, "worker", "status").returncode == 1
    start(env, "--idle-timeout", "6s")  # past the two commands below, even on a loaded machine
    again = hv(env, "worker", "start")
    assert again.returncode == 0 and "already running" in again.stdout
    status = hv(env, "worker", "status")
    assert status.returncode == 0 and "worker running: pid" in status.stdout
    mode = Path(env["XDG_RUNTIME_DIR"], "hvfleet").stat().st_mode & 0o777
    assert mode == 0o700
    deadline = time.monotonic() + 40
    while hv(env, "worker", "status").returncode == 0:
        assert time.monotonic() < deadline, "the idle worker did not exit"
        time.sleep(0.2)
    assert [e["event"] for e in log(env)][-2:] == ["idle", "stop"]
    start(env)
    stopped = hv(env, "worker", "stop")
    assert stopped.returncode == 0 and "worker stopped" in stopped.stdout
    assert hv(env, "worker", "status").returncode == 1
    bad = hv(env, "worker", "start", "--idle-timeout", "-5m")
    assert bad.returncode == 2 and "--idle-timeout" in bad.stderr
