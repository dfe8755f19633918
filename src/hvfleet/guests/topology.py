"""CPU topology: how the guest's vCPUs are split into sockets, cores and threads.

Policy 2026.1 writes no `<topology>`, so libvirt gives one socket per vCPU;
a Windows client edition then uses only 2 of a 4-vCPU guest's CPUs, as it
licenses at most 2 sockets. Policies with `cpu_topology` "os-and-hosts" write
sockets × cores × 1 thread (a thread topology only helps a guest whose vCPUs
are pinned to host SMT siblings, which hvfleet does not do): as few sockets
as keep a guest socket no wider than the smallest host socket's cores, never
more sockets than the OS uses. Modes software and none (hardware unknown)
leave the hosts' topology out.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvfleet.guests.decision import Decision
from hvfleet.guests.osinfo import OSInfo
from hvfleet.guests.request import HostGroup
from hvfleet.guests.scope import Scope


@dataclass(frozen=True)
class Topology:
    sockets: int
    cores: int
    threads: int = 1


def max_sockets(os: OSInfo, scope: Scope) -> tuple[int | None, str]:
    policy = scope.policy
    if os.is_windows and not any(s in policy.windows_server_os for s in os.lineage):
        return policy.windows_client_max_sockets, (
            f"{os.short_id} is a Windows client edition: at most "
            f"{policy.windows_client_max_sockets} sockets")
    return None, f"{os.short_id}: no socket limit known"


def decide_topology(os: OSInfo, group: HostGroup, vcpus: int, scope: Scope) -> Decision[
        Topology | None]:
    policy = scope.policy
    if policy.cpu_topology == "libvirt-default":
        return Decision("topology", None, f"libvirt default ({vcpus} sockets)",
                        f"policy {policy.version} writes no <topology>")
    limit, why_limit = max_sockets(os, scope)
    evidence = [why_limit]
    host_cores: int | None = None
    if scope.hardware:
        known = [(n, c.cpu_topology) for n, c in group.hosts if c.cpu_topology is not None]
        if len(known) == len(group.hosts) and known:
            name, smallest = min(known, key=lambda nt: nt[1].cores)
            host_cores = smallest.cores
            evidence.append(f"smallest host socket: {host_cores} cores ({name})")
        else:
            evidence.append("some host's topology is unknown: guest sockets not fitted to hosts")
    else:
        evidence.append(f"mode {scope.mode}: the hosts' topology is hardware, left out")
    divisors = [s for s in range(1, vcpus + 1) if vcpus % s == 0 and (limit is None or s <= limit)]
    fitting = [s for s in divisors if host_cores is None or vcpus // s <= host_cores]
    # Fewest sockets that fit a host socket; if none fits, as many as the OS allows.
    sockets = min(fitting) if fitting else max(divisors)
    topo = Topology(sockets, vcpus // sockets)
    return Decision(
        "topology", topo, f"{topo.sockets} sockets × {topo.cores} cores × 1 thread",
        "as few sockets as keep each within a host socket, within the OS's socket limit",
        tuple(evidence),
    )
