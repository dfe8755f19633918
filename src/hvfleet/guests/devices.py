"""The other devices: NIC, USB, input, video, balloon, RNG, panic, graphics, vmcoreinfo.

Paravirtual devices when the OS has the driver in-box (osinfo), emulated ones
otherwise; each only if every host offers it (or, where libvirt is too old to
say, the host's QEMU version is known to).
"""

from __future__ import annotations

from dataclasses import dataclass

from hvfleet.guests.decision import Decision, hosts_list
from hvfleet.guests.osinfo import OSInfo
from hvfleet.guests.policy import Policy
from hvfleet.guests.request import HostGroup
from hvfleet.model.errors import InvalidInput


@dataclass(frozen=True)
class Devices:
    nic_model: str
    usb_model: str
    video: str
    balloon: bool
    rng: bool
    panic: str | None
    vmcoreinfo: bool
    vnc_listen: str


def decide_nic(os: OSInfo) -> Decision[str]:
    if os.supports("virtio-net"):
        return Decision("nic", "virtio", "virtio", "virtio-net driver in-box",
                        (os.device_evidence("virtio-net"),))
    return Decision("nic", "e1000e", "e1000e", "no in-box virtio-net driver: Intel e1000e",
                    (os.device_evidence("virtio-net"), os.device_evidence("e1000e")))


def decide_usb(os: OSInfo) -> Decision[str]:
    if os.supports("qemu-xhci"):
        return Decision("usb", "qemu-xhci", "qemu-xhci", "USB 3 controller with in-box driver",
                        (os.device_evidence("qemu-xhci"),))
    return Decision("usb", "ich9-ehci1", "ich9-ehci1", "no in-box xHCI driver: USB 2 EHCI",
                    (os.device_evidence("qemu-xhci"),))


def decide_video(os: OSInfo, group: HostGroup) -> Decision[str]:
    def everywhere(model: str) -> bool:
        return all(c.video_models is None or model in c.video_models for _, c in group.hosts)

    if os.supports("virtio-gpu") and everywhere("virtio"):
        return Decision("video", "virtio", "virtio", "virtio-gpu driver in-box",
                        (os.device_evidence("virtio-gpu"),))
    if not everywhere("vga"):
        raise InvalidInput("video: the standard VGA model is not offered on every host")
    return Decision("video", "vga", "vga", "no in-box virtio-gpu driver: standard VGA",
                    (os.device_evidence("virtio-gpu"),))


def decide_balloon(os: OSInfo, policy: Policy) -> Decision[bool]:
    if os.supports("virtio-balloon"):
        return Decision("memballoon", True, f"virtio, stats every {policy.balloon_stats_period}s",
                        "the guest has the balloon driver: memory stats for the host",
                        (os.device_evidence("virtio-balloon"),))
    return Decision("memballoon", False, "none",
                    "no in-box balloon driver: a balloon device would only sit there",
                    (os.device_evidence("virtio-balloon"),))


def decide_rng(os: OSInfo, group: HostGroup, policy: Policy) -> Decision[bool]:
    lacking = [n for n, c in group.hosts if c.rng_models is not None and "virtio" not in c.rng_models]
    if os.supports("virtio-rng") and not lacking:
        return Decision("rng", True, f"virtio ← {policy.rng_backend}",
                        "entropy for the guest early in boot", (os.device_evidence("virtio-rng"),))
    why = (f"virtio-rng not offered on {hosts_list(lacking)}" if lacking
           else "no in-box virtio-rng driver")
    return Decision("rng", False, "none", why, (os.device_evidence("virtio-rng"),))


def decide_panic(
    os: OSInfo, group: HostGroup, hyperv: frozenset[str], domain_type: str
) -> Decision[str | None]:
    # pvpanic (ISA) for Linux; Windows reports crashes through the Hyper-V
    # crash MSRs, which exist only with KVM's Hyper-V emulation.
    if os.is_windows:
        if domain_type != "kvm" or not hyperv:
            return Decision("panic", None, "none",
                            "Windows panic reporting needs Hyper-V enlightenments under KVM")
        model = "hyperv"
    elif os.is_linux:
        model = "isa"
    else:
        return Decision("panic", None, "none", f"no panic driver known for {os.short_id}")
    evidence = []
    for name, caps in group.hosts:
        if caps.panic_models is None:
            evidence.append(f"{name}: libvirt does not list panic models; "
                            f"QEMU {caps.hypervisor_version or '?'} has had {model} since 2.5")
        elif model not in caps.panic_models:
            return Decision("panic", None, "none", f"panic model {model} not offered on {name}",
                            tuple(evidence))
    return Decision(
        "panic", model, model,
        "the host learns that the guest crashed"
        + (" (pvpanic)" if model == "isa" else " (Hyper-V crash MSRs)"),
        tuple(evidence[:4]),
    )


def decide_vmcoreinfo(group: HostGroup) -> Decision[bool]:
    unknown = [n for n, c in group.hosts if c.vmcoreinfo is None]
    lacking = [n for n, c in group.hosts if c.vmcoreinfo is False]
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
        raise InvalidInput(f"graphics: VNC is not offered on {hosts_list(lacking)}")
    return Decision("graphics", policy.vnc_listen, f"vnc on {policy.vnc_listen}",
                    "a console for operators, reachable only from the host (tunnel over SSH)")
