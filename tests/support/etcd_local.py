"""Private etcd members and clusters on 127.0.0.1, for tests, benches and demos.

Starts the Debian `etcd` binary (package `etcd-server`) on free loopback ports
with its data in a directory the caller owns, and stops it by its own PID: no
system service, no other machine, nothing left running. A cluster can lose a
member (SIGKILL, as a crash would), find and kill its leader, and be stopped
and restarted from the same data directories, which is what the fault tests
need.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from hvfleet.model.errors import Unavailable

ETCD_BINARY = "etcd"


def free_port() -> int:
    """A TCP port nothing listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _post_json(url: str, body: dict[str, object], timeout: float) -> dict[str, object]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        out: dict[str, object] = json.loads(resp.read())
        return out


@dataclass
class EtcdMember:
    """One etcd process. `start()` may be called again after `kill()`/`stop()`:
    it restarts from the same data directory, as a rebooted machine would."""

    name: str
    data_dir: Path
    client_port: int
    peer_port: int
    initial_cluster: str = ""
    cluster_token: str = "hvfleet-test"
    # Faster elections than etcd's defaults (100 ms / 1 s): fault tests wait less.
    heartbeat_ms: int = 50
    election_ms: int = 500
    extra_args: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None
    started_once: bool = False

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def command(self) -> list[str]:
        initial = self.initial_cluster or f"{self.name}={self.peer_url}"
        return [
            ETCD_BINARY,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", initial,
            "--initial-cluster-token", self.cluster_token,
            "--initial-cluster-state", "new",
            "--heartbeat-interval", str(self.heartbeat_ms),
            "--election-timeout", str(self.election_ms),
            "--logger", "zap",
            "--log-level", "error",
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> None:
        if self.running:
            return
        if shutil.which(ETCD_BINARY) is None:
            raise Unavailable(
                f"{ETCD_BINARY}: not found on PATH (install the Debian package etcd-server)"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir.parent / f"{self.name}.log", "ab")  # noqa: SIM115
        try:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        finally:
            log.close()
        self.started_once = True

    def kill(self) -> None:
        """SIGKILL, as a crash or power loss of this member would be."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM and wait; SIGKILL if it does not exit in 10 s."""
        self._signal(signal.SIGTERM)

    def _signal(self, sig: signal.Signals) -> None:
        p = self.process
        if p is None or p.poll() is not None:
            self.process = None
            return
        p.send_signal(sig)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
        self.process = None

    def status(self, timeout: float = 1.0) -> dict[str, object]:
        """etcd's maintenance status of this member (raises OSError if down)."""
        return _post_json(f"{self.client_url}/v3/maintenance/status", {}, timeout)

    def member_id(self) -> str:
        header = self.status()["header"]
        assert isinstance(header, dict)
        return str(header["member_id"])

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.client_url}/health", timeout=1.0) as resp:
                body = json.loads(resp.read())
            return str(body.get("health")) == "true"
        except (OSError, ValueError):
            return False

    def log_tail(self, lines: int = 20) -> str:
        path = self.data_dir.parent / f"{self.name}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class EtcdCluster:
    """`size` members on 127.0.0.1 with data under `base_dir`. Use as a context
    manager, or call `start()`/`stop()`; every member started is stopped."""

    def __init__(self, base_dir: Path, size: int = 1, *, extra_args: list[str] | None = None):
        self.base_dir = Path(base_dir)
        token = f"hvfleet-{os.getpid()}-{free_port()}"
        self.members = [
            EtcdMember(
                name=f"m{i}",
                data_dir=self.base_dir / f"m{i}.etcd",
                client_port=free_port(),
                peer_port=free_port(),
                cluster_token=token,
                extra_args=list(extra_args or []),
            )
            for i in range(size)
        ]
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for m in self.members:
            m.initial_cluster = initial

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def url(self, prefix: str | None = None) -> str:
        """The store URL for hvfleet: `etcd://host:port,host:port[?prefix=...]`."""
        base = "etcd://" + ",".join(self.endpoints)
        return base if prefix is None else f"{base}?prefix={prefix}"

    def start(self, timeout: float = 30.0) -> EtcdCluster:
        for m in self.members:
            m.start()
        self.wait_ready(timeout)
        return self

    def stop(self) -> None:
        for m in self.members:
            m.stop()

    def kill_all(self) -> None:
        for m in self.members:
            m.kill()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every running member answers and the cluster has a leader."""
        deadline = time.monotonic() + timeout
        while True:
            running = [m for m in self.members if m.running]
            dead = [m for m in self.members if m.process is not None and not m.running]
            if dead:
                m = dead[0]
                raise Unavailable(f"etcd member {m.name} exited on start:\n{m.log_tail()}")
            if running and all(m.healthy() for m in running) and self.leader() is not None:
                return
            if time.monotonic() > deadline:
                tails = "\n".join(f"{m.name}: {m.log_tail(5)}" for m in self.members)
                raise Unavailable(
                    f"etcd cluster at {self.endpoints} not ready in {timeout}s\n{tails}"
                )
            time.sleep(0.05)

    def leader(self) -> EtcdMember | None:
        """The member that is leader now, as the running members report it."""
        ids: dict[str, EtcdMember] = {}
        leader_id: str | None = None
        for m in self.members:
            if not m.running:
                continue
            with contextlib.suppress(OSError, ValueError, KeyError):
                st = m.status()
                header = st["header"]
                assert isinstance(header, dict)
                ids[str(header["member_id"])] = m
                if str(st.get("leader", "0")) != "0":
                    leader_id = str(st["leader"])
        return ids.get(leader_id) if leader_id is not None else None

    def follower(self) -> EtcdMember:
        leader = self.leader()
        for m in self.members:
            if m.running and m is not leader:
                return m
        raise Unavailable(f"etcd cluster at {self.endpoints}: no running follower")

    def __enter__(self) -> EtcdCluster:
        try:
            return self.start()
        except BaseException:
            self.kill_all()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
