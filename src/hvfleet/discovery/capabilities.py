"""libvirt host capabilities and domain capabilities XML → `HostCapabilities`.

Pure parsers: the node agent feeds them what `virConnectGetCapabilities` and
`virConnectGetDomainCapabilities` return, the guest generator what an operator
saved from `virsh capabilities` / `virsh domcapabilities`. Where libvirt did
not say something (no domcapabilities, an old libvirt without an element) the
field stays `None` and a note says why, instead of guessing "absent".
"""

from __future__ import annotations

import re

from lxml import etree

from hvfleet.discovery.xmlsafe import parse_xml
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import (
    CPUModelInfo,
    CPUTopology,
    FirmwareInfo,
    HostCapabilities,
    HostCPU,
    MachineType,
)

_VERSIONED_MACHINE_RE = re.compile(r"^pc-(?:q35|i440fx)-(\d+)\.(\d+)(?:\.\d+)?$")


def machine_version(name: str) -> tuple[int, int] | None:
    """(major, minor) of a versioned x86 machine type (pc-q35-7.2 → (7, 2)), else None."""
    m = _VERSIONED_MACHINE_RE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _text(el: etree._Element | None) -> str:
    return (el.text or "").strip() if el is not None else ""


def _enum(parent: etree._Element | None, name: str) -> list[str] | None:
    if parent is None:
        return None
    for en in parent.findall("enum"):
        if en.get("name") == name:
            return [_text(v) for v in en.findall("value")]
    return None


def _supported(el: etree._Element | None) -> bool | None:
    if el is None:
        return None
    return el.get("supported") == "yes"


def _newer_enum(parent: etree._Element, tag: str, name: str, notes: list[str],
                older: str) -> list[str] | None:
    """Enum `name` of element `tag`, which only a newer libvirt lists: its
    values (none where unsupported); None where the element is missing (unknown,
    not absent), with a note that says why (`older`)."""
    element = parent.find(tag)
    if element is None:
        notes.append(f"domcapabilities: no <{tag}> element {older}")
        return None
    return (_enum(element, name) or []) if _supported(element) else []


def parse_cpu_element(cpu: etree._Element, source: str) -> HostCPU:
    """A `<cpu>` (host CPU, host-model mode, or a guest CPU) → HostCPU.

    Feature policies `require`/`force`/`optional` (or none) count as present,
    `disable`/`forbid` as absent.
    """
    features: list[str] = []
    disabled: list[str] = []
    for f in cpu.findall("feature"):
        name = f.get("name")
        if not name:
            raise InvalidInput(f"{source}: <feature> without a name")
        if f.get("policy") in ("disable", "forbid"):
            disabled.append(name)
        else:
            features.append(name)
    return HostCPU(
        vendor=_text(cpu.find("vendor")),
        model=_text(cpu.find("model")),
        features=features,
        disabled_features=disabled,
        source=source,
    )


def parse_cpu_models(root: etree._Element) -> list[CPUModelInfo] | None:
    """The named CPU models of a `<domainCapabilities>` (custom mode), with
    their usability and blockers; None when the mode is not supported."""
    for mode in root.findall("cpu/mode"):
        if mode.get("name") == "custom" and mode.get("supported") == "yes":
            blockers = {
                b.get("model", ""): [f.get("name", "") for f in b.findall("feature")]
                for b in mode.findall("blockers")
            }
            return [
                CPUModelInfo(
                    name=_text(m),
                    usable={"yes": True, "no": False}.get(m.get("usable", "")),
                    vendor="" if m.get("vendor") in (None, "unknown") else m.get("vendor", ""),
                    blockers=blockers.get(_text(m)),
                )
                for m in mode.findall("model")
            ]
    return None


def _parse_capabilities(root: etree._Element, caps: HostCapabilities) -> None:
    if root.tag != "capabilities":
        raise InvalidInput(f"capabilities: root element is <{root.tag}>, not <capabilities>")
    host_cpu = root.find("host/cpu")
    if host_cpu is None:
        raise InvalidInput("capabilities: no <host><cpu> element")
    caps.arch = _text(host_cpu.find("arch"))
    caps.cpu = parse_cpu_element(host_cpu, "capabilities host cpu")
    topo = host_cpu.find("topology")
    if topo is not None:
        try:
            caps.cpu_topology = CPUTopology(
                **{k: int(topo.get(k, "1")) for k in ("sockets", "dies", "cores", "threads")}
            )
        except ValueError:
            caps.notes.append("capabilities: <topology> is not whole numbers; topology unknown")
    guest = None
    for g in root.findall("guest"):
        arch = g.find("arch")
        if g.findtext("os_type") == "hvm" and arch is not None and arch.get("name") == caps.arch:
            guest = g
            break
    if guest is None:
        caps.notes.append(f"capabilities: no hvm guest for the host arch {caps.arch!r}")
        return
    arch_el = guest.find("arch")
    assert arch_el is not None
    caps.emulator = _text(arch_el.find("emulator"))
    machines: list[MachineType] = []
    seen: set[str] = set()

    def add(m: etree._Element) -> None:
        name = _text(m)
        if not name or name in seen:
            return
        seen.add(name)
        max_cpus = m.get("maxCpus")
        machines.append(
            MachineType(
                name=name,
                canonical=m.get("canonical") or name,
                max_cpus=int(max_cpus) if max_cpus and max_cpus.isdecimal() else None,
                deprecated=m.get("deprecated") == "yes",
            )
        )

    for m in arch_el.findall("machine"):
        add(m)
    types: list[str] = []
    for d in arch_el.findall("domain"):
        t = d.get("type")
        if t and t not in types:
            types.append(t)
        for m in d.findall("machine"):
            add(m)
    caps.machine_types = machines
    caps.domain_types = types
    newest = max((v for m in machines if (v := machine_version(m.canonical))), default=None)
    if newest and not caps.hypervisor_version:
        caps.hypervisor_version = f"{newest[0]}.{newest[1]}"
        caps.notes.append(
            f"QEMU version {caps.hypervisor_version} inferred from the newest machine type"
        )


def _parse_domcapabilities(root: etree._Element, caps: HostCapabilities) -> None:
    if root.tag != "domainCapabilities":
        raise InvalidInput(
            f"domcapabilities: root element is <{root.tag}>, not <domainCapabilities>"
        )
    arch = _text(root.find("arch"))
    if caps.arch and arch and arch != caps.arch:
        raise InvalidInput(
            f"domcapabilities: arch {arch!r} differs from the capabilities' host arch {caps.arch!r}"
        )
    caps.domcapabilities_available = True
    caps.domcapabilities_domain_type = _text(root.find("domain"))
    vcpu = root.find("vcpu")
    if vcpu is not None and (mx := vcpu.get("max", "")).isdecimal():
        caps.max_vcpus = int(mx)
    machine = _text(root.find("machine"))
    if machine and all(m.canonical != machine for m in caps.machine_types):
        caps.machine_types.append(MachineType(name=machine, canonical=machine))

    os_el = root.find("os")
    loader = root.find("os/loader")
    fw_values = _enum(os_el, "firmware") or []
    loaders = [_text(v) for v in loader.findall("value")] if loader is not None else []
    secure = _enum(loader, "secure") or []
    efi = "efi" in fw_values or any("OVMF" in p or "edk2" in p for p in loaders)
    caps.firmware = FirmwareInfo(
        efi=bool(_supported(os_el)) and efi,
        secure_boot=bool(_supported(os_el)) and efi and "yes" in secure,
        loaders=loaders,
    )

    for mode in root.findall("cpu/mode"):
        if mode.get("name") == "host-model" and mode.get("supported") == "yes":
            caps.capabilities_cpu = caps.cpu
            caps.cpu = parse_cpu_element(mode, "domcapabilities host-model")
            if not caps.cpu.vendor and caps.capabilities_cpu:
                caps.cpu.vendor = caps.capabilities_cpu.vendor
        elif mode.get("name") == "custom" and mode.get("supported") == "yes":
            caps.cpu_models = parse_cpu_models(root)
    if caps.cpu.source != "domcapabilities host-model":
        caps.notes.append(
            "domcapabilities: host-model CPU not supported; using the capabilities host CPU"
        )

    devices = root.find("devices")
    if devices is not None:
        disk = devices.find("disk")
        caps.disk_buses = _enum(disk, "bus") if _supported(disk) else []
        video = devices.find("video")
        caps.video_models = _enum(video, "modelType") if _supported(video) else []
        graphics = devices.find("graphics")
        caps.graphics_types = _enum(graphics, "type") if _supported(graphics) else []
        rng = devices.find("rng")
        caps.rng_models = _enum(rng, "model") if _supported(rng) else []
        tpm = devices.find("tpm")
        if tpm is None:
            caps.notes.append("domcapabilities: no <tpm> element (libvirt older than 8.0?)")
        else:
            ok = _supported(tpm)
            caps.tpm_models = (_enum(tpm, "model") or []) if ok else []
            caps.tpm_backends = (_enum(tpm, "backendModel") or []) if ok else []
            caps.tpm_versions = _enum(tpm, "backendVersion") if ok else []
        caps.panic_models = _newer_enum(devices, "panic", "model", caps.notes,
                                        "(libvirt older than 9.1); panic models unknown")

    features = root.find("features")
    if features is not None:
        caps.vmcoreinfo = _supported(features.find("vmcoreinfo"))
        caps.sev = _supported(features.find("sev"))
        caps.sgx = _supported(features.find("sgx"))
        caps.hyperv_features = _newer_enum(features, "hyperv", "features", caps.notes,
                                           "(libvirt older than 8.0); Hyper-V features unknown, not absent")
        if caps.vmcoreinfo is None:
            caps.notes.append("domcapabilities: no <vmcoreinfo> element; support unknown")


def parse_host_capabilities(caps_xml: str, domcaps_xml: str | None) -> HostCapabilities:
    """Parse `virsh capabilities` and (optionally) `virsh domcapabilities` output.

    Raises InvalidInput for malformed, hostile (DOCTYPE/ENTITY) or foreign documents.
    """
    caps = HostCapabilities()
    _parse_capabilities(parse_xml(caps_xml, "capabilities"), caps)
    if domcaps_xml is None:
        caps.notes.append(
            "domcapabilities not available: CPU from capabilities, devices, firmware "
            "and features unknown"
        )
    else:
        _parse_domcapabilities(parse_xml(domcaps_xml, "domcapabilities"), caps)
    return caps
