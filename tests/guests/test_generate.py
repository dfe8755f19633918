"""Generated guests: valid per libvirt's schema, frozen per policy, decided right."""

from __future__ import annotations

import itertools
from functools import cache
from pathlib import Path

import pytest
from lxml import etree

from hvfleet.guests.check import check_domain
from hvfleet.guests.cpu import expand_cpu
from hvfleet.guests.cpumap import load_cpu_map
from hvfleet.guests.errors import NotEverywhere
from hvfleet.guests.explain import explain
from hvfleet.guests.generate import generate, plan_guest
from hvfleet.guests.hosts import load_caps_dir
from hvfleet.guests.policy import POLICIES
from hvfleet.guests.request import DiskSpec, GuestRequest, HostGroup, NicSpec
from hvfleet.model.errors import InvalidInput

from . import golden
from .conftest import HOSTS

GROUPS = HOSTS / "groups"
DOMAIN_RNG = "/usr/share/libvirt/schemas/domain.rng"


@cache
def schema() -> etree.RelaxNG:
    return etree.RelaxNG(etree.parse(DOMAIN_RNG))


@cache
def group(name: str) -> HostGroup:
    return load_caps_dir(str(GROUPS / name))


def req(os: str, **kw: object) -> GuestRequest:
    base: dict[str, object] = {
        "os": os,
        "name": "g",
        "vcpus": 2,
        "memory": 2 << 30,
        "disks": (DiskSpec.parse("kind=raw-preallocated,source=/img/a.raw"),),
        "nics": (NicSpec.parse("network=default"),),
    }
    base.update(kw)
    return GuestRequest(**base)  # type: ignore[arg-type]


def parse(xml: str) -> etree._Element:
    return etree.fromstring(xml.encode())


GOLDEN_CASES = [
    (p, o, g) for p in POLICIES for o in golden.OSES for g in golden.GROUPS
]


@pytest.mark.parametrize(("policy", "os", "grp"), GOLDEN_CASES)
def test_released_policy_output_is_frozen(policy: str, os: str, grp: str) -> None:
    path = golden.path(policy, os, grp)
    assert path.exists(), f"no golden file {path}: run python -m tests.guests.golden"
    assert golden.render(os, grp, policy) == path.read_text(), (
        f"policy {policy} changed its output for {os} on {grp}: released policies are "
        "frozen; put new behaviour in a new policy version"
    )


def test_every_golden_and_mode_validates_against_libvirts_schema() -> None:
    rng = schema()
    for policy, os, grp in GOLDEN_CASES:
        doc = parse(golden.path(policy, os, grp).read_text())
        assert rng.validate(doc), f"{os}/{grp}: {rng.error_log.last_error}"
    extra = [
        (req("win11", secure_boot=True), "intel-same"),
        (req("winxp"), "single"),
        (req("win7", tpm=True), "intel-same"),
        (req("rhel9.1", mode="software"), "mixed-vendor"),
        (req("rhel9.1", mode="none"), "mixed-vendor"),
        (req("ubuntu22.04", mode="host", firmware="efi"), "single"),
        (req("freebsd13.0"), "amd-mixed"),
        (req("rhel9.1", disks=(), nics=()), "intel-mixed"),
    ]
    for r, grp in extra:
        xml, _ = generate(r, group(grp))
        assert rng.validate(parse(xml)), f"{r.os}/{r.mode}: {rng.error_log.last_error}"


def test_same_inputs_give_byte_identical_xml_whatever_the_host_order() -> None:
    g = group("intel-mixed")
    a, _ = generate(req("win2k22"), g)
    b, _ = generate(req("win2k22"), HostGroup(tuple(reversed(g.hosts))))
    c, _ = generate(req("win2k22", vcpus=3), g)
    assert a == b
    assert a != c
    digest = parse(a).find(".//{https://hvfleet.io/xmlns/guest/1}inputs-digest")
    assert digest is not None and digest.text and digest.text.startswith("sha256:")


def test_generated_cpu_runs_on_every_host_and_check_agrees() -> None:
    cmap = load_cpu_map()
    for os, grp in itertools.product(("win11", "rhel9.1"), ("intel-same", "intel-mixed",
                                                             "amd-mixed", "single")):
        g = group(grp)
        xml, plan = generate(req(os), g)
        for name, caps in g.hosts:
            assert plan.cpu.value.features <= expand_cpu(caps.cpu, cmap, name)
        verdicts = check_domain(parse(xml), g)
        assert all(v.ok for v in verdicts), [(v.host, v.problems) for v in verdicts]


def test_machine_type_is_the_highest_common_pinned_version() -> None:
    xml, _ = generate(req("rhel9.1"), group("intel-mixed"))
    assert parse(xml).find("os/type").get("machine") == "pc-q35-6.2"  # skl-1 has QEMU 6.2
    xml, _ = generate(req("rhel9.1"), group("intel-same"))
    assert parse(xml).find("os/type").get("machine") == "pc-q35-7.2"
    xml, _ = generate(req("winxp"), group("single"))  # osinfo lists no q35 for XP
    assert parse(xml).find("os/type").get("machine").startswith("pc-i440fx-")


def test_windows_11_gets_efi_tpm_crb_hyperv_and_localtime() -> None:
    xml, plan = generate(req("win11", secure_boot=True), group("intel-same"))
    dom = parse(xml)
    assert dom.find("os").get("firmware") == "efi"
    assert dom.find("os/firmware/feature[@name='secure-boot']").get("enabled") == "yes"
    assert dom.find("features/smm").get("state") == "on"
    assert dom.find("devices/tpm").get("model") == "tpm-crb"
    assert dom.find("devices/tpm/backend").get("type") == "emulator"
    hv = dom.find("features/hyperv")
    assert hv.find("spinlocks").get("retries") == "8191"
    assert hv.find("stimer/direct").get("state") == "on"
    assert hv.find("evmcs") is not None  # all hosts Intel
    assert hv.find("reenlightenment") is None
    assert dom.find("clock").get("offset") == "localtime"
    assert dom.find("clock/timer[@name='hypervclock']") is not None
    assert dom.find("devices/panic").get("model") == "hyperv"
    assert plan.disk_bus.value == "sata" and plan.nic.value == "e1000e"


def test_evmcs_only_when_every_host_is_intel() -> None:
    _, plan = generate(req("win2k22"), group("amd-mixed"))
    assert plan.hyperv.value is not None
    assert "evmcs" not in plan.hyperv.value.features
    assert "reenlightenment" not in plan.hyperv.value.features


def test_old_libvirt_host_hyperv_comes_from_its_qemu_version_and_is_explained() -> None:
    _, plan = generate(req("win2k22"), group("intel-mixed"))
    assert plan.hyperv.value is not None and "stimer" in plan.hyperv.value.features
    assert any("libvirt too old" in e and "skl-1" in e for e in plan.hyperv.evidence)


def test_linux_gets_virtio_utc_pvpanic_balloon_rng_and_io_by_disk_kind() -> None:
    disks = tuple(
        DiskSpec.parse(s)
        for s in (
            "kind=qcow2,source=/i/a.qcow2",
            "kind=raw,source=/i/b.raw",
            "kind=raw-preallocated,source=/i/c.raw",
            "kind=block,source=/dev/sdz",
        )
    )
    xml, _ = generate(req("fedora37", disks=disks), group("single"))
    dom = parse(xml)
    drivers = dom.findall("devices/disk/driver")
    assert [d.get("io") for d in drivers] == ["threads", "threads", "native", "native"]
    assert {d.get("cache") for d in drivers} == {"none"}
    assert {d.get("discard") for d in drivers} == {"unmap"}
    assert {t.get("bus") for t in dom.findall("devices/disk/target")} == {"virtio"}
    assert dom.find("devices/interface/model").get("type") == "virtio"
    assert dom.find("clock").get("offset") == "utc"
    assert dom.find("clock/timer[@name='hpet']").get("present") == "no"
    assert dom.find("devices/panic").get("model") == "isa"
    assert dom.find("devices/memballoon/stats").get("period") == "10"
    assert dom.find("devices/rng/backend").text == "/dev/urandom"
    assert dom.find("devices/controller[@type='usb']").get("model") == "qemu-xhci"
    assert dom.find("features/vmcoreinfo").get("state") == "on"
    assert dom.find("features/hyperv") is None
    g = dom.find("devices/graphics")
    assert g.get("type") == "vnc" and g.get("listen") == "127.0.0.1"
    assert dom.find("cpu").get("check") == "full"


def test_mixed_vendors_need_software_or_none_mode() -> None:
    with pytest.raises(InvalidInput, match="different CPU vendors"):
        generate(req("rhel9.1"), group("mixed-vendor"))
    g = group("mixed-vendor")
    _, sw = generate(req("rhel9.1", mode="software"), g)
    _, none = generate(req("rhel9.1", mode="none"), g)
    for _, caps in g.hosts:
        usable = {m.name for m in caps.cpu_models or [] if m.usable}
        assert sw.cpu.value.model in usable and none.cpu.value.model in usable
    assert not sw.cpu.value.require and not sw.cpu.value.vendor
    # Within one vendor, software mode may use that vendor's named models.
    _, sw_intel = generate(req("rhel9.1", mode="software"), group("intel-mixed"))
    _, none_intel = generate(req("rhel9.1", mode="none"), group("intel-mixed"))
    assert sw_intel.cpu.value.vendor == "Intel"
    assert len(sw_intel.cpu.value.features) > len(none_intel.cpu.value.features)


def test_host_mode_needs_a_single_host() -> None:
    with pytest.raises(InvalidInput, match="exactly one host"):
        generate(req("rhel9.1", mode="host"), group("intel-same"))
    _, plan = generate(req("rhel9.1", mode="host"), group("single"))
    assert plan.cpu.value.mode == "host"


def test_unknown_os_lists_the_closest_ids() -> None:
    with pytest.raises(InvalidInput, match=r"unknown OS id 'rhel9\.9'.*closest: .*rhel9\."):
        generate(req("rhel9.9"), group("single"))


def test_efi_on_a_host_without_domcapabilities_is_refused_naming_it(tmp_path: Path) -> None:
    real = HOSTS / "real"
    (tmp_path / "blind.caps.xml").write_text((real / "embed-kvm.caps.xml").read_text())
    with pytest.raises(NotEverywhere, match=r"EFI needed .* blind"):
        generate(req("win11"), load_caps_dir(str(tmp_path)))


def test_explain_shows_value_reason_and_evidence_for_each_decision() -> None:
    plan = plan_guest(req("win11"), group("intel-mixed"))
    text = explain(plan)
    for d in plan.decisions():
        assert d.area in text and d.reason in text
    assert "osinfo win11" in text and "skl-1" in text
    assert "policy 2026.1" in text


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"vcpus": 0}, "vcpus"),
        ({"memory": 1024}, "memory"),
        ({"firmware": "bios", "secure_boot": True}, "secure_boot"),
        ({"policy": "1999.1"}, "unknown policy version"),
        ({"mode": "magic"}, "mode"),
        ({"vcpus": 300}, "allows at most"),
    ],
)
def test_bad_requests_are_invalid_input(kw: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        generate(req("rhel9.1", **kw), group("single"))


@pytest.mark.parametrize(
    "spec",
    ["source=/a", "kind=qcow2", "kind=vmdk,source=/a", "kind=qcow2,source=rel/a",
     "kind=network,source=p/i", "kind=qcow2,source=/a,source=/b", "kind=block,source=/a,x=1"],
)
def test_bad_disk_specs_are_refused(spec: str) -> None:
    with pytest.raises(InvalidInput, match=r"^disks: "):
        DiskSpec.parse(spec)


def test_output_is_identical_across_processes_with_different_hash_seeds() -> None:
    import os
    import subprocess
    import sys

    code = (
        "import sys; from tests.guests import golden; "
        "sys.stdout.write(golden.render('win11', 'intel-mixed', '2026.1'))"
    )
    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        outs.append(subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                   capture_output=True, text=True,
                                   cwd=str(HOSTS.parents[1])).stdout)
    assert outs[0] == outs[1] and "<domain" in outs[0]
