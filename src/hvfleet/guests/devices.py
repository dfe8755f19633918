"""The other devices: NIC, USB, input, video, balloon, RNG, panic, graphics, vmcoreinfo.

Paravirtual devices when the OS has the driver in-box (osinfo), or the request
declares drivers the policy honours (virtio-win for Windows), emulated ones
otherwise; each only if every host offers it (or, where libvirt is too old to
say, the host's QEMU version is known to). Model names come from the policy.
In mode none the hosts are not asked which model to use, only checked to
offer the one chosen.
"""

from __future__ import annotations

from hvfleet.guests.decision import Decision, hosts_list
from hvfleet.guests.errors import NotEverywhere
from hvfleet.guests.osinfo import OSInfo
from hvfleet.guests.policy import Policy
from hvfleet.guests.request import GuestRequest, HostGroup
from hvfleet.guests.scope import Scope


def os_has(os: OSInfo, device: str, req: GuestRequest, policy: Policy) -> tuple[bool, str]:
    """Has the guest a driver for `device`: in-box, or through declared drivers?"""
    if os.supports(device):
        return True, os.device_evidence(device)
    if (os.is_windows and "virtio-win" in req.drivers and "virtio-win" in policy.honoured_drivers
            and device in policy.virtio_win_devices):
        listed = " (osinfo lists it)" if os.via_driver(device) else ""
        return True, f"request declares virtio-win drivers: {device} through them{listed}"
    return False, os.device_evidence(device)


def decide_nic(os: OSInfo, req: GuestRequest, policy: Policy) -> Decision[str]:
    virtio, fallback = policy.nic
    has, evidence = os_has(os, "virtio-net", req, policy)
    if has:
        how = "in-box" if os.supports("virtio-net") else "declared"
        return Decision("nic", virtio, virtio, f"virtio-net driver {how}", (evidence,))
    return Decision("nic", fallback, fallback, "no in-box virtio-net driver: Intel e1000e",
                    (evidence, os.device_evidence("e1000e")))


def decide_usb(os: OSInfo, policy: Policy) -> Decision[str]:
    xhci, fallback = policy.usb
    if os.supports("qemu-xhci"):
        return Decision("usb", xhci, xhci, "USB 3 controller with in-box driver",
                        (os.device_evidence("qemu-xhci"),))
    return Decision("usb", fallback, fallback, "no in-box xHCI driver: USB 2 EHCI",
                    (os.device_evidence("qemu-xhci"),))


def decide_video(os: OSInfo, group: HostGroup, scope: Scope) -> Decision[str]:
    virtio, fallback = scope.policy.video

    def lacking(model: str) -> list[str]:
        return [n for n, c in group.hosts if c.video_models is not None
                and model not in c.video_models]

    if os.supports("virtio-gpu") and (not scope.software or not lacking(virtio)):
        scope.refuse_lacking("video", virtio, lacking(virtio))
        return Decision("video", virtio, virtio, "virtio-gpu driver in-box",
                        (os.device_evidence("virtio-gpu"),))
    if lacking(fallback):
        raise NotEverywhere("video: the standard VGA model is not offered on every host")
    return Decision("video", fallback, fallback, "no in-box virtio-gpu driver: standard VGA",
                    (os.device_evidence("virtio-gpu"),))


def decide_balloon(os: OSInfo, req: GuestRequest, policy: Policy) -> Decision[bool]:
    has, evidence = os_has(os, "virtio-balloon", req, policy)
    if has:
        return Decision("memballoon", True, f"virtio, stats every {policy.balloon_stats_period}s",
                        "the guest has the balloon driver: memory stats for the host",
                        (evidence,))
    return Decision("memballoon", False, "none",
                    "no in-box balloon driver: a balloon device would only sit there",
                    (evidence,))


def decide_rng(os: OSInfo, group: HostGroup, req: GuestRequest, scope: Scope) -> Decision[bool]:
    policy = scope.policy
    lacking = [n for n, c in group.hosts if c.rng_models is not None and "virtio" not in c.rng_models]
    has, evidence = os_has(os, "virtio-rng", req, policy)
    if has and not scope.software:
        scope.refuse_lacking("rng", "virtio-rng", lacking)
    if has and not lacking:
        return Decision("rng", True, f"virtio ← {policy.rng_backend}",
                        "entropy for the guest early in boot", (evidence,))
    why = (f"virtio-rng not offered on {hosts_list(lacking)}" if has
           else "no in-box virtio-rng driver")
    return Decision("rng", False, "none", why, (evidence,))


def decide_panic(
    os: OSInfo, group: HostGroup, hyperv: frozenset[str], domain_type: str, scope: Scope
) -> Decision[str | None]:
    # pvpanic (ISA) for Linux; Windows reports crashes through the Hyper-V
    # crash MSRs, which exist only with KVM's Hyper-V emulation.
    policy = scope.policy
    if os.is_windows:
        if domain_type != "kvm" or not hyperv:
            return Decision("panic", None, "none",
                            "Windows panic reporting needs Hyper-V enlightenments under KVM")
        model = policy.panic_windows
    elif os.is_linux:
        model = policy.panic_linux
    else:
        return Decision("panic", None, "none", f"no panic driver known for {os.short_id}")
    evidence = []
    for name, caps in group.hosts:
        if caps.panic_models is None:
            evidence.append(f"{name}: libvirt does not list panic models; "
                            f"QEMU {caps.hypervisor_version or '?'} has had {model} since 2.5")
        elif model not in caps.panic_models:
            scope.refuse_lacking("panic", f"panic model {model}", [name] if not scope.software
                                 else [])
            return Decision("panic", None, "none", f"panic model {model} not offered on {name}",
                            tuple(evidence))
    return Decision(
        "panic", model, model,
        "the host learns that the guest crashed"
        + (" (pvpanic)" if model == "isa" else " (Hyper-V crash MSRs)"),
        tuple(evidence[:4]),
    )


def decide_vmcoreinfo(group: HostGroup, scope: Scope) -> Decision[bool]:
    unknown = [n for n, c in group.hosts if c.vmcoreinfo is None]
    lacking = [n for n, c in group.hosts if c.vmcoreinfo is False]
    if not scope.software:
        # QEMU has had vmcoreinfo since 2.11, below every policy floor.
        scope.refuse_lacking("vmcoreinfo", "vmcoreinfo", lacking)
        return Decision("vmcoreinfo", True, "on",
                        "host-side dumps of the guest find its kernel (KASLR)",
                        (f"mode none: in the policy floor ({scope.floor})",))
    if not unknown and not lacking:
        return Decision("vmcoreinfo", True, "on",
                        "host-side dumps of the guest find its kernel (KASLR)",
                        ("every host's domcapabilities offers vmcoreinfo",))
    why = (f"not offered on {hosts_list(lacking)}" if lacking
           else f"support unknown on {hosts_list(unknown)} (no domcapabilities)")
    return Decision("vmcoreinfo", False, "off", why)


def decide_graphics(group: HostGroup, policy: Policy) -> Decision[str]:
    lacking = [n for n, c in group.hosts if c.graphics_types is not None
               and "vnc" not in c.graphics_types]
    if lacking:
        raise NotEverywhere(f"graphics: VNC is not offered on {hosts_list(lacking)}")
    return Decision("graphics", policy.vnc_listen, f"vnc on {policy.vnc_listen}",
                    "a console for operators, reachable only from the host (tunnel over SSH)")


def decide_lifecycle(group: HostGroup, scope: Scope) -> Decision[tuple[str, str, str]]:
    """on_poweroff, on_reboot, on_crash; a dumping crash action only where every
    host has a dump location (HostCapabilities.dump_location)."""
    policy = scope.policy
    crash = policy.on_crash
    evidence: list[str] = []
    why = f"policy {policy.version}: on_crash {crash}"
    if policy.on_crash_with_dump:
        no_dump = [n for n, c in group.hosts if not c.dump_location]
        if not scope.software:
            why += " (mode none: no host's dump location is assumed)"
        elif not no_dump:
            crash = policy.on_crash_with_dump
            why = f"every host has a dump location: on_crash {crash} keeps a core for analysis"
            evidence = [f"{n}: dumps to {c.dump_location}" for n, c in group.hosts][:6]
        else:
            why += f" (no dump location on {hosts_list(no_dump)}, so no {policy.on_crash_with_dump})"
    value = (policy.on_poweroff, policy.on_reboot, crash)
    return Decision("lifecycle", value,
                    f"poweroff {value[0]}, reboot {value[1]}, crash {value[2]}", why,
                    tuple(evidence))
