"""Whether the agent has observed a host's current spec and policies
(`spec_sync`): a judgment every reader shows (the CLI, the API's fit answer,
the dashboard), as `hvfleet.model.readiness` judges liveness.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from hvfleet.model import capacity as cap
from hvfleet.model.hypervisor import Hypervisor, OvercommitPolicy
from hvfleet.model.meta import find_condition
from hvfleet.model.overcommit import SYNCED_CONDITION
from hvfleet.model.readable import human
from hvfleet.model.readable import pairs as _pairs

SyncState = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class SpecSync:
    """Whether the agent has observed the host's current spec: `True` when
    status.observedGeneration >= metadata.generation, `False` when the spec is
    newer (status.effectiveCapacity then lags; every view shows the effective
    capacity computed from the current spec), `Unknown` before any agent ran."""

    state: SyncState
    generation: int
    observed_generation: int | None
    message: str

    @property
    def pending(self) -> bool:
        return self.state == "False"

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state, "generation": self.generation,
            "observedGeneration": self.observed_generation, "message": self.message,
        }


def spec_sync(h: Hypervisor, policies: Sequence[OvercommitPolicy] | None = None) -> SpecSync:
    """Whether the agent's status.effectiveCapacity is from the current spec.
    With `policies` (the store's OvercommitPolicies), also whether it is from
    the current policies: a policy change moves no host's generation. An
    agent that could not resolve its ratios says so in its `Synced` condition,
    which comes first: its effectiveCapacity is then the last one it resolved."""
    gen, seen = h.metadata.generation, h.status.observed_generation
    if seen is None:
        return SpecSync("Unknown", gen, None, "no agent has observed this host's spec yet")
    said = find_condition(h.status.conditions, SYNCED_CONDITION)
    if said is not None and said.status == "False":
        return SpecSync(
            "False", gen, seen,
            f"{said.reason or 'NotSynced'}: {said.message}; shown is the capacity under the "
            "current spec and policies",
        )
    if seen >= gen:
        if policies is not None and h.status.capacity:
            current = cap.hypervisor_effective_capacity(h, policies)
            if current != h.status.effective_capacity:
                if not h.status.effective_capacity:
                    why = "the agent has written no status.effectiveCapacity"
                else:
                    # A policy change moves no generation; nor does an agent of
                    # another version, which computes the capacity otherwise.
                    # Exact forms: 16288Mi and 16Gi would both read "15.9Gi".
                    stored = _pairs(h.status.effective_capacity, lambda _r, q: str(q))
                    now = _pairs(current, lambda _r, q: str(q))
                    why = (f"an OvercommitPolicy changed since the agent's last write, or an agent "
                           f"of another version wrote it: status.effectiveCapacity ({stored}) "
                           f"differs from the capacity computed now ({now})")
                return SpecSync("False", gen, seen,
                                f"{why}; shown is the capacity under the current spec and policies")
        return SpecSync("True", gen, seen, f"the agent observed generation {gen}")
    lag = _pairs(h.status.effective_capacity, human)
    return SpecSync(
        "False", gen, seen,
        f"spec generation {gen} not yet observed by the agent (it saw {seen}): "
        f"status.effectiveCapacity ({lag}) is from then; shown is the capacity under the current spec",
    )
