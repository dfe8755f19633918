"""Which overcommit ratio applies to a hypervisor, and where it comes from.

Precedence, per resource:
1. the host's own `spec.overcommit[r]`;
2. else the matching OvercommitPolicy (its selector matches the host's labels)
   with the highest `spec.priority` that gives a ratio for `r`; at equal
   priority the one whose name sorts first;
3. else 1.0.
A policy never overrides what a host says for itself, and a resource no
policy names keeps its own ratio or 1.0: the resolution is per resource, not
per policy. Pure; `hvfleet.model.capacity` applies the result.

`selects` is the one test of whether a policy governs a host (by its labels):
the resolution here, the readers, and the API's narrowing of what an agent
may read (the policies that select its own host, hvfleet.server.auth) use it.
A node agent that could not read the policies does not guess ratio 1: it keeps
the last effectiveCapacity it resolved and says so in its `Synced` condition
(`SYNCED_CONDITION`, reason `RATIOS_UNRESOLVED`), which `spec_sync` shows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hvfleet.model.hypervisor import Hypervisor, OvercommitPolicy
from hvfleet.model.resources import ResourceName

SPEC = "spec"

# The agent's condition on whether status.effectiveCapacity is resolved from
# the current spec and the policies that select the host.
SYNCED_CONDITION = "Synced"
RATIOS_RESOLVED = "RatiosResolved"
RATIOS_UNRESOLVED = "RatiosUnresolved"


@dataclass(frozen=True)
class Ratio:
    value: float
    # "spec" (the host's own), or "OvercommitPolicy/NAME"
    source: str


def selects(p: OvercommitPolicy, labels: Mapping[str, str]) -> bool:
    """Whether `p` governs a host with these labels."""
    return p.spec.selector.to_selector().matches(labels)


def matching_policies(h: Hypervisor, policies: Iterable[OvercommitPolicy]) -> list[OvercommitPolicy]:
    """The policies whose selector matches `h`, in precedence order."""
    return sorted(
        (p for p in policies if selects(p, h.metadata.labels)),
        key=lambda p: (-p.spec.priority, p.name),
    )


def resolve_overcommit(
    h: Hypervisor, policies: Iterable[OvercommitPolicy] = ()
) -> dict[ResourceName, Ratio]:
    """Per resource with a ratio other than the default: the ratio and its source."""
    out = {r: Ratio(v, SPEC) for r, v in h.spec.overcommit.items()}
    for p in matching_policies(h, policies):
        for r, v in p.spec.overcommit.items():
            out.setdefault(r, Ratio(v, f"OvercommitPolicy/{p.name}"))
    return dict(sorted(out.items(), key=lambda kv: str(kv[0])))


def effective_overcommit(
    h: Hypervisor, policies: Iterable[OvercommitPolicy] = ()
) -> dict[ResourceName, float]:
    """The ratios capacity is computed with (absent: 1.0)."""
    return {r: ratio.value for r, ratio in resolve_overcommit(h, policies).items()}
