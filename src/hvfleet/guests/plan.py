"""The guest `Plan`: every decision of one generated guest, with its reason
and evidence, from which the domain XML (`hvfleet.guests.render`), the
explanation (`hvfleet.guests.explain`) and the ABI record (`hvfleet.guests.abi`)
are all made. `generate.plan_guest` builds it; it lives apart so rendering
and generating do not import each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hvfleet.guests.clock import Clock
from hvfleet.guests.cpu import GuestCPU
from hvfleet.guests.decision import Decision
from hvfleet.guests.disks import Disk
from hvfleet.guests.firmware import TPM, Firmware
from hvfleet.guests.hyperv import HyperV
from hvfleet.guests.osinfo import OSInfo
from hvfleet.guests.policy import Policy
from hvfleet.guests.request import GuestRequest
from hvfleet.guests.topology import Topology


@dataclass(frozen=True)
class Plan:
    request: GuestRequest
    policy: Policy
    os: OSInfo
    digest: str
    data_versions: dict[str, str]
    domain_type: Decision[str]
    machine: Decision[str]
    cpu: Decision[GuestCPU]
    topology: Decision[Topology | None]
    firmware: Decision[Firmware]
    tpm: Decision[TPM | None]
    hyperv: Decision[HyperV | None]
    clock: Decision[Clock]
    disk_bus: Decision[str]
    disks: Decision[tuple[Disk, ...]]
    nic: Decision[str]
    usb: Decision[str]
    video: Decision[str]
    balloon: Decision[bool]
    rng: Decision[bool]
    panic: Decision[str | None]
    vmcoreinfo: Decision[bool]
    graphics: Decision[str]
    lifecycle: Decision[tuple[str, str, str]]
    notes: tuple[str, ...]
    # What an operator must see even without --explain: the data sets differ
    # from those the policy was released with, so its output may differ too.
    warnings: tuple[str, ...] = ()

    def decisions(self) -> list[Decision[Any]]:
        return [
            self.domain_type, self.machine, self.cpu, self.topology, self.firmware, self.tpm,
            self.hyperv, self.clock, self.disk_bus, self.disks, self.nic, self.usb, self.video,
            self.balloon, self.rng, self.panic, self.vmcoreinfo, self.graphics, self.lifecycle,
        ]
