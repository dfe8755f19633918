"""Policy versions: the frozen parameters behind every default.

A released policy never changes (golden files under tests/guests/golden/<V>/
prove it); new behaviour gets a new version, like a pinned machine type. The
decision modules read their knobs from the `Policy` they are given, never from
module constants, so an old version keeps producing the same XML.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvfleet.model.errors import InvalidInput


@dataclass(frozen=True)
class Policy:
    version: str
    changelog: str
    spinlock_retries: int = 8191
    balloon_stats_period: int = 10
    vnc_listen: str = "127.0.0.1"
    usb_ports: int = 15
    rng_backend: str = "/dev/urandom"
    # OS short ids (and their descendants in osinfo) that need a TPM 2.0.
    tpm_required_os: tuple[str, ...] = ("win11",)
    hyperv_wanted: tuple[str, ...] = (
        "relaxed", "vapic", "spinlocks", "vpindex", "runtime", "synic", "stimer",
        "frequencies", "tlbflush", "ipi", "evmcs",
    )
    # Hyper-V features that break live migration: never enabled.
    hyperv_never: tuple[str, ...] = ("reenlightenment",)


POLICIES: dict[str, Policy] = {
    "2026.1": Policy(
        version="2026.1",
        changelog="first release: CPU intersection with check=full, highest common pc-q35, "
        "EFI/TPM for Windows 11, Hyper-V set, virtio where in-box, VNC on localhost",
    ),
}
LATEST = "2026.1"


def get_policy(version: str) -> Policy:
    try:
        return POLICIES[version]
    except KeyError:
        raise InvalidInput(
            f"{version!r}: unknown policy version (known: {', '.join(POLICIES)})", field="policy"
        ) from None
