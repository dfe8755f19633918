"""Firmware, secure boot, SMM and TPM.

EFI when the OS needs it (osinfo: efi supported, bios not, e.g. win11) or
when asked, and only if every host has it; BIOS otherwise, which needs no
per-guest NVRAM. A TPM 2.0 (`tpm-crb` with EFI, else `tpm-tis`) backed by the
swtpm emulator for OSes that require one or when asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvfleet.guests.decision import Decision, hosts_list
from hvfleet.guests.errors import NotEverywhere
from hvfleet.guests.osinfo import OSInfo
from hvfleet.guests.policy import Policy
from hvfleet.guests.request import GuestRequest, HostGroup
from hvfleet.model.errors import InvalidInput


@dataclass(frozen=True)
class Firmware:
    efi: bool
    secure_boot: bool


@dataclass(frozen=True)
class TPM:
    model: str
    version: str = "2.0"


def decide_firmware(req: GuestRequest, os: OSInfo, group: HostGroup) -> Decision[Firmware]:
    if req.firmware == "efi" or req.secure_boot:
        want, why = True, "EFI asked for" + (" (secure boot)" if req.secure_boot else "")
    elif req.firmware == "bios":
        if os.needs_efi():
            raise InvalidInput(f"bios: osinfo says {os.short_id} only boots with EFI", field="firmware")
        want, why = False, "BIOS asked for"
    elif os.needs_efi():
        want, why = True, f"osinfo: {os.short_id} boots only with EFI"
    else:
        want, why = False, f"osinfo: {os.short_id} boots with BIOS; no NVRAM to carry around"
    if not want:
        return Decision("firmware", Firmware(False, False), "bios", why,
                        (f"osinfo firmware for {os.short_id}: {os.firmware or 'not listed'}",))
    lacking = [n for n, c in group.hosts if c.firmware.efi is not True]
    if lacking:
        raise NotEverywhere(
            f"firmware: EFI needed but not offered (or unknown: no domcapabilities) on "
            f"{hosts_list(lacking)}"
        )
    if req.secure_boot:
        no_sb = [n for n, c in group.hosts if c.firmware.secure_boot is not True]
        if no_sb:
            raise NotEverywhere(f"firmware: secure boot asked but not offered on {hosts_list(no_sb)}")
    return Decision(
        "firmware", Firmware(True, req.secure_boot),
        "efi" + (" + secure boot (smm on)" if req.secure_boot else ""),
        why,
        (f"EFI firmware on every host: {hosts_list(group.names)}",
         f"osinfo firmware for {os.short_id}: {os.firmware or 'not listed'}"),
    )


def decide_tpm(
    req: GuestRequest, os: OSInfo, group: HostGroup, fw: Firmware, policy: Policy
) -> Decision[TPM | None]:
    required = next((s for s in os.lineage if s in policy.tpm_required_os), None)
    if not req.tpm and not required:
        return Decision("tpm", None, "none", "not asked for, and the OS does not require one")
    why = "asked for" if req.tpm else f"{os.short_id} requires TPM 2.0 (policy: {required})"
    model = "tpm-crb" if fw.efi else "tpm-tis"
    evidence: list[str] = []
    for name, caps in group.hosts:
        if caps.tpm_models is None:
            evidence.append(
                f"{name}: libvirt lists no TPM models (too old to say); "
                f"QEMU {caps.hypervisor_version or '?'} has {model} since 2.12"
            )
            continue
        if model not in caps.tpm_models:
            raise NotEverywhere(f"tpm: {model} not offered on {name} (has {caps.tpm_models})")
        if caps.tpm_backends is not None and "emulator" not in caps.tpm_backends:
            raise NotEverywhere(f"tpm: the emulator (swtpm) backend is not offered on {name}")
        if caps.tpm_versions and "2.0" not in caps.tpm_versions:
            raise NotEverywhere(f"tpm: TPM 2.0 is not offered on {name}")
    evidence.insert(0, f"{model} + emulator 2.0 on every host that lists TPM models")
    return Decision(
        "tpm", TPM(model), f"{model}, emulator 2.0",
        why + ("; CRB interface with EFI" if fw.efi else "; TIS interface with BIOS"),
        tuple(evidence),
    )
