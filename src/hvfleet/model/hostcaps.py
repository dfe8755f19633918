"""What a host can offer a guest, as discovered from libvirt.

Filled by the agent from `virConnectGetCapabilities` and
`virConnectGetDomainCapabilities` (see `hvfleet.discovery.capabilities`);
consumed by the guest-config generator, which must know every host of a group.
A value of `None` means "libvirt did not say" (e.g. the test driver has no
domcapabilities), which is different from "the host lacks it"; `notes` says why
a part is unknown.
"""

from __future__ import annotations

from pydantic import Field

from hvfleet.model.bounds import MAX_LIST, Count
from hvfleet.model.meta import Model


class HostCPU(Model):
    vendor: str = ""
    model: str = ""
    # Features the host adds to `model` (policy require) ...
    features: list[str] = Field(default_factory=list, max_length=MAX_LIST)
    # ... and features of `model` the host lacks (policy disable; only the
    # domcapabilities host-model CPU lists these).
    disabled_features: list[str] = Field(default_factory=list, max_length=MAX_LIST)
    # Where the CPU came from: "domcapabilities host-model" or "capabilities host cpu".
    source: str = ""


class CPUTopology(Model):
    """The host CPU's topology as capabilities `<host><cpu><topology>` states it."""

    sockets: Count = 1
    dies: Count = 1
    cores: Count = 1
    threads: Count = 1


class CPUModelInfo(Model):
    """A named CPU model from domcapabilities' custom mode."""

    name: str
    usable: bool | None = None
    vendor: str = ""
    # The features that keep an unusable model from running on this host
    # (`<blockers model=...>`); None when libvirt did not list them.
    blockers: list[str] | None = Field(default=None, max_length=MAX_LIST)


class MachineType(Model):
    name: str
    # The versioned machine an alias stands for (q35 → pc-q35-7.2); equal to
    # `name` when it is already versioned.
    canonical: str
    max_cpus: Count | None = None
    deprecated: bool = False


class FirmwareInfo(Model):
    efi: bool | None = None
    secure_boot: bool | None = None
    loaders: list[str] = Field(default_factory=list, max_length=MAX_LIST)


class HostCapabilities(Model):
    arch: str = ""
    cpu: HostCPU = Field(default_factory=HostCPU)
    # The host CPU as `virsh capabilities` reports it, kept when `cpu` came
    # from the domcapabilities host-model.
    capabilities_cpu: HostCPU | None = None
    cpu_models: list[CPUModelInfo] | None = Field(default=None, max_length=MAX_LIST)
    machine_types: list[MachineType] = Field(default_factory=list, max_length=MAX_LIST)
    domain_types: list[str] = Field(default_factory=list, max_length=MAX_LIST)
    # The domain type the domcapabilities were taken for (kvm or qemu).
    domcapabilities_domain_type: str = ""
    max_vcpus: Count | None = None
    libvirt_version: str = ""
    hypervisor_version: str = ""
    emulator: str = ""
    domcapabilities_available: bool = False
    firmware: FirmwareInfo = Field(default_factory=FirmwareInfo)
    hyperv_features: list[str] | None = Field(default=None, max_length=MAX_LIST)
    tpm_models: list[str] | None = Field(default=None, max_length=MAX_LIST)
    tpm_backends: list[str] | None = Field(default=None, max_length=MAX_LIST)
    tpm_versions: list[str] | None = Field(default=None, max_length=MAX_LIST)
    video_models: list[str] | None = Field(default=None, max_length=MAX_LIST)
    disk_buses: list[str] | None = Field(default=None, max_length=MAX_LIST)
    graphics_types: list[str] | None = Field(default=None, max_length=MAX_LIST)
    rng_models: list[str] | None = Field(default=None, max_length=MAX_LIST)
    panic_models: list[str] | None = Field(default=None, max_length=MAX_LIST)
    vmcoreinfo: bool | None = None
    sev: bool | None = None
    sgx: bool | None = None
    # Fields added after policy 2026.1 stay None when unknown (and out of the
    # 2026.1 inputs digest).
    cpu_topology: CPUTopology | None = None
    # A directory where libvirt writes guest core dumps on this host (qemu.conf
    # `auto_dump_path`), which the node agent was told about and found to be a
    # writable directory. None: no dump location known, so a crash action that
    # dumps would fill /var/lib/libvirt/qemu/dump or fail.
    dump_location: str | None = None
    notes: list[str] = Field(default_factory=list, max_length=MAX_LIST)


def major_minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version such as `libvirt_version` "9.0.0" or
    `hypervisor_version` "7.2" (minor 0 when absent); None when it does not
    start with numbers (unknown, e.g. ""), so a caller never guesses."""
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None
