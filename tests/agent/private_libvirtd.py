"""A private libvirtd for tests, never the machine's own.

Started as ARCHITECTURE.md describes: its own copy of /etc/libvirt, and in a
private mount (and network) namespace its own /run/libvirt and /var, so the
system's sockets, state, logs and networks are untouched. Clients reach it at
`qemu:///system?socket=BASE/run/libvirt-sock`; it is stopped by its PID.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import libvirt

QEMU_CONF = """stdio_handler = "file"
user = "root"
group = "root"
security_driver = "none"
cgroup_controllers = [ ]
"""


class PrivateLibvirtd:
    """`host_uuid` gives the daemon its own host UUID (two daemons on one
    machine must differ for libvirt to migrate between them); `netns_of` joins
    the network namespace of that PID (another private daemon's) instead of a
    new one, so the two daemons' QEMUs reach each other over 127.0.0.1."""

    def __init__(
        self, base: Path, host_uuid: str | None = None, netns_of: int | None = None
    ) -> None:
        self.base = base
        self.netns_of = netns_of
        self.proc: subprocess.Popen[bytes] | None = None
        etc = base / "etc"
        if not etc.exists():
            shutil.copytree("/etc/libvirt", etc, symlinks=True)
            (etc / "qemu.conf").write_text(QEMU_CONF)
            # Never bring up the default network of a copied config.
            shutil.rmtree(etc / "qemu" / "networks" / "autostart", ignore_errors=True)
            if host_uuid:
                with open(etc / "libvirtd.conf", "a") as conf:
                    conf.write(f'\nhost_uuid = "{host_uuid}"\n')
        for d in ("run", "var/lib/libvirt", "var/cache/libvirt", "var/log/libvirt", "var/tmp"):
            (base / d).mkdir(parents=True, exist_ok=True)
        for link, target in (("var/run", "/run"), ("var/lock", "/run/lock")):
            if not (base / link).is_symlink():
                os.symlink(target, base / link)

    @property
    def socket(self) -> Path:
        return self.base / "run" / "libvirt-sock"

    @property
    def uri(self) -> str:
        return f"qemu:///system?socket={self.socket}"

    @property
    def domain_config_dir(self) -> Path:
        """Where this libvirtd keeps persistent domain XML (its /etc/libvirt/qemu)."""
        return self.base / "etc" / "qemu"

    def start(self, timeout: float = 60) -> None:
        b = self.base
        # A new network namespace starts with its loopback down.
        lo_up = "ip link set lo up && " if self.netns_of is None else ""
        script = lo_up + (
            f"mount --bind {b}/etc /etc/libvirt && mount --bind {b}/run /run/libvirt && "
            f"mount --bind {b}/var /var && exec libvirtd --pid-file {b}/libvirtd.pid"
        )
        log = open(b / "libvirtd.log", "ab")  # noqa: SIM115 - lives as long as the daemon
        if self.netns_of is None:
            argv = ["unshare", "-m", "-n", "--propagation", "private", "sh", "-c", script]
        else:
            argv = ["nsenter", f"--net=/proc/{self.netns_of}/ns/net", "unshare", "-m",
                    "--propagation", "private", "sh", "-c", script]
        self.proc = subprocess.Popen(
            argv,
            stdout=log, stderr=log, stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"libvirtd exited {self.proc.returncode}; see {b}/libvirtd.log")
            if self.socket.exists():
                try:
                    libvirt.open(self.uri).close()
                    return
                except libvirt.libvirtError:
                    pass
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"libvirtd did not answer within {timeout}s; see {b}/libvirtd.log")

    def kill(self) -> None:
        """SIGKILL by PID (`exec` made the unshare'd shell the daemon itself)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None
