"""Policy 2026.2's deliberate changes, and that 2026.1 ignores them."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import libvirt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree
from typer.testing import CliRunner

import hvfleet.cli.guest  # noqa: F401  (registers the commands)
from hvfleet.cli.main import app
from hvfleet.discovery.capabilities import parse_host_capabilities
from hvfleet.guests.check import check_domain
from hvfleet.guests.generate import generate
from hvfleet.guests.hosts import load_caps_dir
from hvfleet.guests.policy import POLICIES
from hvfleet.guests.request import DiskSpec, GuestRequest, HostGroup, NicSpec
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import CPUTopology

from .conftest import HOSTS

GROUPS = HOSTS / "groups"


@cache
def group(name: str) -> HostGroup:
    return load_caps_dir(str(GROUPS / name))


def with_facts(g: HostGroup, **update: object) -> HostGroup:
    return HostGroup(tuple((n, c.model_copy(update=update)) for n, c in g.hosts))


def req(os: str, policy: str = "2026.2", **kw: object) -> GuestRequest:
    base: dict[str, object] = {
        "os": os, "name": "g", "vcpus": 4, "memory": 4 << 30, "policy": policy,
        "disks": (DiskSpec.parse("kind=qcow2,source=/i/a.qcow2"),
                  DiskSpec.parse("kind=block,source=/dev/vg/b"),
                  DiskSpec.parse("kind=network,protocol=rbd,source=p/i")),
        "nics": (NicSpec.parse("network=default"),),
    }
    base.update(kw)
    return GuestRequest(**base)  # type: ignore[arg-type]


def _no_digest(xml: str) -> str:
    return re.sub(r"<hvfleet:inputs-digest>[^<]*<", "<", xml)


def dom(xml: str) -> etree._Element:
    return etree.fromstring(xml.encode())


def test_windows_11_with_4_vcpus_gets_at_most_2_sockets_only_from_2026_2() -> None:
    old = dom(generate(req("win11", "2026.1"), group("intel-same"))[0])
    assert old.find("cpu/topology") is None  # libvirt's default: 4 sockets
    new = dom(generate(req("win11"), group("intel-same"))[0])
    t = new.find("cpu/topology")
    assert t is not None and (t.get("sockets"), t.get("cores"), t.get("threads")) == ("2", "2", "1")
    # <topology> sits where libvirt writes it: after model and vendor.
    assert [c.tag for c in new.find("cpu")][:3] == ["model", "vendor", "topology"]


@settings(max_examples=150, deadline=None)
@given(vcpus=st.integers(1, 96), cores=st.integers(1, 32),
       os=st.sampled_from(["win11", "win10", "win2k22", "rhel9.1", "ubuntu22.04"]))
def test_topology_multiplies_out_respects_os_limit_and_fits_hosts(
    vcpus: int, cores: int, os: str
) -> None:
    g = with_facts(group("intel-same"), cpu_topology=CPUTopology(sockets=2, cores=cores))
    _, plan = generate(req(os, vcpus=vcpus, disks=(), nics=()), g)
    t = plan.topology.value
    assert t is not None and t.sockets * t.cores * t.threads == vcpus
    if os in ("win11", "win10"):
        assert t.sockets <= 2
    divisors = [s for s in range(1, vcpus + 1) if vcpus % s == 0]
    if os in ("win11", "win10"):
        divisors = [s for s in divisors if s <= 2]
    fits = [s for s in divisors if vcpus // s <= cores]
    # the fewest sockets that keep a guest socket within a host socket
    assert t.sockets == (min(fits) if fits else max(divisors))


def test_declared_virtio_win_gives_windows_virtio_devices_in_2026_2_only() -> None:
    for os in ("win11", "win2k22"):
        _, plan = generate(req(os, drivers=("virtio-win",)), group("intel-mixed"))
        assert (plan.disk_bus.value, plan.nic.value, plan.balloon.value, plan.rng.value) == (
            "virtio", "virtio", True, True)
        assert any("virtio-win" in e for e in plan.disk_bus.evidence)
        _, plain = generate(req(os), group("intel-mixed"))
        assert (plain.disk_bus.value, plain.nic.value) == ("sata", "e1000e")
    xml_with, old = generate(req("win11", "2026.1", drivers=("virtio-win",)), group("intel-mixed"))
    xml_without, _ = generate(req("win11", "2026.1"), group("intel-mixed"))
    assert old.disk_bus.value == "sata"
    # 2026.1 never looks at declared drivers (they are inputs, so the digest differs)
    assert _no_digest(xml_with) == _no_digest(xml_without)
    assert any("does not use declared drivers" in n for n in old.notes)
    with pytest.raises(InvalidInput, match="drivers: 'virtio-lin'"):
        req("win11", drivers=("virtio-lin",))


def test_hyperv_vendor_id_in_2026_2_where_every_host_offers_it() -> None:
    x = dom(generate(req("win2k22"), group("amd-mixed"))[0])
    v = x.find("features/hyperv/vendor_id")
    assert v is not None and v.get("value") == "hvfleet" and v.get("state") == "on"
    assert dom(generate(req("win2k22", "2026.1"), group("amd-mixed"))[0]).find(
        "features/hyperv/vendor_id") is None
    lacking = HostGroup(tuple(
        (n, c.model_copy(update={"hyperv_features": [f for f in c.hyperv_features or []
                                                     if f != "vendor_id"]}))
        if n == "rome-1" else (n, c) for n, c in group("amd-mixed").hosts))
    _, plan = generate(req("win2k22"), lacking)
    assert plan.hyperv.value is not None and "vendor_id" not in plan.hyperv.value.features


def test_io_uring_only_where_every_host_has_new_enough_libvirt_and_qemu() -> None:
    new = with_facts(group("intel-same"), libvirt_version="9.0.0")
    _, plan = generate(req("rhel9.1"), new)
    assert [d.io for d in plan.disks.value] == ["io_uring", "io_uring", "threads"]
    _, old_policy = generate(req("rhel9.1", "2026.1"), new)
    assert [d.io for d in old_policy.disks.value] == ["threads", "native", "threads"]
    # libvirt version unknown (saved XML files don't say it): no io_uring, and why
    _, unknown = generate(req("rhel9.1"), group("intel-same"))
    assert [d.io for d in unknown.disks.value] == ["threads", "native", "threads"]
    assert any("version unknown on intel-a1" in e for e in unknown.disks.evidence)
    hosts = list(new.hosts)
    hosts[1] = (hosts[1][0], hosts[1][1].model_copy(update={"libvirt_version": "6.0.0"}))
    _, one_old = generate(req("rhel9.1"), HostGroup(tuple(hosts)))
    assert [d.io for d in one_old.disks.value] == ["threads", "native", "threads"]
    assert any("not met on intel-a2" in e for e in one_old.disks.evidence)


def test_on_crash_by_policy_and_dump_location() -> None:
    g = group("intel-mixed")
    assert dom(generate(req("rhel9.1", "2026.1"), g)[0]).findtext("on_crash") == "destroy"
    assert dom(generate(req("rhel9.1"), g)[0]).findtext("on_crash") == "restart"
    dumps = with_facts(g, dump_location="/var/lib/libvirt/qemu/dump")
    x, plan = generate(req("rhel9.1"), dumps)
    assert dom(x).findtext("on_crash") == "coredump-restart"
    assert "dump location" in plan.lifecycle.reason
    hosts = list(dumps.hosts)
    hosts[0] = (hosts[0][0], hosts[0][1].model_copy(update={"dump_location": None}))
    _, partial = generate(req("rhel9.1"), HostGroup(tuple(hosts)))
    assert partial.lifecycle.value[2] == "restart" and hosts[0][0] in partial.lifecycle.reason
    # 2026.1 ignores dump locations
    assert generate(req("rhel9.1", "2026.1"), dumps)[1].lifecycle.value[2] == "destroy"


def test_2026_2_records_data_versions_and_2026_1_does_not() -> None:
    ns = {"h": "https://hvfleet.io/xmlns/guest/1"}
    new = dom(generate(req("rhel9.1"), group("single"))[0])
    assert new.findtext(".//h:osinfo-db", namespaces=ns)
    assert new.findtext(".//h:cpu-map", namespaces=ns).startswith("sha256:")
    old = dom(generate(req("rhel9.1", "2026.1"), group("single"))[0])
    assert old.find(".//h:osinfo-db", namespaces=ns) is None


def test_guest_policies_prints_each_versions_changes() -> None:
    r = CliRunner().invoke(app, ["guest", "policies"])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("2026.1: first release")
    assert "2026.2 (latest):" in r.stdout
    for p in POLICIES.values():
        for change in p.changes:
            assert f"  - {change}" in r.stdout


def test_docs_changelog_names_every_policy_change() -> None:
    text = (HOSTS.parents[1] / "docs" / "guests.md").read_text()
    for v, p in POLICIES.items():
        assert f"### {v}" in text
        for change in p.changes:
            assert change in text, f"docs/guests.md lacks {v}: {change}"


@pytest.mark.parametrize("os", ["rhel9.1", "win11"])
def test_2026_2_guest_with_io_uring_topology_and_virtio_win_starts_on_real_qemu(
    embed_conn: libvirt.virConnect, workdir: Path, os: str
) -> None:
    v = embed_conn.getLibVersion()
    caps = parse_host_capabilities(
        embed_conn.getCapabilities(),
        embed_conn.getDomainCapabilities(None, "x86_64", "q35", "qemu", 0),
    ).model_copy(update={"libvirt_version": f"{v // 1000000}.{v // 1000 % 1000}.{v % 1000}"})
    disk = workdir / "root.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "32M"], check=True)
    xml, plan = generate(
        GuestRequest(os=os, name=f"p2-{os.replace('.', '-')}", vcpus=4, memory=256 << 20,
                     disks=(DiskSpec.parse(f"kind=qcow2,source={disk}"),),
                     drivers=("virtio-win",) if os == "win11" else (), policy="2026.2"),
        HostGroup((("this-host", caps),)),
    )
    assert plan.disks.value[0].io == "io_uring"
    assert plan.topology.value is not None and plan.topology.value.sockets <= 2
    assert plan.disk_bus.value == "virtio"
    dom = embed_conn.defineXML(xml)
    try:
        dom.create()
        live = etree.fromstring(dom.XMLDesc(0).encode())
        assert live.find("devices/disk/driver").get("io") == "io_uring"
        t = live.find("cpu/topology")
        assert (int(t.get("sockets")) * int(t.get("cores"))) == 4
        if os == "win11":  # TCG offers vendor_id among its few Hyper-V features
            assert live.find("features/hyperv/vendor_id").get("value") == "hvfleet"
        dom.destroy()
    finally:
        dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)


_REAL_CASES: list[str] = []


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gname=st.sampled_from(["intel-same", "intel-mixed", "amd-mixed", "single", "mixed-vendor"]),
    os=st.sampled_from(["win11", "win10", "win2k22", "win7", "rhel9.1", "ubuntu22.04",
                        "linux2022", "freebsd13.0"]),
    mode=st.sampled_from(["intersection", "software", "none", "host"]),
    vcpus=st.integers(1, 64),
    virtio_win=st.booleans(),
    dumps=st.booleans(),
    libvirt=st.sampled_from(["", "6.0.0", "9.0.0"]),
)
def test_every_2026_2_guest_passes_check_on_every_host_of_its_group(
    gname: str, os: str, mode: str, vcpus: int, virtio_win: bool, dumps: bool, libvirt: str
) -> None:
    g = with_facts(group(gname), libvirt_version=libvirt,
                   dump_location="/var/lib/libvirt/qemu/dump" if dumps else None,
                   cpu_topology=CPUTopology(sockets=2, cores=8, threads=2))
    r = req(os, vcpus=vcpus, mode=mode,
            drivers=("virtio-win",) if virtio_win and os.startswith("win") else ())
    try:
        xml, plan = generate(r, g)
    except InvalidInput:
        return  # refused with a reason (mixed vendors in intersection, host mode on a group)
    _REAL_CASES.append(f"{gname}/{os}/{mode}")
    verdicts = check_domain(dom(xml), g)
    assert all(v.ok for v in verdicts), [(v.host, v.problems) for v in verdicts]
    t = plan.topology.value
    assert t is not None and t.sockets * t.cores * t.threads == vcpus
    assert dom(xml).findtext("on_crash") == (
        "coredump-restart" if dumps and mode != "none" else "restart")


def test_the_2026_2_property_test_really_generated_guests() -> None:
    test_every_2026_2_guest_passes_check_on_every_host_of_its_group()
    assert len(_REAL_CASES) > 80
