"""Disks: bus, cache and I/O mode per disk kind.

virtio-blk when the OS has the driver in-box (per osinfo) and every host
offers the bus, else SATA (IDE on i440fx). `cache='none'` always: the host page
cache would double-buffer and is unsafe across live migration. `io='native'`
(Linux AIO) for block devices and preallocated raw files, where it is
fastest; `io='threads'` for sparse and qcow2 files, where native AIO can block
on allocating writes; `discard='unmap'` so freed blocks go back to the storage.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvfleet.guests.decision import Decision, hosts_list
from hvfleet.guests.osinfo import OSInfo
from hvfleet.guests.request import DiskSpec, HostGroup
from hvfleet.model.errors import InvalidInput

_IO = {
    "qcow2": ("threads", "qcow2 file: native AIO can block on allocating writes"),
    "raw": ("threads", "sparse raw file: native AIO can block on allocating writes"),
    "raw-preallocated": ("native", "preallocated raw file: native AIO is fastest"),
    "block": ("native", "block device: native AIO is fastest"),
    "network": ("threads", "network disk: served by QEMU's block driver threads"),
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


def decide_disk_bus(os: OSInfo, group: HostGroup, machine: str) -> Decision[str]:
    lacking = [n for n, c in group.hosts if c.disk_buses is not None and "virtio" not in c.disk_buses]
    fallback = "sata" if "q35" in machine else "ide"
    if os.supports("virtio-block") and not lacking:
        return Decision("disk bus", "virtio", "virtio", "virtio-blk driver in-box",
                        (os.device_evidence("virtio-block"),))
    why = (f"virtio not offered on {hosts_list(lacking)}" if lacking
           else f"no in-box virtio-blk driver for {os.short_id}")
    return Decision("disk bus", fallback, fallback, why, (os.device_evidence("virtio-block"),))


def decide_disks(specs: tuple[DiskSpec, ...], bus: str) -> Decision[tuple[Disk, ...]]:
    prefix = {"virtio": "vd", "sata": "sd", "ide": "hd"}[bus]
    if len(specs) > 26:
        raise InvalidInput(f"at most 26 disks, got {len(specs)}", field="disks")
    disks = []
    evidence = []
    for i, s in enumerate(specs):
        io, why = _IO[s.kind]
        fmt = "qcow2" if s.kind == "qcow2" else "raw"
        disks.append(Disk(s, bus, f"{prefix}{chr(ord('a') + i)}", fmt, "none", io, "unmap"))
        evidence.append(f"{s.source} ({s.kind}): io={io}: {why}")
    shown = "; ".join(f"{d.target} {d.format} cache=none io={d.io}" for d in disks) or "none"
    return Decision(
        "disks", tuple(disks), shown,
        "cache=none (no double caching, safe for live migration), I/O mode by disk kind, "
        "discard=unmap",
        tuple(evidence),
    )
