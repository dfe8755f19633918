"""Disks: bus, cache and I/O mode per disk kind.

virtio-blk when the OS has the driver in-box (per osinfo), or the request
declares drivers the policy honours (virtio-win), and every host offers the
bus; else SATA (IDE on i440fx). The policy's cache (`none`: the host page
cache would double-buffer and is unsafe across live migration) and discard
(`unmap`, so freed blocks go back to the storage). I/O mode by disk kind:
`native` (Linux AIO) for block devices and preallocated raw files, where it is
fastest; `threads` for sparse and qcow2 files, where native AIO can block on
allocating writes. Policies with `io_uring` use it for file and block disks
where every host's libvirt and QEMU are new enough (network disks are
served by QEMU's own block drivers and keep `threads`).
"""

from __future__ import annotations

from dataclasses import dataclass

from hvfleet.guests.decision import Decision, hosts_list
from hvfleet.guests.devices import os_has
from hvfleet.guests.osinfo import OSInfo
from hvfleet.guests.request import DiskSpec, GuestRequest, HostGroup
from hvfleet.guests.scope import Scope
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import major_minor

_WHY_IO = {
    "qcow2": "qcow2 file: native AIO can block on allocating writes",
    "raw": "sparse raw file: native AIO can block on allocating writes",
    "raw-preallocated": "preallocated raw file: native AIO is fastest",
    "block": "block device: native AIO is fastest",
    "network": "network disk: served by QEMU's block driver threads",
}


@dataclass(frozen=True)
class Disk:
    spec: DiskSpec
    bus: str
    target: str
    format: str
    cache: str
    io: str
    discard: str


def decide_disk_bus(
    os: OSInfo, group: HostGroup, machine: str, req: GuestRequest, scope: Scope
) -> Decision[str]:
    policy = scope.policy
    virtio = policy.disk_bus
    lacking = [n for n, c in group.hosts if c.disk_buses is not None and virtio not in c.disk_buses]
    fallback = policy.disk_bus_fallback_q35 if "q35" in machine else policy.disk_bus_fallback_i440fx
    has, evidence = os_has(os, "virtio-block", req, policy)
    if has and not scope.software:
        scope.refuse_lacking("disk bus", virtio, lacking)
        lacking = []
    if has and not lacking:
        return Decision("disk bus", virtio, virtio, "virtio-blk driver "
                        + ("in-box" if os.supports("virtio-block") else "declared"), (evidence,))
    if not has and not scope.software:
        scope.refuse_lacking(
            "disk bus", fallback,
            [n for n, c in group.hosts if c.disk_buses is not None and fallback not in c.disk_buses],
        )
    why = (f"virtio not offered on {hosts_list(lacking)}" if has
           else f"no in-box virtio-blk driver for {os.short_id}")
    return Decision("disk bus", fallback, fallback, why, (evidence,))


def io_uring_offered(group: HostGroup, scope: Scope) -> tuple[bool, str]:
    """Does every host's libvirt and QEMU offer io='io_uring'? (and why)"""
    policy = scope.policy
    if not policy.io_uring:
        return False, f"policy {policy.version} does not use io_uring"
    if not scope.software:
        return False, f"mode none: io_uring is newer than the policy floor ({scope.floor})"
    too_old: list[str] = []
    unknown: list[str] = []
    for name, caps in group.hosts:
        lv, qv = major_minor(caps.libvirt_version), major_minor(caps.hypervisor_version)
        if lv is None or qv is None:
            unknown.append(name)
        elif lv < policy.io_uring_min_libvirt or qv < policy.io_uring_min_qemu:
            too_old.append(name)
    need = (f"libvirt ≥ {'.'.join(map(str, policy.io_uring_min_libvirt))} and QEMU ≥ "
            f"{'.'.join(map(str, policy.io_uring_min_qemu))}")
    if too_old:
        return False, f"no io_uring: {need} not met on {hosts_list(too_old)}"
    if unknown:
        return False, f"no io_uring: libvirt or QEMU version unknown on {hosts_list(unknown)}"
    return True, f"io_uring: every host has {need}"


def decide_disks(
    specs: tuple[DiskSpec, ...], bus: str, group: HostGroup, scope: Scope
) -> Decision[tuple[Disk, ...]]:
    policy = scope.policy
    prefix = {"virtio": "vd", "sata": "sd", "ide": "hd", "scsi": "sd"}[bus]
    most = 4 if bus == "ide" else 26  # one IDE controller: two buses of two units
    if len(specs) > most:
        raise InvalidInput(f"at most {most} disks on the {bus} bus, got {len(specs)}", field="disks")
    uring, uring_why = io_uring_offered(group, scope) if specs else (False, "")
    disks = []
    evidence = []
    for i, s in enumerate(specs):
        io, why = policy.io_mode(s.kind), _WHY_IO[s.kind]
        if uring and s.kind != "network":
            io, why = "io_uring", "io_uring: fewer syscalls than native AIO, never blocks"
        fmt = "qcow2" if s.kind == "qcow2" else "raw"
        disks.append(Disk(s, bus, f"{prefix}{chr(ord('a') + i)}", fmt, policy.disk_cache, io,
                          policy.disk_discard))
        evidence.append(f"{s.source} ({s.kind}): io={io}: {why}")
    if policy.io_uring and specs:
        evidence.append(uring_why)
    shown = "; ".join(f"{d.target} {d.format} cache={d.cache} io={d.io}" for d in disks) or "none"
    return Decision(
        "disks", tuple(disks), shown,
        f"cache={policy.disk_cache} (no double caching, safe for live migration), I/O mode by "
        f"disk kind, discard={policy.disk_discard}",
        tuple(evidence),
    )
