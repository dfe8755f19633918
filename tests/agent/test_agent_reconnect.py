"""qemu:///system through a real, private libvirtd: kill it under a running
agent → LibvirtConnected=False; start it again → True, and a full resync
makes status correct (including a domain that appeared while it was down).

The agent is the real `hvfleet agent` process. The test's own libvirt calls
use `qemu+unix://` (the same socket): in a process that has loaded the embedded
QEMU driver, plain `qemu:///system` would not reach libvirtd.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import libvirt
import pytest

from hvfleet.discovery.libvirt_conn import ensure_event_loop
from hvfleet.model import Hypervisor
from hvfleet.model.meta import find_condition
from hvfleet.store import open_store

from .conftest import MI, free_port, scrape, start_agent, wait_for
from .private_libvirtd import PrivateLibvirtd

DOMAIN = """<domain type='qemu'>
  <name>{name}</name>
  <uuid>{uuid}</uuid>
  <memory unit='MiB'>{mib}</memory>
  <vcpu>{vcpus}</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <devices><emulator>/usr/bin/qemu-system-x86_64</emulator></devices>
</domain>"""


@pytest.fixture
def libvirtd(tmp_path: Path) -> Iterator[PrivateLibvirtd]:
    daemon = PrivateLibvirtd(tmp_path / "libvirtd")
    daemon.start()
    yield daemon
    daemon.kill()


def condition(h: Hypervisor, type_: str) -> tuple[str, str] | None:
    c = find_condition(h.status.conditions, type_)
    return (c.status, c.reason) if c else None


def test_agent_survives_libvirtd_restart_and_resyncs(
    libvirtd: PrivateLibvirtd, tmp_path: Path
) -> None:
    ensure_event_loop()
    client_uri = libvirtd.uri.replace("qemu:", "qemu+unix:", 1)
    conn = libvirt.open(client_uri)
    conn.defineXML(DOMAIN.format(name="before", uuid="00000000-0000-4000-8000-000000000001",
                                 mib=128, vcpus=2))
    conn.close()

    db = tmp_path / "hv.db"
    port = free_port()
    agent = start_agent("--connect", libvirtd.uri, "--name", "sys-host", "--store",
                        f"sqlite:///{db}", "--metrics-addr", f"127.0.0.1:{port}")
    try:
        with open_store(f"sqlite:///{db}") as store:
            _, h = wait_for(store, "sys-host",
                            lambda h: condition(h, "LibvirtConnected") == ("True", "Connected"), 30)
            assert h.status.allocation["cpu"] == 2
            assert h.status.allocation["memory"] == 128 * MI

            libvirtd.kill()
            _, h = wait_for(store, "sys-host",
                            lambda h: condition(h, "LibvirtConnected") == ("False", "Disconnected"),
                            10)
            assert condition(h, "Ready") == ("False", "LibvirtDisconnected")
            cond = find_condition(h.status.conditions, "LibvirtConnected")
            assert cond is not None and libvirtd.uri in cond.message
            # the last observation is kept, not zeroed
            assert h.status.allocation["cpu"] == 2

            # While it is down, a domain appears in its configuration.
            (libvirtd.domain_config_dir / "during.xml").write_text(
                DOMAIN.format(name="during", uuid="00000000-0000-4000-8000-000000000002",
                              mib=256, vcpus=1)
            )
            libvirtd.start()
            _, h = wait_for(
                store, "sys-host",
                lambda h: condition(h, "LibvirtConnected") == ("True", "Connected")
                and h.status.allocation["cpu"] == 3,
                20,
            )
            assert h.status.allocation["memory"] == 384 * MI
            assert sorted(i.name for i in h.status.instances) == ["before", "during"]
            assert condition(h, "Ready") == ("True", "Reconciled")

        samples = scrape(port)
        labels = (("hypervisor", "sys-host"),)
        assert samples[("hvfleet_agent_libvirt_reconnects_total", labels)] == 1
        assert samples[("hvfleet_agent_libvirt_connected", labels)] == 1
    finally:
        started = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        rc = agent.wait(10)
        stopped_in = time.monotonic() - started
        err = agent.stderr.read() if agent.stderr else ""
    assert rc == 0, err
    assert stopped_in < 2.0
