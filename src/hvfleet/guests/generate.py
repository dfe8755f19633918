"""`generate()`: a short pipeline of named decisions, then rendering.

Each step is a pure function of the request, the OS, the host group, the
policy (and the mode's scope) and earlier decisions; the plan holds every
decision with its reason and evidence so `--explain` and the XML come from
the same place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from hvfleet.guests.clock import decide_clock
from hvfleet.guests.cpu import decide_cpu, floor_cpu
from hvfleet.guests.cpumap import load_cpu_map
from hvfleet.guests.datasets import DEFAULT_DATA, DataSources, changed_versions
from hvfleet.guests.devices import (
    decide_balloon,
    decide_graphics,
    decide_lifecycle,
    decide_nic,
    decide_panic,
    decide_rng,
    decide_usb,
    decide_video,
    decide_vmcoreinfo,
)
from hvfleet.guests.disks import decide_disk_bus, decide_disks
from hvfleet.guests.firmware import decide_firmware, decide_tpm
from hvfleet.guests.hyperv import decide_hyperv
from hvfleet.guests.machine import decide_domain_type, decide_machine
from hvfleet.guests.osinfo import load_os_database
from hvfleet.guests.plan import Plan
from hvfleet.guests.policy import Policy, get_policy
from hvfleet.guests.render import render_domain
from hvfleet.guests.request import GuestRequest, HostGroup
from hvfleet.guests.scope import Scope
from hvfleet.guests.topology import decide_topology

# Request fields and host facts added after policy 2026.1: a 2026.1 digest
# leaves them out (while at their defaults), so 2026.1 digests stay as they were.
_LATER_REQUEST_FIELDS = ("drivers", "uuid")
_LATER_HOST_FIELDS = ("cpuTopology", "dumpLocation")


def inputs_digest(
    req: GuestRequest, group: HostGroup, policy: Policy, versions: dict[str, str]
) -> str:
    """sha256 over the request and every host's capabilities, order-independent;
    with the data sets' versions for policies that record them."""
    request = dataclasses.asdict(req)
    hosts = []
    for name, caps in group.hosts:
        d = caps.to_dict()
        if not policy.record_data_versions:
            for key in _LATER_HOST_FIELDS:
                d.pop(key, None)
        hosts.append([name, d])
    if not policy.record_data_versions:
        defaults = {f.name: f.default for f in dataclasses.fields(GuestRequest)}
        for key in _LATER_REQUEST_FIELDS:
            if request[key] == defaults[key]:
                request.pop(key)
    doc: dict[str, Any] = {"request": request, "hosts": sorted(hosts)}
    if policy.record_data_versions:
        doc["data"] = versions
    raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def plan_guest(req: GuestRequest, group: HostGroup, data: DataSources = DEFAULT_DATA) -> Plan:
    policy = get_policy(req.policy)
    scope = Scope(req.mode, policy)
    os = load_os_database(data.osinfo_dir).get(req.os)
    versions = data.versions()
    cmap = load_cpu_map(data.cpu_map_dir)
    domain_type = decide_domain_type(group)
    machine = decide_machine(os, group, req.vcpus, scope)
    cpu = (decide_cpu(req.mode, group.hosts, cmap) if scope.software
           else floor_cpu(group.hosts, policy.floor_cpu_model, policy.floor_cpu_require,
                     policy.version, cmap))
    firmware = decide_firmware(req, os, group)
    tpm = decide_tpm(req, os, group, firmware.value, policy)
    hyperv = decide_hyperv(os, group, domain_type.value, scope)
    hv = frozenset(hyperv.value.features if hyperv.value else ())
    clock = decide_clock(os, hv, policy)
    disk_bus = decide_disk_bus(os, group, machine.value, req, scope)
    notes = [f"{name}: {n}" for name, caps in group.hosts for n in caps.notes]
    if os.min_ram and req.memory < os.min_ram:
        notes.append(f"osinfo: {os.short_id} wants at least {os.min_ram} bytes of RAM")
    if req.drivers and not set(req.drivers) & set(policy.honoured_drivers):
        notes.append(f"policy {policy.version} does not use declared drivers "
                     f"({', '.join(req.drivers)}); a later policy does")
    changed = changed_versions(dict(policy.data_versions), versions)
    warnings = []
    if changed:
        warnings.append(
            f"data sets differ from those policy {policy.version} was released with "
            f"({'; '.join(changed)}): decisions that read them may differ from the released "
            "policy's; regenerating an existing guest from its definition keeps its ABI"
        )
    return Plan(
        request=req,
        policy=policy,
        os=os,
        digest=inputs_digest(req, group, policy, versions),
        data_versions=versions,
        domain_type=domain_type,
        machine=machine,
        cpu=cpu,
        topology=decide_topology(os, group, req.vcpus, scope),
        firmware=firmware,
        tpm=tpm,
        hyperv=hyperv,
        clock=clock,
        disk_bus=disk_bus,
        disks=decide_disks(req.disks, disk_bus.value, group, scope),
        nic=decide_nic(os, req, policy),
        usb=decide_usb(os, policy),
        video=decide_video(os, group, scope),
        balloon=decide_balloon(os, req, policy),
        rng=decide_rng(os, group, req, scope),
        panic=decide_panic(os, group, hv, domain_type.value, scope),
        vmcoreinfo=decide_vmcoreinfo(group, scope),
        graphics=decide_graphics(group, policy),
        lifecycle=decide_lifecycle(group, scope),
        notes=tuple(notes),
        warnings=tuple(warnings),
    )


def generate(
    req: GuestRequest, group: HostGroup, data: DataSources = DEFAULT_DATA
) -> tuple[str, Plan]:
    """The domain XML for `req` on `group`, and the plan it came from."""
    plan = plan_guest(req, group, data)
    return render_domain(plan, sorted(group.names)), plan
