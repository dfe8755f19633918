"""Which host facts a decision may use: the mode (the seed's options b–d) and the policy.

`intersection` and `host` use everything the hosts report. `software` (option
c) uses only software facts: libvirt/QEMU versions, machine types, device and
firmware lists, Hyper-V support; not the hardware (CPU vendor, features,
topology). `none` (option b) uses no host facts at all: it decides as if
every host were the policy's floor (a QEMU version), then only checks that
every host of the group offers what was chosen, so the guest still defines
everywhere. Policy 2026.1 applied the modes to the CPU alone (`mode_scope`
"cpu"), and stays so.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvfleet.guests.decision import hosts_list
from hvfleet.guests.errors import NotEverywhere
from hvfleet.guests.policy import Policy


@dataclass(frozen=True)
class Scope:
    mode: str
    policy: Policy

    @property
    def all_decisions(self) -> bool:
        return self.policy.mode_scope == "all"

    @property
    def hardware(self) -> bool:
        """May a decision use the hosts' hardware facts (CPU vendor, topology)?"""
        return not self.all_decisions or self.mode in ("intersection", "host")

    @property
    def software(self) -> bool:
        """May a decision use the hosts' software facts (versions, device lists)?"""
        return not self.all_decisions or self.mode != "none"

    @property
    def floor(self) -> str:
        return f"QEMU {self.policy.floor_qemu[0]}.{self.policy.floor_qemu[1]}"

    def refuse_lacking(self, area: str, value: str, lacking: list[str]) -> None:
        """Mode none chose `value` without asking the hosts: refuse if some lack it."""
        if lacking:
            raise NotEverywhere(
                f"{area}: mode none assumes every host offers {value} (policy "
                f"{self.policy.version} floor: {self.floor}), but {hosts_list(lacking)} "
                "do not"
            )
