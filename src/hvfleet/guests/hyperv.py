"""Hyper-V enlightenments for Windows guests.

Only features every host supports. A host whose libvirt is too old to list
Hyper-V features in domcapabilities is not a host without them: for such a
host the features its QEMU version is known to support are used, and the
explanation says so. `evmcs` (nested Hyper-V) only when every host is Intel;
`reenlightenment` never, because it breaks live migration. Dependencies are
respected: synic needs vpindex, stimer needs synic, tlbflush and ipi need
vpindex. `vendor_id` (policies that set `hyperv_vendor_id`) writes the
policy's signature. In mode software `evmcs` is left out (whether every host
is Intel is a hardware fact); in mode none the features are those QEMU had
at the policy floor, and every host that lists its features must have them.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvfleet.guests.decision import Decision, hosts_list
from hvfleet.guests.osinfo import OSInfo
from hvfleet.guests.policy import Policy
from hvfleet.guests.request import HostGroup
from hvfleet.guests.scope import Scope
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import major_minor

# QEMU version (major, minor) that first offered each enlightenment under KVM.
KNOWN_SINCE: dict[str, tuple[int, int]] = {
    "relaxed": (1, 1), "vapic": (1, 1), "spinlocks": (1, 1),
    "vpindex": (2, 3), "runtime": (2, 3), "synic": (2, 6), "stimer": (2, 6),
    "reset": (2, 6), "vendor_id": (2, 5), "frequencies": (2, 12),
    "reenlightenment": (3, 0), "tlbflush": (3, 0), "ipi": (4, 1), "evmcs": (3, 1),
}
REQUIRES: dict[str, tuple[str, ...]] = {
    "synic": ("vpindex",), "stimer": ("synic", "vpindex"),
    "tlbflush": ("vpindex",), "ipi": ("vpindex",), "evmcs": ("vapic",),
}


@dataclass(frozen=True)
class HyperV:
    features: tuple[str, ...]  # in policy order
    spinlock_retries: int
    stimer_direct: bool
    vendor_id: str = ""


def _wanted(policy: Policy) -> list[str]:
    wanted = [f for f in policy.hyperv_wanted if f not in policy.hyperv_never]
    if policy.hyperv_vendor_id:
        if len(policy.hyperv_vendor_id) > 12:
            raise InvalidInput(f"policy {policy.version}: hyperv_vendor_id is over 12 characters")
        # libvirt's order: vendor_id after reset/stimer.
        at = wanted.index("frequencies") if "frequencies" in wanted else len(wanted)
        wanted.insert(at, "vendor_id")
    return wanted


def _floor_features(
    wanted: list[str], group: HostGroup, domain_type: str, scope: Scope
) -> tuple[set[str], list[str]]:
    """Mode none: the features QEMU had at the floor (under KVM; those of TCG
    otherwise), checked against each host."""
    if domain_type == "kvm":
        available = {f for f in wanted if KNOWN_SINCE.get(f, (99, 0)) <= scope.policy.floor_qemu}
        available.discard("evmcs")  # Intel only: a hardware fact
        why = f"mode none: Hyper-V features of {scope.floor} under KVM (evmcs left out)"
    else:
        available = set(wanted) & set(scope.policy.hyperv_tcg)
        why = "mode none, not every host has KVM: the Hyper-V features of TCG"
    for name, caps in group.hosts:
        if caps.hyperv_features is not None:
            missing = sorted(available - set(caps.hyperv_features))
            scope.refuse_lacking("hyperv", f"Hyper-V {', '.join(missing)}",
                                 [name] if missing else [])
    return available, [why]


def decide_hyperv(
    os: OSInfo, group: HostGroup, domain_type: str, scope: Scope
) -> Decision[HyperV | None]:
    policy = scope.policy
    if not os.is_windows:
        return Decision("hyperv", None, "none", f"{os.short_id} is not Windows")
    wanted = _wanted(policy)
    if not scope.software:
        floor, why = _floor_features(wanted, group, domain_type, scope)
        return _result(os, group, policy, wanted, floor, why)
    available = set(wanted)
    evidence: list[str] = []
    for name, caps in group.hosts:
        if caps.hyperv_features is not None:
            have = set(caps.hyperv_features)
            evidence.append(f"{name}: domcapabilities lists {len(have)} Hyper-V features")
        elif domain_type == "kvm" and (v := major_minor(caps.hypervisor_version)):
            have = {f for f, since in KNOWN_SINCE.items() if v >= since}
            evidence.append(
                f"{name}: libvirt too old to list Hyper-V features; QEMU {v[0]}.{v[1]} "
                f"is known to support {len(have)} of them"
            )
        else:
            have = set()
            evidence.append(f"{name}: Hyper-V support unknown (no domcapabilities, no version)")
        missing = available - have
        if missing:
            evidence.append(f"{name} lacks {', '.join(sorted(missing))}")
        available &= have
    vendors = {caps.cpu.vendor for _, caps in group.hosts}
    if "evmcs" in available and not scope.hardware:
        available.discard("evmcs")
        evidence.append("evmcs left out: mode software does not look at the CPU vendor")
    elif "evmcs" in available and vendors != {"Intel"}:
        available.discard("evmcs")
        evidence.append("evmcs left out: not every host is Intel")
    return _result(os, group, policy, wanted, available, evidence)


def _result(
    os: OSInfo, group: HostGroup, policy: Policy, wanted: list[str], available: set[str],
    evidence: list[str],
) -> Decision[HyperV | None]:
    changed = True
    while changed:
        changed = False
        for f, deps in REQUIRES.items():
            if f in available and not all(d in available for d in deps):
                available.discard(f)
                evidence.append(f"{f} left out: needs {', '.join(deps)}")
                changed = True
    features = tuple(f for f in wanted if f in available)
    if not features:
        return Decision("hyperv", None, "none",
                        "no Hyper-V enlightenment is supported on every host", tuple(evidence))
    evidence.append("reenlightenment never enabled: it breaks live migration")
    return Decision(
        "hyperv",
        HyperV(features, policy.spinlock_retries, "stimer" in features,
               policy.hyperv_vendor_id if "vendor_id" in features else ""),
        ", ".join(features),
        f"Windows runs faster with enlightenments; those every host of "
        f"{hosts_list(group.names, 3)} supports",
        tuple(evidence),
    )
