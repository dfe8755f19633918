"""Domain type and machine type.

The machine type is always a versioned name present on every host (the
highest common `pc-q35-X.Y`), never the bare `q35` alias: the alias moves when
QEMU is upgraded and changes the guest ABI under a running fleet. i440fx only
when osinfo does not list q35 for the OS.
"""

from __future__ import annotations

from hvfleet.discovery.capabilities import machine_version
from hvfleet.guests.decision import Decision, hosts_list
from hvfleet.guests.osinfo import OSInfo
from hvfleet.guests.request import HostGroup
from hvfleet.model.errors import InvalidInput


def decide_domain_type(group: HostGroup) -> Decision[str]:
    kvm: list[str] = []
    other: list[str] = []
    for name, caps in group.hosts:
        t = caps.domcapabilities_domain_type or ("kvm" if "kvm" in caps.domain_types else "qemu")
        (kvm if t == "kvm" else other).append(name)
    if not other:
        return Decision("domain type", "kvm", "kvm", "every host offers KVM",
                        (f"kvm: {hosts_list(kvm)}",))
    return Decision(
        "domain type", "qemu", "qemu",
        "not every host offers KVM: software emulation (TCG) so the guest runs everywhere",
        (f"no kvm: {hosts_list(other)}",),
    )


def decide_machine(os: OSInfo, group: HostGroup, vcpus: int) -> Decision[str]:
    family = "q35" if os.supports("q35") else "i440fx"
    why_family = (
        f"osinfo lists the q35 chipset for {os.short_id}"
        if family == "q35"
        else f"osinfo does not list q35 for {os.short_id}: i440fx"
    )
    prefix = f"pc-{family}-"
    common: set[str] | None = None
    for _, caps in group.hosts:
        names = {m.canonical for m in caps.machine_types if m.canonical.startswith(prefix)}
        names |= {m.name for m in caps.machine_types if m.name.startswith(prefix)}
        common = names if common is None else common & names
    versioned = sorted(
        (n for n in common or () if machine_version(n)), key=lambda n: machine_version(n) or (0, 0)
    )
    if not versioned:
        raise InvalidInput(f"machine: no versioned {prefix}* machine type is on every host")
    chosen = versioned[-1]
    evidence = [why_family, f"{len(versioned)} versioned {prefix}* types on all hosts"]
    for name, caps in group.hosts:
        alias = next((m for m in caps.machine_types if m.name == family), None)
        if alias:
            evidence.append(f"{name}: {family} → {alias.canonical}")
        for m in caps.machine_types:
            if m.name == chosen and m.max_cpus is not None and vcpus > m.max_cpus:
                raise InvalidInput(
                    f"{vcpus}: machine {chosen} on {name} allows at most {m.max_cpus}", field="vcpus"
                )
            if m.name == chosen and m.deprecated:
                evidence.append(f"{name}: {chosen} is deprecated there")
    return Decision(
        "machine", chosen, chosen,
        "the highest versioned machine type every host has, pinned (never the bare alias)",
        tuple(evidence),
    )
