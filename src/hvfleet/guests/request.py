"""What an operator asks for: the guest request, disk and NIC specs, the host group.

A disk SPEC names its source and kind because cache and I/O mode depend on
it (`kind=qcow2,source=/images/a.qcow2`, `kind=raw-preallocated,...`,
`kind=block,source=/dev/vg/a`, `kind=network,protocol=rbd,source=pool/img,
host=mon1:6789`). A NIC SPEC names a libvirt network or a bridge
(`network=default`, `bridge=br0`, optional `mac=`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hvfleet.guests.policy import KNOWN_DRIVERS
from hvfleet.model.bounds import CONTROL_CHARACTERS
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import HostCapabilities
from hvfleet.model.quantity import Quantity

DISK_KINDS = ("qcow2", "raw", "raw-preallocated", "block", "network")
NET_PROTOCOLS = ("rbd", "iscsi", "nbd", "gluster", "http", "https")
_MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _pairs(spec: str, field: str, allowed: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in spec.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not value.strip():
            raise InvalidInput(f"{spec!r}: {part!r} is not key=value", field=field)
        if key not in allowed:
            raise InvalidInput(f"{spec!r}: unknown key {key!r} (known: {', '.join(allowed)})", field=field)
        if key in out:
            raise InvalidInput(f"{spec!r}: {key!r} given twice", field=field)
        if CONTROL_CHARACTERS.search(value):
            # XML cannot carry most of them, and libvirt would take none.
            raise InvalidInput(f"{spec!r}: {key}= has a control character", field=field)
        out[key] = value.strip()
    return out


# A network disk's host: a name or IPv4 address, or an IPv6 one in brackets;
# then maybe a port (libvirt's <host name= port=>, the port 1-65535).
_HOST_RE = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9._-]+))(?::(?P<port>[0-9]{1,5}))?$")


def host_and_port(text: str) -> tuple[str, str]:
    """A network disk's `host=` as libvirt's <host name= port=> (an IPv6
    address without its brackets; "" for no port); InvalidInput for what
    libvirt would refuse."""
    m = _HOST_RE.match(text)
    if m is None:
        raise InvalidInput(f"host {text!r} is not NAME[:PORT] or [IPV6][:PORT]", field="disks")
    port = m["port"] or ""
    if port and not 1 <= int(port) <= 65535:
        raise InvalidInput(f"host {text!r}: port {port} is not 1-65535", field="disks")
    return m["v6"] or m["name"], port


# What the kernel takes as an interface name (dev_valid_name: IFNAMSIZ - 1).
_LINUX_IFNAME = re.compile(r"^[^/:\s]{1,15}$")


@dataclass(frozen=True)
class DiskSpec:
    kind: str
    source: str
    protocol: str = ""
    host: str = ""

    @classmethod
    def parse(cls, spec: str) -> DiskSpec:
        kv = _pairs(spec, "disks", ("kind", "source", "protocol", "host"))
        kind, source = kv.get("kind", ""), kv.get("source", "")
        if kind not in DISK_KINDS:
            raise InvalidInput(f"{spec!r}: kind must be one of {', '.join(DISK_KINDS)}", field="disks")
        if not source:
            raise InvalidInput(f"{spec!r}: source= is required", field="disks")
        if kind == "network":
            if kv.get("protocol") not in NET_PROTOCOLS:
                raise InvalidInput(
                    f"{spec!r}: network disks need protocol= one of {', '.join(NET_PROTOCOLS)}", field="disks"
                )
        elif "protocol" in kv or "host" in kv:
            raise InvalidInput(f"{spec!r}: protocol/host only apply to kind=network", field="disks")
        elif not source.startswith("/"):
            raise InvalidInput(f"{spec!r}: source must be an absolute path", field="disks")
        if "host" in kv:
            try:
                host_and_port(kv["host"])
            except InvalidInput as exc:
                raise InvalidInput(f"{spec!r}: {exc.detail}", field="disks") from None
        return cls(kind, source, kv.get("protocol", ""), kv.get("host", ""))


@dataclass(frozen=True)
class NicSpec:
    network: str = ""
    bridge: str = ""
    mac: str = ""

    @classmethod
    def parse(cls, spec: str) -> NicSpec:
        kv = _pairs(spec, "nics", ("network", "bridge", "mac"))
        if ("network" in kv) == ("bridge" in kv):
            raise InvalidInput(f"{spec!r}: give exactly one of network= or bridge=", field="nics")
        mac = kv.get("mac", "").lower()
        if mac and not _MAC_RE.match(mac):
            raise InvalidInput(f"{spec!r}: mac {mac!r} is not aa:bb:cc:dd:ee:ff", field="nics")
        if mac and int(mac[:2], 16) & 1:
            raise InvalidInput(f"{spec!r}: mac {mac!r} is a multicast address; a NIC's is unicast "
                               "(the first octet even)", field="nics")
        bridge, network = kv.get("bridge", ""), kv.get("network", "")
        if "bridge" in kv and (not _LINUX_IFNAME.match(bridge) or bridge in (".", "..")):
            # A domain naming another defines, and then never starts.
            raise InvalidInput(f"{spec!r}: bridge {bridge[:40]!r} is no Linux interface name (1 to 15 "
                               "characters, none of them '/', ':' or a space)", field="nics")
        if "network" in kv and (not network or "/" in network):
            raise InvalidInput(f"{spec!r}: a libvirt network's name is not empty and has no '/'",
                               field="nics")
        return cls(network, bridge, mac)


# The most NICs a guest is generated with: each takes a PCI(e) slot of its
# own, and past ~220 (with the other devices) QEMU's machine has none left
# ("a PCI slot is needed ... none is available").
MAX_NICS = 200

# The most memory libvirt defines a domain with: its memory element in KiB
# up to 2**53 - 1 (VIR_DOMAIN_MEMORY_PARAM_UNLIMITED); one KiB more is
# "numerical overflow: value too large".
MAX_MEMORY = (2**53 - 1) * 1024


@dataclass(frozen=True)
class GuestRequest:
    os: str
    name: str
    vcpus: int
    memory: int  # bytes
    disks: tuple[DiskSpec, ...] = ()
    nics: tuple[NicSpec, ...] = ()
    firmware: str = "auto"  # auto | bios | efi
    secure_boot: bool = False
    tpm: bool = False
    mode: str = "intersection"
    policy: str = "2026.1"
    # Added after 2026.1; left out of the inputs digest while at their defaults
    # so 2026.1 digests stay as they were.
    drivers: tuple[str, ...] = ()  # extra drivers the installer has, e.g. virtio-win
    uuid: str = ""  # kept from an existing definition (generate --from)

    def __post_init__(self) -> None:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,62}$", self.name):
            raise InvalidInput(f"{self.name!r}: use letters, digits, '_', '.', '+', '-'", field="name")
        if not 1 <= self.vcpus <= 4096:
            raise InvalidInput(f"{self.vcpus}: must be between 1 and 4096", field="vcpus")
        if self.memory < 16 * 1024 * 1024:
            raise InvalidInput(f"{self.memory} bytes: at least 16Mi is needed", field="memory")
        if self.memory % 1024:
            raise InvalidInput("must be a whole number of KiB", field="memory")
        if self.memory > MAX_MEMORY:
            raise InvalidInput(f"{self.memory} bytes: libvirt takes a domain's memory up to "
                               f"{MAX_MEMORY} bytes ((2**53 - 1) KiB, just under 8Ei)", field="memory")
        if len(self.nics) > MAX_NICS:
            raise InvalidInput(f"at most {MAX_NICS} NICs, got {len(self.nics)}", field="nics")
        if self.firmware not in ("auto", "bios", "efi"):
            raise InvalidInput(f"{self.firmware!r}: must be auto, bios or efi", field="firmware")
        if self.secure_boot and self.firmware == "bios":
            raise InvalidInput("needs EFI firmware, not firmware bios", field="secure_boot")
        for d in self.drivers:
            if d not in KNOWN_DRIVERS:
                raise InvalidInput(
                    f"{d!r} is not a known driver set (known: {', '.join(KNOWN_DRIVERS)})",
                    field="drivers",
                )
        if self.uuid and not _UUID_RE.match(self.uuid):
            raise InvalidInput(f"{self.uuid!r} is not a UUID", field="uuid")


def parse_memory(text: str) -> int:
    q = Quantity.parse(text, where="memory")
    if not q.is_integer() or q.floor() <= 0:
        raise InvalidInput(f"{text!r}: must be a positive whole number of bytes", field="memory")
    return q.floor()


@dataclass(frozen=True)
class HostGroup:
    hosts: tuple[tuple[str, HostCapabilities], ...]
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.hosts:
            raise InvalidInput("no hosts: the host group is empty")

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.hosts]
