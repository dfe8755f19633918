"""Generated guests define and start on real QEMU (in-process, TCG).

The host group is this machine's own capabilities, captured from the same
embedded QEMU driver the guests then run on, so `check='full'` really checks
the generated CPU against what QEMU gives.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import libvirt
import pytest
from lxml import etree

from hvfleet.discovery.capabilities import parse_host_capabilities
from hvfleet.guests.cpu import cpu_element
from hvfleet.guests.generate import generate
from hvfleet.guests.hosts import load_caps_dir
from hvfleet.guests.request import DiskSpec, GuestRequest, HostGroup

from .conftest import HOSTS


@pytest.fixture(scope="module")
def live_group(embed_conn: libvirt.virConnect) -> HostGroup:
    """This machine as a one-host group, captured live (virttype qemu: TCG)."""
    caps = parse_host_capabilities(
        embed_conn.getCapabilities(),
        embed_conn.getDomainCapabilities(None, "x86_64", "q35", "qemu", 0),
    )
    return HostGroup((("this-host", caps),))


def _disk(tmp: Path) -> DiskSpec:
    path = tmp / "root.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(path), "32M"], check=True)
    return DiskSpec.parse(f"kind=qcow2,source={path}")


def _start_and_stop(conn: libvirt.virConnect, xml: str) -> None:
    dom = conn.defineXML(xml)
    try:
        dom.create()
        deadline = time.monotonic() + 10
        while dom.state()[0] != libvirt.VIR_DOMAIN_RUNNING and time.monotonic() < deadline:
            time.sleep(0.1)
        assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
        # The running definition still carries our exact CPU with check='full'.
        live = etree.fromstring(dom.XMLDesc(0).encode())
        assert live.find("cpu").get("check") == "full"
        dom.destroy()
    finally:
        dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)


@pytest.mark.parametrize(
    ("os", "extra"),
    [("rhel9.1", {}), ("win11", {"secure_boot": True})],
    ids=["linux", "windows-efi-secureboot-tpm"],
)
def test_generated_guest_starts_on_real_qemu(
    embed_conn: libvirt.virConnect,
    live_group: HostGroup,
    tmp_path: Path,
    os: str,
    extra: dict[str, bool],
) -> None:
    req = GuestRequest(
        os=os, name=f"start-{os.replace('.', '-')}", vcpus=1, memory=256 << 20,
        disks=(_disk(tmp_path),), **extra,  # type: ignore[arg-type]
    )
    xml, plan = generate(req, live_group)
    assert plan.domain_type.value == "qemu"
    cpu_xml = etree.tostring(cpu_element(plan.cpu.value), encoding="unicode")
    result = embed_conn.compareHypervisorCPU(None, "x86_64", None, "qemu", cpu_xml, 0)
    assert result in (libvirt.VIR_CPU_COMPARE_IDENTICAL, libvirt.VIR_CPU_COMPARE_SUPERSET)
    if os == "win11":
        assert plan.tpm.value is not None and plan.firmware.value.secure_boot
        assert shutil.which("swtpm")
    _start_and_stop(embed_conn, xml)


def test_cpu_of_another_group_is_refused_by_this_host(
    embed_conn: libvirt.virConnect, live_group: HostGroup
) -> None:
    # An Icelake-based Intel group asks for features this host's TCG lacks:
    # libvirt itself must agree the CPU is incompatible here.
    _, plan = generate(
        GuestRequest(os="rhel9.1", name="foreign", vcpus=1, memory=256 << 20),
        load_caps_dir(str(HOSTS / "groups" / "single")),
    )
    cpu_xml = etree.tostring(cpu_element(plan.cpu.value), encoding="unicode")
    result = embed_conn.compareHypervisorCPU(None, "x86_64", None, "qemu", cpu_xml, 0)
    assert result == libvirt.VIR_CPU_COMPARE_INCOMPATIBLE
