"""`generate()`: a short pipeline of named decisions, then rendering.

Each step is a pure function of the request, the OS, the host group, the
policy and earlier decisions; the plan holds every decision with its reason
and evidence so `--explain` and the XML come from the same place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from hvfleet.guests.clock import Clock, decide_clock
from hvfleet.guests.cpu import GuestCPU, decide_cpu
from hvfleet.guests.decision import Decision
from hvfleet.guests.devices import (
    decide_balloon,
    decide_graphics,
    decide_nic,
    decide_panic,
    decide_rng,
    decide_usb,
    decide_video,
    decide_vmcoreinfo,
)
from hvfleet.guests.disks import Disk, decide_disk_bus, decide_disks
from hvfleet.guests.firmware import TPM, Firmware, decide_firmware, decide_tpm
from hvfleet.guests.hyperv import HyperV, decide_hyperv
from hvfleet.guests.machine import decide_domain_type, decide_machine
from hvfleet.guests.osinfo import OSInfo, os_info
from hvfleet.guests.policy import Policy, get_policy
from hvfleet.guests.request import GuestRequest, HostGroup


@dataclass(frozen=True)
class Plan:
    request: GuestRequest
    policy: Policy
    os: OSInfo
    digest: str
    domain_type: Decision[str]
    machine: Decision[str]
    cpu: Decision[GuestCPU]
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
    notes: tuple[str, ...]

    def decisions(self) -> list[Decision[Any]]:
        return [
            self.domain_type, self.machine, self.cpu, self.firmware, self.tpm, self.hyperv,
            self.clock, self.disk_bus, self.disks, self.nic, self.usb, self.video,
            self.balloon, self.rng, self.panic, self.vmcoreinfo, self.graphics,
        ]


def inputs_digest(req: GuestRequest, group: HostGroup) -> str:
    """sha256 over the request and every host's capabilities, order-independent."""
    doc = {
        "request": dataclasses.asdict(req),
        "hosts": sorted([name, caps.to_dict()] for name, caps in group.hosts),
    }
    raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def plan_guest(req: GuestRequest, group: HostGroup) -> Plan:
    policy = get_policy(req.policy)
    os = os_info(req.os)
    domain_type = decide_domain_type(group)
    machine = decide_machine(os, group, req.vcpus)
    cpu = decide_cpu(req.mode, group.hosts)
    firmware = decide_firmware(req, os, group)
    tpm = decide_tpm(req, os, group, firmware.value, policy)
    hyperv = decide_hyperv(os, group, domain_type.value, policy)
    hv = frozenset(hyperv.value.features if hyperv.value else ())
    clock = decide_clock(os, hv)
    disk_bus = decide_disk_bus(os, group, machine.value)
    notes = [f"{name}: {n}" for name, caps in group.hosts for n in caps.notes]
    if os.min_ram and req.memory < os.min_ram:
        notes.append(f"osinfo: {os.short_id} wants at least {os.min_ram} bytes of RAM")
    return Plan(
        request=req,
        policy=policy,
        os=os,
        digest=inputs_digest(req, group),
        domain_type=domain_type,
        machine=machine,
        cpu=cpu,
        firmware=firmware,
        tpm=tpm,
        hyperv=hyperv,
        clock=clock,
        disk_bus=disk_bus,
        disks=decide_disks(req.disks, disk_bus.value),
        nic=decide_nic(os),
        usb=decide_usb(os),
        video=decide_video(os, group),
        balloon=decide_balloon(os, policy),
        rng=decide_rng(os, group, policy),
        panic=decide_panic(os, group, hv, domain_type.value),
        vmcoreinfo=decide_vmcoreinfo(group),
        graphics=decide_graphics(group, policy),
        notes=tuple(notes),
    )


def generate(req: GuestRequest, group: HostGroup) -> tuple[str, Plan]:
    """The domain XML for `req` on `group`, and the plan it came from."""
    from hvfleet.guests.render import render_domain

    plan = plan_guest(req, group)
    return render_domain(plan, sorted(group.names)), plan
