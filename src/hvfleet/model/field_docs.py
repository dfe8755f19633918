"""What every field of every kind means, as `kubectl explain` shows it.

The CRDs (`hvfleet.model.crd`) and with them the API's OpenAPI documents take
their `description`s from here, by the field's JSON path (`spec.overcommit`;
`[]` for the items of a list). A test walks every kind's schema and fails on
a field without one, so a new field cannot arrive undocumented.
"""

from __future__ import annotations

from typing import Any

_QUANTITIES = ("A map of resource name (cpu, memory, hugepages-1Gi, VGPU, ...) to a quantity "
               "(Kubernetes notation: 16, 64Gi, 500m).")

_COMMON: dict[str, str] = {
    "apiVersion": "APIVersion defines the versioned schema of this representation of an object: "
                  "hvfleet.io/v1.",
    "kind": "Kind is the REST resource this object represents, in CamelCase.",
    "metadata": "Standard object's metadata: name, labels, annotations, resourceVersion, "
                "finalizers, ownerReferences.",
    "spec": "What is wanted of the object, written by operators and schedulers.",
    "status": "What was observed, written only by the object's status writer.",
}

_CPU = {
    "vendor": "CPU vendor as libvirt names it (Intel, AMD).",
    "model": "CPU model name as libvirt names it (e.g. Skylake-Server-IBRS).",
    "features": "CPU features present beyond the model's own.",
    "disabledFeatures": "Features of the model this host does not have.",
    "source": "Where the CPU description came from (domcapabilities host-model or capabilities).",
}

_CAPS: dict[str, str] = {
    "": "The host's libvirt capabilities, as the node agent discovered them (what a guest "
        "generated for this host may use).",
    "arch": "Host architecture (x86_64, aarch64).",
    "cpu": "The host CPU as a guest sees it (host-model).",
    **{f"cpu.{k}": v for k, v in _CPU.items()},
    "capabilitiesCpu": "The host CPU as libvirt's capabilities document describes it.",
    **{f"capabilitiesCpu.{k}": v for k, v in _CPU.items()},
    "cpuModels": "CPU models the hypervisor can emulate on this host, and whether usable.",
    "cpuModels[].name": "CPU model name.",
    "cpuModels[].usable": "Whether a guest can use this model on this host.",
    "cpuModels[].vendor": "CPU model vendor.",
    "cpuModels[].blockers": "Features that stop the model from being usable here.",
    "machineTypes": "Machine types the emulator offers.",
    "machineTypes[].name": "Machine type name (e.g. pc-q35-7.2).",
    "machineTypes[].canonical": "The versioned machine type an alias stands for.",
    "machineTypes[].maxCpus": "Most vCPUs a guest of this machine type may have.",
    "machineTypes[].deprecated": "Whether the emulator deprecates this machine type.",
    "domainTypes": "Domain types libvirt supports on this host (kvm, qemu).",
    "domcapabilitiesDomainType": "The domain type the domain capabilities were read for.",
    "maxVcpus": "Most vCPUs one guest may have on this host.",
    "libvirtVersion": "libvirt version on the host.",
    "hypervisorVersion": "Hypervisor (QEMU) version on the host.",
    "emulator": "Path of the emulator binary.",
    "domcapabilitiesAvailable": "Whether libvirt's domain capabilities could be read.",
    "firmware": "Guest firmware the host offers.",
    "firmware.efi": "Whether UEFI firmware is available.",
    "firmware.secureBoot": "Whether Secure Boot capable firmware is available.",
    "firmware.loaders": "Paths of the firmware loaders.",
    "hypervFeatures": "Hyper-V enlightenments the host supports.",
    "tpmModels": "TPM device models available to guests.",
    "tpmBackends": "TPM backends available to guests.",
    "tpmVersions": "TPM versions available to guests.",
    "videoModels": "Video device models available to guests.",
    "diskBuses": "Disk buses available to guests.",
    "graphicsTypes": "Graphics (console) types available to guests.",
    "rngModels": "Random number generator device models available to guests.",
    "panicModels": "Panic notifier device models available to guests.",
    "vmcoreinfo": "Whether the vmcoreinfo feature is available.",
    "sev": "Whether AMD SEV guests can run here.",
    "sgx": "Whether Intel SGX is available to guests.",
    "cpuTopology": "The host's CPU topology.",
    "cpuTopology.sockets": "CPU sockets.",
    "cpuTopology.dies": "Dies per socket.",
    "cpuTopology.cores": "Cores per die.",
    "cpuTopology.threads": "Threads per core.",
    "dumpLocation": "Where guest crash dumps are written on the host.",
    "notes": "What the agent could not discover, and why.",
}

_CONDITION = {
    "": "Conditions of the host; Ready says whether its agent reports it healthy.",
    "[].type": "Condition type (Ready, ...).",
    "[].status": "True, False or Unknown.",
    "[].reason": "One CamelCase word for the condition's last transition.",
    "[].message": "A human-readable message about the transition.",
    "[].lastTransitionTime": "When the status last changed.",
    "[].observedGeneration": "The metadata.generation the condition was set for.",
}

FIELD_DOCS: dict[str, dict[str, str]] = {
    "Hypervisor": {
        **_COMMON,
        "spec": "What operators and schedulers want of the host: overcommit ratios, reserve, "
                "capacity libvirt cannot see, maintenance.",
        "spec.overcommit": "Overcommit ratio per resource (e.g. cpu: 4): effectiveCapacity = "
                           "floor((capacity + extraCapacity - reserved) x ratio). 1.0 where none is "
                           "given here or by a matching OvercommitPolicy. A single request may "
                           "still not exceed the host's capacity after its reserve.",
        "spec.reserved": "Capacity kept for the host itself, never handed out. " + _QUANTITIES,
        "spec.extraCapacity": "Capacity libvirt cannot see (VGPUs, NIC VFs), added to what the "
                              "agent discovers. " + _QUANTITIES,
        "spec.maintenance": "\"\" (in service), \"manual\" (no new guests) or \"drain\" (no new "
                            "guests; move the running ones away).",
        "spec.maintenanceReason": "Why the host is in maintenance, for people.",
        "status": "What the host's node agent observed; written only by agent/<name>.",
        "status.capacity": "What the host physically has. " + _QUANTITIES,
        "status.allocation": "What its guests use. " + _QUANTITIES,
        "status.countMode": ("Which guests status.allocation counts (the agent's count option): defined "
                             "(every defined one) or running (shut-off and crashed ones left out). "
                             "Absent: only active guests are known to be counted."),
        "status.effectiveCapacity": "What may be handed out under the overcommit ratios, as the "
                                    "agent last computed it. " + _QUANTITIES,
        "status.cells": "NUMA cells of the host.",
        "status.cells[].id": "NUMA cell id.",
        "status.cells[].capacity": "What the cell physically has.",
        "status.cells[].allocation": "What guests use of the cell.",
        "status.cells[].effectiveCapacity": "What may be handed out of the cell.",
        "status.instances": "The guests libvirt has defined on the host.",
        "status.instances[].uuid": "The guest's libvirt UUID.",
        "status.instances[].name": "The guest's libvirt name.",
        "status.instances[].state": "The guest's state (running, shutoff, paused, crashed, ...).",
        "status.instances[].resources": "What the guest uses. " + _QUANTITIES,
        "status.instances[].crashCount": "How often the guest crashed since the agent started.",
        "status.instances[].lastCrashTime": "When the guest last crashed.",
        "status.instances[].lastCrashReason": "How it last crashed (panicked, crashloaded).",
        **{f"status.hostCapabilities{'.' + k if k else ''}": v for k, v in _CAPS.items()},
        **{f"status.conditions{k}": v for k, v in _CONDITION.items()},
        "status.observedGeneration": "The metadata.generation the agent last applied.",
        "status.lastHeartbeatTime": "When the agent last reported; a stale one makes the host "
                                    "not Ready.",
    },
    "Reservation": {
        **_COMMON,
        "spec": "The space a scheduler claims on one host before the guest exists.",
        "spec.hypervisor": "Name of the Hypervisor the space is claimed on.",
        "spec.resources": "The space claimed. " + _QUANTITIES,
        "spec.consumer": "Who the space is for (an instance UUID, a Placement consumer).",
        "spec.expiresAt": "When an unreleased claim stops holding space.",
        "spec.source": "\"hvfleet\", or \"placement\" for a Placement allocation.",
        "status": "Where the claim stands.",
        "status.phase": "Pending, Bound (the guest appeared on the host) or Released.",
        "status.message": "Why the phase is what it is, for people.",
    },
    "Lease": {
        **_COMMON,
        "spec": "The node agent's liveness record for its host, named after it.",
        "spec.holderIdentity": "The agent holding the lease (agent/<hypervisor>).",
        "spec.leaseDurationSeconds": "How long a renewal counts; the agent is live until "
                                     "renewTime plus this.",
        "spec.acquireTime": "When the current holder acquired the lease.",
        "spec.renewTime": "When the holder last renewed the lease.",
        "spec.leaseTransitions": "How often the lease changed holders.",
    },
    "OvercommitPolicy": {
        **_COMMON,
        "spec": "Overcommit ratios for every hypervisor the selector matches.",
        "spec.selector": "Which hypervisors the policy applies to, by their labels.",
        "spec.selector.matchLabels": "Labels a hypervisor must all have, with these values.",
        "spec.selector.matchExpressions": "Label requirements a hypervisor must all meet.",
        "spec.selector.matchExpressions[].key": "The label key.",
        "spec.selector.matchExpressions[].operator": "In, NotIn, Exists or DoesNotExist.",
        "spec.selector.matchExpressions[].values": "Values for In and NotIn.",
        "spec.overcommit": "Ratio per resource for the matching hosts, where a host's own "
                           "spec.overcommit says nothing about that resource.",
        "spec.priority": "Where two matching policies give a ratio for the same resource, the "
                         "higher priority wins (at equal priority, the name that sorts first).",
        "status": "Which hypervisors the policy applies to now.",
    },
}

OBJECT_META_DOCS: dict[str, str] = {
    "name": "Name of the object, unique within its kind (RFC 1123 subdomain).",
    "generateName": "Prefix of a name the server generates (five random characters after it) "
                    "when no name is given.",
    "uid": "Unique id of this object, different for every object ever created under a name.",
    "resourceVersion": "Opaque version of this object; a write naming an old one is a Conflict.",
    "generation": "Sequence number of a change of the desired state (spec).",
    "labels": "Key/value pairs that selectors (kubectl -l, OvercommitPolicy) match.",
    "annotations": "Key/value pairs for tools; not used to select objects.",
    "creationTimestamp": "When the object was created.",
    "deletionTimestamp": "When a deletion was asked for; the object stays until its finalizers "
                         "are removed.",
    "deletionGracePeriodSeconds": "Seconds allowed for a graceful deletion (0 here).",
    "finalizers": "Names that must each be removed before a deleted object goes away; none "
                  "can be added once it is being deleted.",
    "ownerReferences": "Objects this one belongs to: when all of them are gone, it is deleted.",
    "ownerReferences[].apiVersion": "API version of the owner.",
    "ownerReferences[].kind": "Kind of the owner.",
    "ownerReferences[].name": "Name of the owner.",
    "ownerReferences[].uid": "UID of the owner.",
    "ownerReferences[].controller": "Whether the owner is the managing controller (at most one).",
    "ownerReferences[].blockOwnerDeletion": "Accepted for compatibility; deletion of dependents "
                                            "here is always in the background.",
    "managedFields": "Which manager owns which fields (server-side apply).",
    "managedFields[].manager": "The field manager.",
    "managedFields[].operation": "Apply or Update.",
    "managedFields[].subresource": "The subresource written (status), if any.",
    "managedFields[].apiVersion": "API version the fields were set in.",
    "managedFields[].time": "When the manager last changed them.",
    "managedFields[].fieldsType": "FieldsV1.",
    "managedFields[].fieldsV1": "The fields owned, in FieldsV1 form.",
}


def _subschemas(node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for key, sub in (node.get("properties") or {}).items():
        if isinstance(sub, dict):
            p = f"{path}.{key}" if path else key
            out.append((p, sub))
            out.extend(_subschemas(sub, p))
    items = node.get("items")
    if isinstance(items, dict):
        out.extend(_subschemas(items, f"{path}[]"))
    return out


def fields(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every (JSON path, schema node) of a structural schema, depth first."""
    return _subschemas(schema, "")


def describe(schema: dict[str, Any], docs: dict[str, str]) -> dict[str, Any]:
    """`schema` with each field's description from `docs` (in place; returned)."""
    for path, node in fields(schema):
        text = docs.get(path)
        if text:
            node["description"] = text
    return schema
