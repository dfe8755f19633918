"""The plan → libvirt domain XML, deterministically (same plan, same bytes).

Elements are written in the order libvirt itself formats them, every default
the policy cares about is spelled out, and nothing host-specific (emulator
path, loader path) is written, so the XML means the same on every host.
"""

from __future__ import annotations

from lxml import etree

import hvfleet
from hvfleet.guests.cpu import cpu_element
from hvfleet.guests.plan import Plan
from hvfleet.guests.request import host_and_port

NS = "https://hvfleet.io/xmlns/guest/1"


def _sub(parent: etree._Element, tag: str, text: str | None = None, **attrs: str) -> etree._Element:
    el = etree.SubElement(parent, tag, attrs)
    if text is not None:
        el.text = text
    return el


def _metadata(dom: etree._Element, plan: Plan, hosts: list[str]) -> None:
    md = _sub(dom, "metadata")
    g = etree.SubElement(md, f"{{{NS}}}guest", nsmap={"hvfleet": NS})
    for tag, value in (
        ("version", hvfleet.__version__),
        ("policy", plan.policy.version),
        ("mode", plan.request.mode),
        ("os", plan.os.short_id),
        ("inputs-digest", plan.digest),
    ):
        etree.SubElement(g, f"{{{NS}}}{tag}").text = value
    if plan.policy.record_data_versions:
        for tag, value in sorted(plan.data_versions.items()):
            etree.SubElement(g, f"{{{NS}}}{tag.replace('_', '-')}").text = value
        if plan.request.drivers:
            etree.SubElement(g, f"{{{NS}}}drivers").text = ",".join(plan.request.drivers)
    hs = etree.SubElement(g, f"{{{NS}}}hosts")
    for h in hosts:
        etree.SubElement(hs, f"{{{NS}}}host").text = h


def _features(dom: etree._Element, plan: Plan) -> None:
    feats = _sub(dom, "features")
    _sub(feats, "acpi")
    _sub(feats, "apic")
    hv = plan.hyperv.value
    if hv:
        h = _sub(feats, "hyperv", mode="custom")
        for f in hv.features:
            if f == "spinlocks":
                _sub(h, "spinlocks", state="on", retries=str(hv.spinlock_retries))
            elif f == "stimer":
                s = _sub(h, "stimer", state="on")
                if hv.stimer_direct:
                    _sub(s, "direct", state="on")
            elif f == "vendor_id":
                _sub(h, "vendor_id", state="on", value=hv.vendor_id)
            else:
                _sub(h, f, state="on")
    if plan.vmcoreinfo.value:
        _sub(feats, "vmcoreinfo", state="on")
    if plan.firmware.value.secure_boot:
        _sub(feats, "smm", state="on")


def _cpu(plan: Plan) -> etree._Element:
    el = cpu_element(plan.cpu.value)
    el.set("check", plan.policy.cpu_check)
    topo = plan.topology.value
    if topo:
        # libvirt's order: model, vendor, topology, features.
        at = len([c for c in el if c.tag in ("model", "vendor")])
        t = etree.Element("topology", sockets=str(topo.sockets), dies="1",
                          cores=str(topo.cores), threads=str(topo.threads))
        el.insert(at, t)
    return el


def _clock(dom: etree._Element, plan: Plan) -> None:
    c = plan.clock.value
    clock = _sub(dom, "clock", offset=c.offset)
    for name, attr, value in c.timers:
        _sub(clock, "timer", name=name, **{attr: value})
    if c.hypervclock:
        _sub(clock, "timer", name="hypervclock", present="yes")


def _devices(dom: etree._Element, plan: Plan) -> None:
    devs = _sub(dom, "devices")
    for d in plan.disks.value:
        s = d.spec
        dtype = {"block": "block", "network": "network"}.get(s.kind, "file")
        disk = _sub(devs, "disk", type=dtype, device="disk")
        _sub(disk, "driver", name="qemu", type=d.format, cache=d.cache, io=d.io,
             discard=d.discard)
        if dtype == "file":
            _sub(disk, "source", file=s.source)
        elif dtype == "block":
            _sub(disk, "source", dev=s.source)
        else:
            src = _sub(disk, "source", protocol=s.protocol, name=s.source)
            if s.host:
                hname, port = host_and_port(s.host)
                if port:
                    _sub(src, "host", name=hname, port=port)
                else:
                    _sub(src, "host", name=hname)
        _sub(disk, "target", dev=d.target, bus=d.bus)
    _sub(devs, "controller", type="usb", model=plan.usb.value,
         **({"ports": str(plan.policy.usb_ports)} if plan.usb.value == "qemu-xhci" else {}))
    for n in plan.request.nics:
        iface = _sub(devs, "interface", type="network" if n.network else "bridge")
        if n.mac:
            _sub(iface, "mac", address=n.mac)
        if n.network:
            _sub(iface, "source", network=n.network)
        else:
            _sub(iface, "source", bridge=n.bridge)
        _sub(iface, "model", type=plan.nic.value)
    _sub(devs, "input", type="tablet", bus="usb")
    g = _sub(devs, "graphics", type="vnc", port="-1", autoport="yes", listen=plan.graphics.value)
    _sub(g, "listen", type="address", address=plan.graphics.value)
    video = _sub(devs, "video")
    _sub(video, "model", type=plan.video.value, heads="1", primary="yes")
    tpm = plan.tpm.value
    if tpm:
        t = _sub(devs, "tpm", model=tpm.model)
        _sub(t, "backend", type="emulator", version=tpm.version)
    if plan.balloon.value:
        b = _sub(devs, "memballoon", model="virtio")
        _sub(b, "stats", period=str(plan.policy.balloon_stats_period))
    else:
        _sub(devs, "memballoon", model="none")
    if plan.rng.value:
        r = _sub(devs, "rng", model="virtio")
        _sub(r, "backend", plan.policy.rng_backend, model="random")
    if plan.panic.value:
        _sub(devs, "panic", model=plan.panic.value)


def render_domain(plan: Plan, hosts: list[str]) -> str:
    req = plan.request
    dom = etree.Element("domain", type=plan.domain_type.value)
    _sub(dom, "name", req.name)
    if req.uuid:
        _sub(dom, "uuid", req.uuid)
    _metadata(dom, plan, hosts)
    kib = str(req.memory // 1024)
    _sub(dom, "memory", kib, unit="KiB")
    _sub(dom, "currentMemory", kib, unit="KiB")
    _sub(dom, "vcpu", str(req.vcpus), placement="static")
    fw = plan.firmware.value
    os_el = _sub(dom, "os", **({"firmware": "efi"} if fw.efi else {}))
    _sub(os_el, "type", "hvm", arch="x86_64", machine=plan.machine.value)
    if fw.efi:
        f = _sub(os_el, "firmware")
        _sub(f, "feature", enabled="yes" if fw.secure_boot else "no", name="enrolled-keys")
        _sub(f, "feature", enabled="yes" if fw.secure_boot else "no", name="secure-boot")
    _sub(os_el, "boot", dev="hd")
    _features(dom, plan)
    dom.append(_cpu(plan))
    _clock(dom, plan)
    poweroff, reboot, crash = plan.lifecycle.value
    _sub(dom, "on_poweroff", poweroff)
    _sub(dom, "on_reboot", reboot)
    _sub(dom, "on_crash", crash)
    _devices(dom, plan)
    return etree.tostring(dom, pretty_print=True, encoding="unicode")
