"""ABI kept across regeneration (generate --from), upgrade diffs, and data set
changes detected (a copied, modified cpu_map / osinfo-db)."""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import libvirt
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from lxml import etree
from typer.testing import CliRunner

import hvfleet.cli.guest  # noqa: F401  (registers the commands)
from hvfleet.cli.exit_codes import exit_code_of
from hvfleet.cli.main import app, error_line
from hvfleet.discovery.capabilities import parse_host_capabilities
from hvfleet.guests.abi import abi_of, regenerate, request_from_domain, upgrade
from hvfleet.guests.check import check_domain
from hvfleet.guests.cpumap import CPU_MAP_DIR
from hvfleet.guests.datasets import DataSources
from hvfleet.guests.generate import generate, plan_guest
from hvfleet.guests.hosts import load_caps_dir
from hvfleet.guests.osinfo import OSINFO_DIR
from hvfleet.guests.request import DiskSpec, GuestRequest, HostGroup, NicSpec
from hvfleet.model.errors import Conflict, InvalidInput

from .conftest import HOSTS

GROUPS = HOSTS / "groups"
UUID = "6f1c2a8e-93d4-4b1e-9a57-0c3d2e1f4a5b"
runner = CliRunner()


@cache
def group(name: str) -> HostGroup:
    return load_caps_dir(str(GROUPS / name))


def union(*names: str) -> HostGroup:
    return HostGroup(tuple(h for n in names for h in group(n).hosts))


def req(os: str = "win2k22", policy: str = "2026.1", **kw: object) -> GuestRequest:
    base: dict[str, object] = {
        "os": os, "name": "keep", "uuid": UUID, "vcpus": 4, "memory": 4 << 30, "policy": policy,
        "disks": (DiskSpec.parse("kind=qcow2,source=/i/a.qcow2"),
                  DiskSpec.parse("kind=block,source=/dev/vg/b")),
        "nics": (NicSpec.parse("bridge=br0,mac=52:54:00:12:34:56"),),
    }
    base.update(kw)
    return GuestRequest(**base)  # type: ignore[arg-type]


def dom(xml: str) -> etree._Element:
    return etree.fromstring(xml.encode())


def test_the_request_is_read_back_from_a_generated_domain() -> None:
    r = req(drivers=("virtio-win",), policy="2026.2", secure_boot=True)
    xml, _ = generate(r, group("intel-same"))
    back = request_from_domain(dom(xml), {})
    assert back == GuestRequest(**{**r.__dict__, "firmware": "efi"})


def test_regenerating_for_the_same_group_changes_nothing() -> None:
    xml, _ = generate(req(), group("intel-mixed"))
    again = regenerate(dom(xml), group("intel-mixed"))
    assert again.xml == xml and not again.kept and not again.changed
    assert "ABI unchanged" in again.report()


def test_abi_is_kept_where_it_still_runs_on_the_changed_group() -> None:
    # Made for intel-mixed (an old QEMU 6.2 host: pc-q35-6.2, Skylake CPU) ...
    xml, old_plan = generate(req(), group("intel-mixed"))
    # ... regenerated for three Cascade Lake hosts with QEMU 7.2: a fresh guest
    # would get pc-q35-7.2 and a Cascadelake CPU; the old ones still run.
    fresh, _ = generate(req(), group("intel-same"))
    assert abi_of(dom(fresh))["machine"] == "pc-q35-7.2"
    r = regenerate(dom(xml), group("intel-same"))
    out = dom(r.xml)
    assert out.findtext("uuid") == UUID and out.findtext("name") == "keep"
    assert out.find("os/type").get("machine") == "pc-q35-6.2"
    assert abi_of(out)["cpu"] == abi_of(dom(xml))["cpu"]
    assert {k.area for k in r.kept} >= {"machine", "cpu"} and not r.changed
    assert "kept machine pc-q35-6.2 (a fresh guest would get pc-q35-7.2)" in r.report()
    verdicts = check_domain(out, group("intel-same"))
    assert all(v.ok for v in verdicts), [(v.host, v.problems) for v in verdicts]
    assert old_plan.machine.value == "pc-q35-6.2"


def test_abi_that_no_longer_runs_everywhere_is_refused_naming_what_must_change() -> None:
    xml, _ = generate(req(), group("intel-same"))  # pc-q35-7.2, Cascadelake, evmcs
    grown = union("intel-same", "intel-mixed")  # adds skl-1: QEMU 6.2, Skylake
    with pytest.raises(Conflict) as exc:
        regenerate(dom(xml), grown)
    msg = str(exc.value)
    assert "machine: pc-q35-7.2 → pc-q35-6.2" in msg and "skl-1" in msg
    assert re.search(r"cpu: Cascadelake-Server .*→ Skylake-Server-IBRS", msg), msg
    assert "allow_abi_change" in msg and "--" not in msg
    r = regenerate(dom(xml), grown, allow_abi_change=True)
    assert dom(r.xml).find("os/type").get("machine") == "pc-q35-6.2"
    assert {c.area for c in r.changed} >= {"machine", "cpu"}
    verdicts = check_domain(dom(r.xml), grown)
    assert all(v.ok for v in verdicts), [(v.host, v.problems) for v in verdicts]


def test_upgrade_to_2026_2_lists_the_abi_settings_that_change() -> None:
    xml, _ = generate(req("win11", drivers=("virtio-win",)), group("intel-mixed"))
    # 2026.1 does not record declared drivers: the upgrade is told again
    r = upgrade(dom(xml), group("intel-mixed"), "2026.2", {"drivers": ("virtio-win",)})
    diff = {c.area: (c.old, c.new) for c in r.changed}
    assert diff["topology"] == ("libvirt default", "2 sockets × 2 cores × 1 thread")
    assert diff["disk bus"] == ("sata", "virtio") and diff["nic"] == ("e1000e", "virtio")
    assert "vendor_id=hvfleet" in diff["hyperv"][1]
    assert "machine" not in diff  # the same group: same machine type
    out = dom(r.xml)
    assert out.findtext("uuid") == UUID
    assert out.findtext("{*}metadata/{*}guest/{*}policy") == "2026.2"


@pytest.fixture
def changed_cpu_map(tmp_path: Path) -> str:
    """A copy of libvirt's cpu_map that marks vmx non-migratable, as a newer
    libvirt might."""
    d = tmp_path / "cpu_map"
    shutil.copytree(CPU_MAP_DIR, d)
    f = d / "x86_features.xml"
    text = f.read_text()
    assert "<feature name='vmx'>" in text
    f.write_text(text.replace("<feature name='vmx'>", "<feature name='vmx' migratable='no'>", 1))
    return str(d)


def test_a_changed_cpu_map_is_detected_and_explained(changed_cpu_map: str) -> None:
    data = DataSources(cpu_map_dir=changed_cpu_map)
    assert data.versions()["cpu_map"] != DataSources().versions()["cpu_map"]
    # plain generation says the data differs from what the policy was released with
    plan = plan_guest(req(), group("intel-same"), data)
    note = next(n for n in plan.warnings if "data sets differ" in n)
    assert "cpu_map sha256:" in note and "policy 2026.1" in note
    # an existing 2026.2 guest regenerated on the changed data keeps its CPU and says why
    xml, _ = generate(req(policy="2026.2"), group("intel-same"))
    r = regenerate(dom(xml), group("intel-same"), data=data)
    assert any(c.startswith("cpu_map sha256:") for c in r.data_changes)
    assert "data sets changed since the guest was generated: cpu_map" in r.report()
    fresh = plan_guest(req(policy="2026.2"), group("intel-same"), data)
    assert "vmx" not in fresh.cpu.value.require  # what the new map alone would write
    assert abi_of(dom(r.xml))["cpu"] == abi_of(dom(xml))["cpu"]
    assert any(k.area == "cpu" for k in r.kept)


def test_a_changed_osinfo_db_is_detected(tmp_path: Path) -> None:
    d = tmp_path / "osinfo"
    shutil.copytree(OSINFO_DIR, d)
    (d / "VERSION").write_text("20990101")
    plan = plan_guest(req(), group("single"), DataSources(osinfo_dir=str(d)))
    assert any("osinfo-db 20221203 → 20990101" in n for n in plan.warnings)
    xml, _ = generate(req(policy="2026.2"), group("single"))
    r = regenerate(dom(xml), group("single"), data=DataSources(osinfo_dir=str(d)))
    assert r.data_changes == ("osinfo-db 20221203 → 20990101",)


def test_cli_generate_from_and_upgrade(tmp_path: Path) -> None:
    old = tmp_path / "old.xml"
    old.write_text(generate(req(), group("intel-same"))[0])
    grown = tmp_path / "grown"
    grown.mkdir()
    for src in ("intel-same", "intel-mixed"):
        for f in (GROUPS / src).iterdir():
            shutil.copy(f, grown)
    r = runner.invoke(app, ["guest", "generate", "--from", str(old), "--caps-dir", str(grown)])
    assert isinstance(r.exception, Conflict) and exit_code_of(r.exception) == 4
    line = error_line(r.exception)
    assert line.startswith("error: --allow-abi-change: needed: guest keep's ABI"), line
    assert "skl-1" in line
    out = tmp_path / "new.xml"
    r = runner.invoke(app, ["guest", "generate", "--from", str(old), "--caps-dir", str(grown),
                            "--allow-abi-change", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "changed machine: pc-q35-7.2 → pc-q35-6.2" in r.stdout
    assert dom(out.read_text()).findtext("uuid") == UUID
    r = runner.invoke(app, ["guest", "upgrade", str(out), "--policy", "2026.2",
                            "--caps-dir", str(grown)])
    assert r.exit_code == 0, r.output
    assert "<hvfleet:policy>2026.2</hvfleet:policy>" in r.stdout
    assert "changed topology: libvirt default →" in r.stderr
    r = runner.invoke(app, ["guest", "generate", "--os", "rhel9.1", "--caps-dir", str(grown)])
    assert isinstance(r.exception, InvalidInput) and exit_code_of(r.exception) == 2
    assert "--name, --vcpus, --memory" in str(r.exception)


GROUP_NAMES = ("intel-same", "intel-mixed", "amd-mixed", "single")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    os=st.sampled_from(["win11", "win2k22", "rhel9.1", "ubuntu22.04"]),
    policy=st.sampled_from(["2026.1", "2026.2"]),
    made_for=st.sets(st.sampled_from(GROUP_NAMES), min_size=1, max_size=2),
    moved_to=st.sets(st.sampled_from(GROUP_NAMES), min_size=1, max_size=2),
)
def test_regeneration_keeps_what_runs_and_names_the_rest(
    os: str, policy: str, made_for: set[str], moved_to: set[str]
) -> None:
    def grp(names: set[str]) -> HostGroup | None:
        hosts = union(*sorted(names))
        vendors = {c.cpu.vendor for _, c in hosts.hosts}
        return hosts if len(vendors) == 1 else None

    a, b = grp(made_for), grp(moved_to)
    assume(a is not None and b is not None)
    assert a is not None and b is not None
    xml, _ = generate(req(os, policy), a)
    before = abi_of(dom(xml))
    try:
        r = regenerate(dom(xml), b)
    except Conflict as exc:
        r = regenerate(dom(xml), b, allow_abi_change=True)
        assert r.changed and all(f"{c.area}: {c.old} → {c.new}" in str(exc) for c in r.changed)
    out = dom(r.xml)
    # whatever came out runs on every host of the new group ...
    verdicts = check_domain(out, b)
    assert all(v.ok for v in verdicts), [(v.host, v.problems) for v in verdicts]
    # ... keeps name and UUID, and every ABI setting not listed as changed
    assert out.findtext("uuid") == UUID and out.findtext("name") == "keep"
    after = abi_of(out)
    changed = {c.area for c in r.changed}
    for area, value in before.items():
        if area not in changed:
            assert after[area] == value, (area, value, after[area])


@pytest.mark.parametrize("os", ["rhel9.1", "win11"])
def test_regenerating_libvirts_own_dumpxml_keeps_everything(
    embed_conn: libvirt.virConnect, workdir: Path, os: str
) -> None:
    # What an operator really has: `virsh dumpxml` of the defined guest, with
    # libvirt's defaults, PCI addresses, controllers and NVRAM paths added.
    caps = parse_host_capabilities(
        embed_conn.getCapabilities(),
        embed_conn.getDomainCapabilities(None, "x86_64", "q35", "qemu", 0),
    )
    g = HostGroup((("this-host", caps),))
    disk = workdir / "d.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(disk), "16M"], check=True)
    r = GuestRequest(os=os, name=f"dump-{os.replace('.', '-')}", vcpus=2, memory=256 << 20,
                     disks=(DiskSpec.parse(f"kind=qcow2,source={disk}"),),
                     nics=(), policy="2026.2",
                     drivers=("virtio-win",) if os == "win11" else ())
    xml, _ = generate(r, g)
    d = embed_conn.defineXML(xml)
    try:
        dumped = d.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        assert d.UUIDString() in dumped
        again = regenerate(dom(dumped), g)
        assert not again.changed and not again.kept, again.report()
        assert abi_of(dom(again.xml)) == abi_of(dom(dumped))
        assert dom(again.xml).findtext("uuid") == d.UUIDString()
        # libvirt takes the regenerated definition for the same domain, and
        # gives its devices the same PCI addresses (they are ABI too, and are
        # not written by hvfleet: libvirt assigns them from the device list)
        redefined = embed_conn.defineXML(again.xml).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)

        def addresses(x: str) -> list[tuple[str, dict[str, str]]]:
            return [(a.getparent().tag, dict(a.attrib)) for a in dom(x).iter("address")]

        assert addresses(redefined) == addresses(dumped) and addresses(dumped)
    finally:
        d.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
