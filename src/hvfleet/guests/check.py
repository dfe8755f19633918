"""Can this domain start and live-migrate on each host of a group, and if not, why?

Reads a domain XML (ours or anyone's) and compares what it asks for with each
host's capabilities: domain type, machine type, CPU features (by name),
firmware, device models and Hyper-V features. Unknown (libvirt did not say)
is reported as a warning, not a failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lxml import etree

from hvfleet.discovery.capabilities import parse_cpu_element
from hvfleet.guests.cpu import expand_cpu, is_unknown_cpu
from hvfleet.guests.cpumap import load_cpu_map
from hvfleet.guests.errors import NotEverywhere
from hvfleet.guests.request import HostGroup
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import HostCapabilities

__all__ = ["HostVerdict", "NotEverywhere", "check_domain"]


@dataclass
class HostVerdict:
    host: str
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _need(
    v: HostVerdict, have: list[str] | None, value: str | None, what: str
) -> None:
    if not value:
        return
    if have is None:
        v.warnings.append(f"{what} {value}: unknown (libvirt does not list {what}s)")
    elif value not in have:
        v.problems.append(f"{what} {value} unsupported (host has: {', '.join(have) or 'none'})")


def _check_host(dom: etree._Element, name: str, caps: HostCapabilities) -> HostVerdict:
    v = HostVerdict(name)
    dtype = dom.get("type", "")
    host_type = caps.domcapabilities_domain_type
    if dtype not in caps.domain_types:
        v.problems.append(f"domain type {dtype} not offered")
    elif dtype == "kvm" and host_type and host_type != "kvm":
        v.problems.append("domain type kvm: the host's domcapabilities are for qemu (no KVM)")
    machine = dom.find("os/type")
    mach = machine.get("machine", "") if machine is not None else ""
    names = {m.name for m in caps.machine_types} | {m.canonical for m in caps.machine_types}
    if mach and mach not in names:
        v.problems.append(f"machine type {mach} absent")
    elif mach in {m.name for m in caps.machine_types if m.name != m.canonical}:
        v.warnings.append(f"machine type {mach} is an alias: the guest ABI changes with QEMU")

    cpu = dom.find("cpu")
    mode = cpu.get("mode", "custom") if cpu is not None else ""
    if cpu is not None and mode == "custom" and cpu.find("model") is not None:
        cmap = load_cpu_map()
        want = parse_cpu_element(cpu, "domain cpu")
        guest = expand_cpu(want, cmap, "domain cpu")
        model = cmap.models.get(want.model)
        if model is not None and model.removed:
            named = {cmap.canonical_feature(f) for f in [*want.features, *want.disabled_features]}
            if silent := sorted(model.removed - named):
                # The model name alone carried them in older libvirt and QEMU.
                v.warnings.append(
                    f"CPU model {want.model}: cpu_map marks {', '.join(silent)} removed from "
                    "it; say require or disable, or libvirt/QEMU versions may differ"
                )
        # What the host's QEMU lists as blocking a model, it cannot give.
        blocked = {
            cmap.canonical_feature(f)
            for m in caps.cpu_models or () if m.usable is False for f in m.blockers or ()
        }
        if is_unknown_cpu(caps.cpu):
            v.warnings.append("CPU features unknown (libvirt reported no host CPU model)")
        else:
            have = expand_cpu(caps.cpu, cmap, name) - blocked
            missing = sorted(guest - have)
            if missing:
                v.problems.append(f"CPU features missing: {', '.join(missing)}")
        if want.vendor and caps.cpu.vendor and want.vendor != caps.cpu.vendor:
            v.problems.append(f"CPU vendor {want.vendor}, host is {caps.cpu.vendor}")
        if caps.cpu_models is not None:
            info = next((m for m in caps.cpu_models if m.name == want.model), None)
            if info is None:
                v.problems.append(f"CPU model {want.model} unknown to the host's QEMU")
            elif info.usable is False and info.blockers is not None:
                needed = sorted({cmap.canonical_feature(f) for f in info.blockers} & guest)
                if needed:
                    v.problems.append(
                        f"CPU model {want.model} unusable on the host's QEMU unless "
                        f"{', '.join(needed)} are disabled (its blockers)"
                    )
            elif info.usable is False:
                v.warnings.append(
                    f"CPU model {want.model} marked unusable by the host's QEMU, which "
                    "lists no blockers: features checked against cpu_map only"
                )
    elif mode in ("host-passthrough", "maximum"):
        v.warnings.append(f"CPU mode {mode}: live migration needs identical hosts")
    elif mode == "host-model":
        v.warnings.append("CPU mode host-model: expands differently on each host")

    os_el = dom.find("os")
    efi = os_el is not None and (
        os_el.get("firmware") == "efi" or os_el.find("loader") is not None
    )
    if efi and caps.firmware.efi is not True:
        v.problems.append(
            "firmware EFI missing" if caps.firmware.efi is False else "firmware EFI unknown"
        )
    loader = dom.findtext("os/loader")
    if loader and caps.firmware.loaders and loader.strip() not in caps.firmware.loaders:
        v.problems.append(f"firmware {loader.strip()} missing (a host-specific loader path)")
    sb = dom.find("os/firmware/feature[@name='secure-boot']")
    if sb is not None and sb.get("enabled") == "yes" and caps.firmware.secure_boot is not True:
        v.problems.append("secure boot firmware missing")

    i440fx = mach == "pc" or mach.startswith("pc-i440fx-")
    for disk in dom.findall("devices/disk/target"):
        bus = disk.get("bus")
        if bus == "ide" and i440fx and caps.disk_buses is not None and "ide" not in caps.disk_buses:
            # domcapabilities list the buses of the machine type they were
            # taken for (q35 has no IDE); i440fx has its IDE controller built in.
            v.warnings.append("disk bus ide: built into i440fx (domcapabilities are for "
                              "another machine type)")
            continue
        _need(v, caps.disk_buses, bus, "disk bus")
    for video in dom.findall("devices/video/model"):
        _need(v, caps.video_models, video.get("type"), "video model")
    for g in dom.findall("devices/graphics"):
        _need(v, caps.graphics_types, g.get("type"), "graphics type")
    for tpm in dom.findall("devices/tpm"):
        _need(v, caps.tpm_models, tpm.get("model", "tpm-tis"), "TPM model")
        backend = tpm.find("backend")
        if backend is not None:
            _need(v, caps.tpm_backends, backend.get("type"), "TPM backend")
    for rng in dom.findall("devices/rng"):
        _need(v, caps.rng_models, rng.get("model"), "RNG model")
    for panic in dom.findall("devices/panic"):
        _need(v, caps.panic_models, panic.get("model"), "panic model")
    if dom.find("features/vmcoreinfo[@state='on']") is not None and caps.vmcoreinfo is not True:
        (v.problems if caps.vmcoreinfo is False else v.warnings).append(
            "vmcoreinfo " + ("unsupported" if caps.vmcoreinfo is False else "unknown")
        )
    hv = dom.find("features/hyperv")
    if hv is not None:
        asked = [c.tag for c in hv if c.get("state", "on") == "on"]
        if caps.hyperv_features is None:
            v.warnings.append("Hyper-V features unknown (libvirt too old to list them)")
        else:
            lacking = [f for f in asked if f not in caps.hyperv_features]
            if lacking:
                v.problems.append(f"Hyper-V features unsupported: {', '.join(lacking)}")
        if "reenlightenment" in asked:
            v.warnings.append("Hyper-V reenlightenment is on: it breaks live migration")
    vcpu = dom.findtext("vcpu")
    n_vcpu = int(vcpu) if vcpu and vcpu.strip().isdecimal() else 0
    for m in caps.machine_types:
        if m.name == mach and m.max_cpus and n_vcpu > m.max_cpus:
            v.problems.append(f"{n_vcpu} vCPUs exceed {mach}'s maximum {m.max_cpus}")
    return v


def check_domain(dom: etree._Element, group: HostGroup) -> list[HostVerdict]:
    if dom.tag != "domain":
        raise InvalidInput(f"domain XML: root element is <{dom.tag}>, not <domain>")
    return [_check_host(dom, name, caps) for name, caps in group.hosts]
