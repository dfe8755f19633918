"""Policy versions: the frozen parameters behind every default.

A released policy never changes (golden files under tests/guests/golden/<V>/
prove it); new behaviour gets a new version, like a pinned machine type. The
decision modules read every knob from the `Policy` they are given, never from
module constants, so an old version keeps producing the same XML. Each
version carries the list of what it changed relative to the one before; that
list is the changelog `hvfleet guest policies` prints and docs/guests.md
repeats.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hvfleet.model.errors import InvalidInput

# Drivers a request may declare as available to the guest's installer.
KNOWN_DRIVERS = ("virtio-win",)


@dataclass(frozen=True)
class Policy:
    version: str
    changelog: str  # one line
    changes: tuple[str, ...] = ()  # what differs from the version before, one line each

    # modes: "cpu" applies --mode software/none to the CPU only (2026.1);
    # "all" to every host-dependent decision (the seed's options b and c).
    mode_scope: str = "cpu"
    # mode none decides as if every host were this QEMU version (and checks
    # that every host of the group offers what that implies).
    floor_qemu: tuple[int, int] = (4, 2)
    # mode none's CPU model (runs on Intel and AMD hosts alike), plus the
    # features QEMU always shows a guest (check='full' refuses a CPU without them).
    floor_cpu_model: str = "kvm64"
    floor_cpu_require: tuple[str, ...] = ("hypervisor",)

    # machine: the chipset when osinfo lists it for the OS, else the fallback
    chipset: str = "q35"
    chipset_fallback: str = "i440fx"

    # cpu: check attribute of <cpu>; topology rule "libvirt-default" writes no
    # <topology> (libvirt then makes one socket per vCPU), "os-and-hosts"
    # derives sockets/cores/threads from the OS's socket limit and the hosts.
    cpu_check: str = "full"
    cpu_topology: str = "libvirt-default"
    # Windows client editions license at most this many sockets.
    windows_client_max_sockets: int = 2
    # OS short ids (and descendants) that are Windows *server* editions.
    # (win2k is left out: osinfo derives the client editions from it too.)
    windows_server_os: tuple[str, ...] = ("win2k3", "win2k8", "win2k12", "win2k16",
                                          "win2k19", "win2k22", "win2k25")

    # clock
    clock_offset_windows: str = "localtime"
    clock_offset: str = "utc"
    # (timer name, attribute, value), written in this order
    timers: tuple[tuple[str, str, str], ...] = (
        ("rtc", "tickpolicy", "catchup"), ("pit", "tickpolicy", "delay"), ("hpet", "present", "no"),
    )
    hypervclock_with_stimer: bool = True

    # disks
    disk_bus: str = "virtio"
    disk_bus_fallback_q35: str = "sata"
    disk_bus_fallback_i440fx: str = "ide"
    disk_cache: str = "none"
    disk_discard: str = "unmap"
    # I/O mode by disk kind
    disk_io: tuple[tuple[str, str], ...] = (
        ("qcow2", "threads"), ("raw", "threads"), ("raw-preallocated", "native"),
        ("block", "native"), ("network", "threads"),
    )
    # io_uring for file and block disks where every host's libvirt and QEMU offer it
    io_uring: bool = False
    io_uring_min_libvirt: tuple[int, int] = (6, 3)
    io_uring_min_qemu: tuple[int, int] = (5, 0)

    # devices: (paravirtual, fallback)
    nic: tuple[str, str] = ("virtio", "e1000e")
    usb: tuple[str, str] = ("qemu-xhci", "ich9-ehci1")
    video: tuple[str, str] = ("virtio", "vga")
    usb_ports: int = 15
    balloon_stats_period: int = 10
    rng_backend: str = "/dev/urandom"
    vnc_listen: str = "127.0.0.1"
    panic_linux: str = "isa"
    panic_windows: str = "hyperv"
    # Declared drivers this policy honours (a request's `drivers`), and the
    # osinfo devices they make available to a Windows guest.
    honoured_drivers: tuple[str, ...] = ()
    virtio_win_devices: tuple[str, ...] = ("virtio-block", "virtio-net", "virtio-balloon",
                                           "virtio-rng")

    # firmware / TPM: OS short ids (and their descendants in osinfo) that need a TPM 2.0.
    tpm_required_os: tuple[str, ...] = ("win11",)

    # Hyper-V
    spinlock_retries: int = 8191
    hyperv_wanted: tuple[str, ...] = (
        "relaxed", "vapic", "spinlocks", "vpindex", "runtime", "synic", "stimer",
        "frequencies", "tlbflush", "ipi", "evmcs",
    )
    # Hyper-V features that break live migration: never enabled.
    hyperv_never: tuple[str, ...] = ("reenlightenment",)
    # The Hyper-V features QEMU offers without KVM (TCG), for mode none on a
    # group where not every host has KVM.
    hyperv_tcg: tuple[str, ...] = ("spinlocks", "vendor_id")
    # Hyper-V vendor signature (12 characters at most); "" leaves QEMU's default.
    hyperv_vendor_id: str = ""

    # lifecycle actions; on_crash_with_dump applies when every host has a dump
    # location (HostCapabilities.dump_location), "" means never.
    on_poweroff: str = "destroy"
    on_reboot: str = "restart"
    on_crash: str = "destroy"
    on_crash_with_dump: str = ""

    # provenance: write the osinfo-db and cpu_map versions into <metadata> and
    # the inputs digest. 2026.1 predates this and writes neither.
    record_data_versions: bool = False
    # The data set versions the policy's golden files were made with; a
    # different osinfo-db or cpu_map is named in the plan's notes.
    data_versions: tuple[tuple[str, str], ...] = (
        ("osinfo-db", "20221203"), ("cpu_map", "sha256:d5e107556805997e"),
    )

    def io_mode(self, kind: str) -> str:
        return dict(self.disk_io)[kind]


_V2026_1 = Policy(
    version="2026.1",
    changelog="first release: CPU intersection with check=full, highest common pc-q35, "
    "EFI/TPM for Windows 11, Hyper-V set, virtio where in-box, VNC on localhost",
    changes=(
        "CPU: the named model closest to the features every host shares, check='full'",
        "machine: the highest versioned pc-q35 (pc-i440fx where osinfo lists no q35) on every host",
        "firmware: EFI when osinfo says the OS boots only with EFI; TPM 2.0 for Windows 11",
        "devices: virtio where the driver is in-box per osinfo, else e1000e/SATA/VGA/EHCI",
        "Hyper-V: relaxed … evmcs where every host has them, never reenlightenment",
        "no <topology> (libvirt: one socket per vCPU); on_crash destroy",
    ),
)

_V2026_2 = replace(
    _V2026_1,
    version="2026.2",
    changelog="CPU topology from OS limits and hosts, virtio for Windows with declared "
    "virtio-win, Hyper-V vendor_id, io_uring where offered, on_crash restart/coredump-restart, "
    "osinfo-db/cpu_map versions recorded",
    changes=(
        "cpu topology: sockets × cores × threads=1; cores per socket at most the smallest "
        "host's cores per socket, sockets at most the OS's limit (Windows client editions: 2)",
        "drivers: a request declaring virtio-win gets virtio disk, NIC, balloon and RNG for "
        "Windows (2026.1 ignores declared drivers)",
        "Hyper-V: vendor_id 'hvfleet' where every host offers it, so drivers that refuse to "
        "load under Microsoft's signature (older NVIDIA drivers, error 43) work",
        "disks: io='io_uring' for file and block disks where every host's libvirt ≥ 6.3 and "
        "QEMU ≥ 5.0 (network disks keep threads)",
        "on_crash: coredump-restart where every host has a dump location, restart otherwise "
        "(2026.1: destroy)",
        "metadata: osinfo-db and cpu_map versions, and they enter the inputs digest",
        "modes: software and none apply to every host-dependent decision (machine, firmware, "
        "devices, Hyper-V, topology, I/O, on_crash), not only the CPU",
    ),
    mode_scope="all",
    cpu_topology="os-and-hosts",
    honoured_drivers=("virtio-win",),
    hyperv_vendor_id="hvfleet",
    io_uring=True,
    on_crash="restart",
    on_crash_with_dump="coredump-restart",
    record_data_versions=True,
)

POLICIES: dict[str, Policy] = {p.version: p for p in (_V2026_1, _V2026_2)}
LATEST = "2026.2"


def get_policy(version: str) -> Policy:
    try:
        return POLICIES[version]
    except KeyError:
        raise InvalidInput(
            f"{version!r}: unknown policy version (known: {', '.join(POLICIES)})", field="policy"
        ) from None


def changelog_text() -> str:
    """Every version, newest last, with what it changed relative to the one before."""
    lines: list[str] = []
    for v, p in POLICIES.items():
        lines.append(f"{v}{' (latest)' if v == LATEST else ''}: {p.changelog}")
        lines.extend(f"  - {c}" for c in p.changes)
    return "\n".join(lines) + "\n"
