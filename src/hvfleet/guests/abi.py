"""Keeping an existing guest's ABI across regeneration, and showing what an upgrade changes.

A running guest's machine type, CPU and devices are its ABI: the guest OS has
seen them, and a live migration needs the same on both ends. Regenerating a
guest (`regenerate`, the CLI's `guest generate --from EXISTING.xml`) for a
changed group therefore keeps each ABI setting of the existing definition that
still runs on every host of the group (judged by `check_domain`), takes the
fresh decision where the existing one matches it anyway, and for each setting
that can no longer be kept says what must change and why, refusing unless
the change is allowed. `upgrade` moves a guest to another policy version on
purpose and lists the ABI settings that differ. Both keep name and UUID.

The data sets a guest was generated from (osinfo-db, cpu_map; recorded by
policies with `record_data_versions`, else those the policy was released
with) are compared with the current ones, so a setting that differs because
a data set changed is explained as such rather than silently changed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lxml import etree

from hvfleet.guests.check import check_domain
from hvfleet.guests.clock import Clock
from hvfleet.guests.cpu import GuestCPU, expand_cpu
from hvfleet.guests.cpumap import load_cpu_map
from hvfleet.guests.datasets import DEFAULT_DATA, DataSources, changed_versions
from hvfleet.guests.decision import Decision
from hvfleet.guests.disks import decide_disks
from hvfleet.guests.errors import NotEverywhere
from hvfleet.guests.firmware import TPM, Firmware
from hvfleet.guests.generate import plan_guest
from hvfleet.guests.hyperv import HyperV
from hvfleet.guests.osinfo import load_os_database
from hvfleet.guests.plan import Plan
from hvfleet.guests.policy import get_policy
from hvfleet.guests.render import NS, render_domain
from hvfleet.guests.request import DiskSpec, GuestRequest, HostGroup, NicSpec
from hvfleet.guests.scope import Scope
from hvfleet.guests.topology import Topology
from hvfleet.model.errors import Conflict, InvalidInput
from hvfleet.model.hostcaps import HostCPU

# ABI area → the Plan field holding its decision. Order: how a diff is printed.
AREAS: dict[str, str] = {
    "machine": "machine", "cpu": "cpu", "topology": "topology", "firmware": "firmware",
    "tpm": "tpm", "hyperv": "hyperv", "clock": "clock", "disk bus": "disk_bus", "nic": "nic",
    "usb": "usb", "video": "video", "memballoon": "balloon", "rng": "rng", "panic": "panic",
    "vmcoreinfo": "vmcoreinfo",
}


@dataclass(frozen=True)
class ABIChange:
    area: str
    old: str
    new: str
    why: str = ""

    def line(self) -> str:
        return f"{self.area}: {self.old} → {self.new}" + (f" ({self.why})" if self.why else "")


@dataclass(frozen=True)
class Regeneration:
    xml: str
    plan: Plan
    kept: tuple[ABIChange, ...]  # settings kept from the existing guest (old) over fresh (new)
    changed: tuple[ABIChange, ...]  # settings that had to change, with why
    data_changes: tuple[str, ...]  # "cpu_map A → B" for data sets that changed since

    def report(self) -> str:
        lines: list[str] = []
        if self.data_changes:
            lines.append("data sets changed since the guest was generated: "
                         + "; ".join(self.data_changes))
        for k in self.kept:
            lines.append(f"kept {k.area} {k.old} (a fresh guest would get {k.new})")
        for c in self.changed:
            lines.append(f"changed {c.line()}")
        if not self.kept and not self.changed:
            lines.append("ABI unchanged")
        return "\n".join(lines) + "\n"


# -- reading an existing definition ---------------------------------------------------------


def _meta(dom: etree._Element, tag: str) -> str:
    return (dom.findtext(f"metadata/{{{NS}}}guest/{{{NS}}}{tag}") or "").strip()


def recorded_versions(dom: etree._Element) -> dict[str, str]:
    """The data set versions in the guest's metadata, else its policy's release versions."""
    found = {k: _meta(dom, k.replace("_", "-")) for k in ("osinfo-db", "cpu_map")}
    if all(found.values()):
        return found
    policy = _meta(dom, "policy")
    try:
        return dict(get_policy(policy).data_versions) if policy else {}
    except InvalidInput:
        return {}


def _memory_bytes(el: etree._Element | None) -> int:
    if el is None or not (el.text or "").strip().isdecimal():
        raise InvalidInput("existing domain: <memory> is missing or not a number")
    unit = {"b": 1, "bytes": 1, "k": 1024, "kib": 1024, "m": 1 << 20, "mib": 1 << 20,
            "g": 1 << 30, "gib": 1 << 30, "kb": 1000, "mb": 10**6, "gb": 10**9}
    factor = unit.get(el.get("unit", "KiB").lower())
    if factor is None:
        raise InvalidInput(f"existing domain: memory unit {el.get('unit')!r} is not known")
    return int((el.text or "").strip()) * factor


def _disk_spec(disk: etree._Element) -> DiskSpec:
    dtype = disk.get("type", "file")
    driver = disk.find("driver")
    src = disk.find("source")
    if src is None:
        raise InvalidInput("existing domain: a <disk> without <source>")
    if dtype == "block":
        return DiskSpec("block", src.get("dev", ""))
    if dtype == "network":
        host = src.find("host")
        h = ""
        if host is not None:
            h = host.get("name", "") + (f":{host.get('port')}" if host.get("port") else "")
        return DiskSpec("network", src.get("name", ""), src.get("protocol", ""), h)
    fmt = driver.get("type", "raw") if driver is not None else "raw"
    io = driver.get("io", "") if driver is not None else ""
    kind = "qcow2" if fmt == "qcow2" else ("raw-preallocated" if io == "native" else "raw")
    return DiskSpec(kind, src.get("file", ""))


def _nic_spec(iface: etree._Element) -> NicSpec:
    src = iface.find("source")
    mac = iface.find("mac")
    return NicSpec(
        network=src.get("network", "") if src is not None and iface.get("type") == "network"
        else "",
        bridge=src.get("bridge", "") if src is not None and iface.get("type") == "bridge" else "",
        mac=mac.get("address", "").lower() if mac is not None else "",
    )


def request_from_domain(
    dom: etree._Element, overrides: dict[str, Any], data: DataSources = DEFAULT_DATA
) -> GuestRequest:
    """The request an existing definition answers, with `overrides` (fields the
    operator gave) on top. Name and UUID always come from the definition.
    Firmware and TPM are asked for explicitly only where the OS's own default
    would differ, so a guest regenerated unchanged has the same inputs."""
    if dom.tag != "domain":
        raise InvalidInput(f"existing domain: root element is <{dom.tag}>, not <domain>")
    os_id = overrides.get("os") or _meta(dom, "os")
    if not os_id:
        raise InvalidInput("the existing domain has no hvfleet metadata naming its OS; give it",
                           field="os")
    os = load_os_database(data.osinfo_dir).get(str(os_id))
    policy = get_policy(str(overrides.get("policy") or _meta(dom, "policy") or "2026.1"))
    efi = _is_efi(dom)
    firmware = "auto" if efi == os.needs_efi() else ("efi" if efi else "bios")
    tpm_by_default = any(s in policy.tpm_required_os for s in os.lineage)
    fields: dict[str, Any] = {
        "os": os_id,
        "name": (dom.findtext("name") or "").strip(),
        "uuid": (dom.findtext("uuid") or "").strip().lower(),
        "vcpus": int((dom.findtext("vcpu") or "0").strip() or 0),
        "memory": _memory_bytes(dom.find("memory")),
        "disks": tuple(_disk_spec(d) for d in dom.findall("devices/disk[@device='disk']")),
        "nics": tuple(_nic_spec(i) for i in dom.findall("devices/interface")),
        "firmware": firmware,
        "secure_boot": _secure_boot(dom),
        "tpm": dom.find("devices/tpm") is not None and not tpm_by_default,
        "mode": _meta(dom, "mode") or "intersection",
        "policy": _meta(dom, "policy") or "2026.1",
        "drivers": tuple(d for d in _meta(dom, "drivers").split(",") if d),
    }
    for key, value in overrides.items():
        if key in ("name", "uuid"):
            raise InvalidInput(f"a regenerated guest keeps the existing {key}", field=key)
        fields[key] = value
    return GuestRequest(**fields)


def _is_efi(dom: etree._Element) -> bool:
    os_el = dom.find("os")
    return os_el is not None and (os_el.get("firmware") == "efi"
                                  or os_el.find("loader") is not None)


def _secure_boot(dom: etree._Element) -> bool:
    sb = dom.find("os/firmware/feature[@name='secure-boot']")
    return sb is not None and sb.get("enabled") == "yes"


def _cpu_value(dom: etree._Element) -> GuestCPU | None:
    cpu = dom.find("cpu")
    if cpu is None or cpu.get("mode", "custom") != "custom" or not cpu.findtext("model"):
        return None
    from hvfleet.discovery.capabilities import parse_cpu_element

    host = parse_cpu_element(cpu, "existing domain cpu")
    features = expand_cpu(HostCPU(vendor=host.vendor, model=host.model, features=host.features,
                                  disabled_features=host.disabled_features),
                          load_cpu_map(), "existing domain cpu")
    return GuestCPU("kept", host.model, host.vendor, tuple(host.features),
                    tuple(host.disabled_features), features)


# The areas that are one attribute of one element: (area, element, attribute).
_ONE_ATTRIBUTE = (
    ("disk bus", "devices/disk/target", "bus"),
    ("nic", "devices/interface/model", "type"),
    ("usb", "devices/controller[@type='usb']", "model"),
    ("video", "devices/video/model", "type"),
)


def _values(dom: etree._Element) -> dict[str, Any]:
    """Typed values of the existing definition's ABI settings, as Plan decisions hold them;
    an area missing here (e.g. a non-custom CPU, no NICs) is not kept."""
    v: dict[str, Any] = {}
    machine = dom.find("os/type")
    if machine is not None and machine.get("machine"):
        v["machine"] = machine.get("machine")
    cpu = _cpu_value(dom)
    if cpu is not None:
        v["cpu"] = cpu
    t = dom.find("cpu/topology")
    v["topology"] = (Topology(int(t.get("sockets", "1")), int(t.get("cores", "1")),
                              int(t.get("threads", "1"))) if t is not None else None)
    v["firmware"] = Firmware(_is_efi(dom), _secure_boot(dom))
    tpm = dom.find("devices/tpm")
    backend = tpm.find("backend") if tpm is not None else None
    v["tpm"] = (TPM(tpm.get("model", "tpm-tis"),
                    backend.get("version", "2.0") if backend is not None else "2.0")
                if tpm is not None else None)
    hv = dom.find("features/hyperv")
    if hv is None:
        v["hyperv"] = None
    else:
        on = [c for c in hv if c.get("state", "on") == "on"]
        spin = hv.find("spinlocks")
        vendor = hv.find("vendor_id")
        v["hyperv"] = HyperV(
            tuple(c.tag for c in on),
            int(spin.get("retries", "8191")) if spin is not None else 8191,
            hv.find("stimer/direct[@state='on']") is not None,
            vendor.get("value", "") if vendor is not None else "",
        )
    clock = dom.find("clock")
    if clock is not None:
        timers: list[tuple[str, str, str]] = []
        hvclock = False
        for tm in clock.findall("timer"):
            name = tm.get("name", "")
            if name == "hypervclock":
                hvclock = tm.get("present") == "yes"
                continue
            attr = next((a for a in tm.attrib if a != "name"), "present")
            timers.append((name, str(attr), tm.get(str(attr), "yes")))
        v["clock"] = Clock(clock.get("offset", "utc"), hvclock, tuple(timers))
    for area, path, attribute in _ONE_ATTRIBUTE:
        element = dom.find(path)
        if element is not None and element.get(attribute):
            v[area] = element.get(attribute)
    balloon = dom.find("devices/memballoon")
    v["memballoon"] = balloon is not None and balloon.get("model") not in (None, "none")
    v["rng"] = dom.find("devices/rng") is not None
    panic = dom.find("devices/panic")
    v["panic"] = panic.get("model", "isa") if panic is not None else None
    v["vmcoreinfo"] = dom.find("features/vmcoreinfo[@state='on']") is not None
    return v


# -- ABI settings as comparable text --------------------------------------------------------


def abi_of(dom: etree._Element) -> dict[str, str]:
    """Each ABI area of a domain as one comparable line."""
    v = _values(dom)
    out: dict[str, str] = {}
    for area in AREAS:
        out[area] = _show(area, v.get(area, _MISSING), dom)
    return out


_MISSING = object()


def _show(area: str, value: Any, dom: etree._Element | None = None) -> str:
    if value is _MISSING:
        if area == "cpu" and dom is not None and dom.find("cpu") is not None:
            return f"mode {dom.find('cpu').get('mode', 'custom')}"  # type: ignore[union-attr]
        return "none"
    if value is None:
        return "none" if area != "topology" else "libvirt default"
    if isinstance(value, GuestCPU):
        parts = [value.model] + ([f"vendor {value.vendor}"] if value.vendor else [])
        parts += [f"+{f}" for f in value.require] + [f"-{f}" for f in value.disable]
        return " ".join(parts)
    if isinstance(value, Topology):
        return (f"{value.sockets} sockets × {value.cores} cores × {value.threads} thread"
                + ("s" if value.threads != 1 else ""))
    if isinstance(value, Firmware):
        return ("efi" + (" + secure boot" if value.secure_boot else "")) if value.efi else "bios"
    if isinstance(value, TPM):
        return f"{value.model} {value.version}"
    if isinstance(value, HyperV):
        feats = [f"vendor_id={value.vendor_id}" if f == "vendor_id" else f
                 for f in value.features]
        return ", ".join(feats)
    if isinstance(value, Clock):
        timers = ", ".join(f"{n} {a}={x}" for n, a, x in value.timers)
        return f"{value.offset}; {timers}" + ("; hypervclock" if value.hypervclock else "")
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def abi_diff(old: etree._Element, new: etree._Element) -> list[ABIChange]:
    a, b = abi_of(old), abi_of(new)
    return [ABIChange(area, a[area], b[area]) for area in AREAS if a[area] != b[area]]


# -- regeneration ------------------------------------------------------------------------------


def _problems(xml: str, group: HostGroup) -> set[tuple[str, str]]:
    dom = etree.fromstring(xml.encode())
    return {(v.host, p) for v in check_domain(dom, group) for p in v.problems}


def _with(plan: Plan, area: str, value: Any, group: HostGroup) -> Plan:
    field = AREAS[area]
    kept = Decision(area, value, _show(area, value),
                    "kept from the existing definition (guest ABI)")
    update: dict[str, Any] = {field: kept}
    plan = dataclasses.replace(plan, **update)
    if area == "disk bus":
        scope = Scope(plan.request.mode, plan.policy)
        plan = dataclasses.replace(
            plan, disks=decide_disks(plan.request.disks, value, group, scope))
    return plan


def regenerate(
    existing: etree._Element,
    group: HostGroup,
    overrides: dict[str, Any] | None = None,
    allow_abi_change: bool = False,
    data: DataSources = DEFAULT_DATA,
) -> Regeneration:
    """The existing guest, regenerated for `group` with its ABI kept where it
    still runs on every host. Conflict (listing each setting that must change)
    unless `allow_abi_change`."""
    req = request_from_domain(existing, overrides or {}, data)
    fresh = plan_guest(req, group, data)
    hosts = sorted(group.names)
    fresh_xml = render_domain(fresh, hosts)
    baseline = _problems(fresh_xml, group)
    old = _values(existing)
    fresh_abi = abi_of(etree.fromstring(fresh_xml.encode()))
    old_abi = abi_of(existing)
    data_changes = tuple(changed_versions(recorded_versions(existing), data.versions()))
    plan = fresh
    kept: list[ABIChange] = []
    changed: list[ABIChange] = []
    for area in AREAS:
        if old_abi[area] == fresh_abi[area]:
            continue
        if area not in old:
            changed.append(ABIChange(area, old_abi[area], fresh_abi[area],
                                     "hvfleet cannot write the existing setting"))
            continue
        candidate = _with(plan, area, old[area], group)
        new_problems = _problems(render_domain(candidate, hosts), group) - baseline
        if new_problems:
            why = "; ".join(f"{h}: {p}" for h, p in sorted(new_problems)[:4])
            changed.append(ABIChange(area, old_abi[area], fresh_abi[area],
                                     f"does not run on every host: {why}"))
        else:
            plan = candidate
            kept.append(ABIChange(area, old_abi[area], fresh_abi[area]))
    if data_changes and changed:
        changed = [dataclasses.replace(c, why=c.why + f"; data sets changed: "
                                       f"{'; '.join(data_changes)}") for c in changed]
    xml = render_domain(plan, hosts)
    final = _problems(xml, group) - baseline
    if final:  # kept settings that only fail together
        raise NotEverywhere("regenerate: the kept settings together do not run on every host: "
                           + "; ".join(f"{h}: {p}" for h, p in sorted(final)[:4]))
    if changed and not allow_abi_change:
        raise Conflict(
            f"needed: guest {req.name}'s ABI must change to run on every host of the group: "
            + "; ".join(c.line() for c in changed),
            field="allow_abi_change",
        )
    return Regeneration(xml, plan, tuple(kept), tuple(changed), data_changes)


def upgrade(
    existing: etree._Element, group: HostGroup, policy: str,
    overrides: dict[str, Any] | None = None, data: DataSources = DEFAULT_DATA,
) -> Regeneration:
    """The existing guest under policy `policy` (same name and UUID); every
    ABI setting that differs is listed as changed."""
    get_policy(policy)
    req = request_from_domain(existing, {**(overrides or {}), "policy": policy}, data)
    plan = plan_guest(req, group, data)
    xml = render_domain(plan, sorted(group.names))
    diff = abi_diff(existing, etree.fromstring(xml.encode()))
    data_changes = tuple(changed_versions(recorded_versions(existing), data.versions()))
    return Regeneration(xml, plan, (), tuple(diff), data_changes)
