"""Domain type and machine type.

The machine type is always a versioned name present on every host (the
highest common `pc-q35-X.Y`), never the bare `q35` alias: the alias moves when
QEMU is upgraded and changes the guest ABI under a running fleet. The policy's
fallback chipset (i440fx) only when osinfo does not list q35 for the OS. In
mode none (policies with mode_scope "all") the machine type is the policy
floor's (`pc-q35-4.2`), checked to exist on every host.

The domain type follows the hosts in every mode: it is the accelerator, not
guest ABI, and libvirt refuses to define a domain type a host does not offer.
"""

from __future__ import annotations

from hvfleet.discovery.capabilities import machine_version
from hvfleet.guests.decision import Decision, hosts_list
from hvfleet.guests.errors import NotEverywhere
from hvfleet.guests.osinfo import OSInfo
from hvfleet.guests.request import HostGroup
from hvfleet.guests.scope import Scope
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import MachineType


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


def _names(machine_types: list[MachineType], prefix: str) -> set[str]:
    return {n for m in machine_types for n in (m.canonical, m.name) if n.startswith(prefix)}


def decide_machine(os: OSInfo, group: HostGroup, vcpus: int, scope: Scope) -> Decision[str]:
    policy = scope.policy
    family = policy.chipset if os.supports(policy.chipset) else policy.chipset_fallback
    why_family = (
        f"osinfo lists the {family} chipset for {os.short_id}"
        if family == policy.chipset
        else f"osinfo does not list {policy.chipset} for {os.short_id}: {family}"
    )
    prefix = f"pc-{family}-"
    evidence = [why_family]
    if not scope.software:
        major, minor = policy.floor_qemu
        chosen = f"{prefix}{major}.{minor}"
        lacking = [n for n, c in group.hosts if chosen not in _names(c.machine_types, prefix)]
        scope.refuse_lacking("machine", chosen, lacking)
        reason = f"mode none: the policy floor's machine type ({scope.floor}), on every host"
    else:
        common: set[str] | None = None
        for _, caps in group.hosts:
            names = _names(caps.machine_types, prefix)
            common = names if common is None else common & names
        versioned = sorted(
            (n for n in common or () if machine_version(n)),
            key=lambda n: machine_version(n) or (0, 0),
        )
        if not versioned:
            raise NotEverywhere(f"machine: no versioned {prefix}* machine type is on every host")
        chosen = versioned[-1]
        evidence.append(f"{len(versioned)} versioned {prefix}* types on all hosts")
        reason = "the highest versioned machine type every host has, pinned (never the bare alias)"
    for name, caps in group.hosts:
        alias = next((m for m in caps.machine_types if m.name == family), None)
        if alias and scope.software:
            evidence.append(f"{name}: {family} → {alias.canonical}")
        for m in caps.machine_types:
            if m.name == chosen and m.max_cpus is not None and vcpus > m.max_cpus:
                raise InvalidInput(
                    f"{vcpus}: machine {chosen} on {name} allows at most {m.max_cpus}", field="vcpus"
                )
            if m.name == chosen and m.deprecated:
                evidence.append(f"{name}: {chosen} is deprecated there")
    return Decision("machine", chosen, chosen, reason, tuple(evidence))
