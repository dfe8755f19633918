"""Modes software and none apply to every host-dependent decision (policy 2026.2),
and a mode-none guest for a mixed-vendor group defines and starts on real QEMU."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import libvirt
import pytest
from lxml import etree

from hvfleet.discovery.capabilities import parse_host_capabilities
from hvfleet.guests.check import check_domain
from hvfleet.guests.errors import NotEverywhere
from hvfleet.guests.generate import generate
from hvfleet.guests.hosts import load_caps_dir
from hvfleet.guests.request import DiskSpec, GuestRequest, HostGroup, NicSpec
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import CPUTopology

from .conftest import HOSTS

GROUPS = HOSTS / "groups"
OSES = ("win11", "win2k22", "rhel9.1", "ubuntu22.04", "fedora37", "linux2022")


@cache
def group(name: str) -> HostGroup:
    return load_caps_dir(str(GROUPS / name))


def req(os: str, mode: str, policy: str = "2026.2", **kw: object) -> GuestRequest:
    base: dict[str, object] = {
        "os": os, "name": "m", "vcpus": 4, "memory": 2 << 30, "mode": mode, "policy": policy,
        "disks": (DiskSpec.parse("kind=qcow2,source=/i/a.qcow2"),),
        "nics": (NicSpec.parse("network=default"),),
    }
    base.update(kw)
    return GuestRequest(**base)  # type: ignore[arg-type]


def without_provenance(xml: str) -> str:
    """The XML minus what names the group (inputs digest, host list)."""
    xml = re.sub(r"<hvfleet:inputs-digest>[^<]*</hvfleet:inputs-digest>", "", xml)
    return re.sub(r"<hvfleet:hosts>.*?</hvfleet:hosts>", "", xml, flags=re.S)


@pytest.mark.parametrize("os", OSES)
def test_mode_none_decides_from_os_and_policy_alone(os: str) -> None:
    # Three groups of different vendors, generations and QEMU versions: the same
    # guest, because mode none asks the hosts nothing (only that they can run it).
    outs = {g: without_provenance(generate(req(os, "none"), group(g))[0])
            for g in ("intel-same", "intel-mixed", "amd-mixed", "mixed-vendor")}
    assert len(set(outs.values())) == 1, {g: len(x) for g, x in outs.items()}
    dom = etree.fromstring(next(iter(outs.values())).encode())
    assert dom.find("os/type").get("machine") == "pc-q35-4.2"  # the policy floor's
    assert dom.find("features/hyperv/evmcs") is None
    assert dom.find("cpu/topology").get("sockets") == "1"  # hosts' topology not used


@pytest.mark.parametrize("mode", ["none", "software"])
@pytest.mark.parametrize("os", OSES)
def test_mixed_vendor_guest_passes_check_on_every_host(os: str, mode: str) -> None:
    g = group("mixed-vendor")
    xml, _ = generate(req(os, mode), g)
    verdicts = check_domain(etree.fromstring(xml.encode()), g)
    assert all(v.ok for v in verdicts), [(v.host, v.problems) for v in verdicts]


def test_software_mode_leaves_hardware_facts_out_of_every_decision() -> None:
    # An all-Intel group would get evmcs and a host-fitted topology in intersection mode.
    fitted = HostGroup(tuple((n, c.model_copy(update={"cpu_topology": CPUTopology(cores=2)}))
                             for n, c in group("intel-same").hosts))
    _, inter = generate(req("win2k22", "intersection"), fitted)
    _, soft = generate(req("win2k22", "software"), fitted)
    assert inter.hyperv.value is not None and "evmcs" in inter.hyperv.value.features
    assert soft.hyperv.value is not None and "evmcs" not in soft.hyperv.value.features
    assert inter.topology.value is not None and inter.topology.value.sockets == 2
    assert soft.topology.value is not None and soft.topology.value.sockets == 1
    # software facts still count: the highest common machine type, not the floor
    assert soft.machine.value == "pc-q35-7.2"


def test_policy_2026_1_keeps_modes_for_the_cpu_only() -> None:
    _, old = generate(req("win2k22", "none", "2026.1"), group("intel-same"))
    assert old.machine.value == "pc-q35-7.2"
    assert old.hyperv.value is not None and "evmcs" in old.hyperv.value.features


def test_mode_none_refuses_a_host_below_the_floor_naming_host_and_field() -> None:
    hosts = list(group("intel-mixed").hosts)
    name, caps = hosts[0]
    hosts[0] = (name, caps.model_copy(update={"machine_types": [
        m for m in caps.machine_types if m.name != "pc-q35-4.2" and m.canonical != "pc-q35-4.2"]}))
    with pytest.raises(NotEverywhere, match=rf"^machine: mode none .*pc-q35-4\.2.*{name}"):
        generate(req("rhel9.1", "none"), HostGroup(tuple(hosts)))


@pytest.fixture(scope="module")
def this_host(embed_conn: libvirt.virConnect) -> tuple[str, object]:
    return ("this-host", parse_host_capabilities(
        embed_conn.getCapabilities(),
        embed_conn.getDomainCapabilities(None, "x86_64", "q35", "qemu", 0),
    ))


@pytest.mark.parametrize("os", ["rhel9.1", "win2k22"])
def test_mode_none_guest_for_mixed_vendors_defines_and_starts_on_real_qemu(
    embed_conn: libvirt.virConnect, this_host: tuple[str, object], os: str, tmp_path: Path
) -> None:
    # The mixed-vendor group (Intel Ice Lake + AMD Milan) plus this machine
    # (TCG, an EPYC-like CPU): one mode-none guest for all three.
    g = HostGroup((*group("mixed-vendor").hosts, this_host))  # type: ignore[arg-type]
    xml, plan = generate(req(os, "none", name=f"none-{os.replace('.', '-')}", memory=256 << 20,
                             disks=(), nics=()), g)
    verdicts = check_domain(etree.fromstring(xml.encode()), g)
    assert all(v.ok for v in verdicts), [(v.host, v.problems) for v in verdicts]
    dom = embed_conn.defineXML(xml)
    try:
        dom.create()
        assert dom.isActive()
        live = etree.fromstring(dom.XMLDesc(0).encode())
        assert live.find("os/type").get("machine") == plan.machine.value
        dom.destroy()
    finally:
        dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)


def test_guest_memory_is_refused_past_what_libvirt_defines_and_defined_up_to_it(
        embed_conn: libvirt.virConnect) -> None:
    """libvirt takes a domain's memory in KiB up to 2**53 - 1 (a larger value
    is "numerical overflow: value too large"; 1e30 bytes "Invalid value").
    `--memory 8Ei` or `1e30` made XML no libvirt would define; now the
    request is refused naming memory, and the largest one libvirt takes is
    generated and defined by libvirt."""
    most = (2**53 - 1) * 1024
    xml, _ = generate(req("rhel9.1", "intersection", memory=most), group("intel-mixed"))
    dom = embed_conn.defineXML(xml)
    assert dom.maxMemory() == 2**53 - 1
    dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
    for too_much in (most + 1024, 2**63, 10**30):
        with pytest.raises(InvalidInput) as err:
            req("rhel9.1", "intersection", memory=too_much)
        assert err.value.field == "memory" and "8Ei" in str(err.value)


def test_what_libvirt_refuses_in_a_disk_or_nic_is_refused_and_what_it_takes_is_defined(
        embed_conn: libvirt.virConnect) -> None:
    """`guest generate` exited 0 with XML libvirt's defineXML refused: a
    multicast MAC ("expected unicast mac address"), a port out of range or
    not a number, an IPv6 monitor address, a fifth disk on the one IDE
    controller, more NICs than PCI slots; and a traceback for a control
    character. Each is now refused naming its field; the edge values libvirt
    takes are generated and defined by libvirt's QEMU driver."""
    from hvfleet.guests.request import MAX_NICS

    for bad in ("network=default,mac=01:00:5e:00:00:01", "network=default,mac=ff:ff:ff:ff:ff:ff",
                "network=net\x01"):
        with pytest.raises(InvalidInput, match="nics"):
            NicSpec.parse(bad)
    for bad in ("kind=network,protocol=rbd,source=pool/img,host=mon1:99999",
                "kind=network,protocol=rbd,source=pool/img,host=mon1:abc",
                "kind=network,protocol=rbd,source=pool/img,host=::1:6789",
                "kind=network,protocol=rbd,source=pool/img,host=mon\x1b1",
                "kind=qcow2,source=/tmp/a\x01b.qcow2"):
        with pytest.raises(InvalidInput, match="disks"):
            DiskSpec.parse(bad)
    with pytest.raises(InvalidInput, match=f"at most {MAX_NICS} NICs"):
        req("rhel9.1", "intersection", nics=(NicSpec.parse("network=default"),) * (MAX_NICS + 1))
    ide = tuple(DiskSpec.parse(f"kind=qcow2,source=/i/{i}.qcow2") for i in range(5))
    with pytest.raises(InvalidInput, match="at most 4 disks on the ide bus"):
        generate(req("winxp", "intersection", memory=512 << 20, disks=ide), group("intel-mixed"))
    taken = [
        req("rhel9.1", "intersection", name="edges", memory=256 << 20, disks=(
            DiskSpec.parse("kind=network,protocol=rbd,source=pool/a,host=[::1]:6789"),
            DiskSpec.parse("kind=network,protocol=rbd,source=pool/b,host=mon1:65535"),
            DiskSpec.parse("kind=network,protocol=rbd,source=pool/c,host=10.0.0.1")),
            nics=(NicSpec.parse("network=default,mac=52:54:00:00:00:01"),
                  *(NicSpec.parse("network=default"),) * (MAX_NICS - 1))),
        req("winxp", "intersection", name="ide4", memory=512 << 20, disks=ide[:4]),
    ]
    for request in taken:
        xml, _ = generate(request, group("intel-mixed"))
        dom = embed_conn.defineXML(xml)
        try:
            defined = etree.fromstring(dom.XMLDesc(0).encode())
        finally:
            dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
        if request.name == "edges":
            hosts = [(h.get("name"), h.get("port")) for h in defined.iter("host")]
            assert hosts == [("::1", "6789"), ("mon1", "65535"), ("10.0.0.1", None)]
            assert len(defined.findall("devices/interface")) == MAX_NICS
        else:
            assert [t.get("bus") for t in defined.iter("target")] == ["ide"] * 4
