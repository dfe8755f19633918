"""Apply: create or update objects from Kubernetes-style manifests
(server-side apply), all or nothing — `hvfleet apply -f`. The API applies one
object per request (`PATCH` with `application/apply-patch+yaml`) through the
same planning step (`store.apply.plan_one`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hvfleet.model.hypervisor import Resource
from hvfleet.store.apply import Applied, apply_manifests, load_manifests
from hvfleet.store.base import Store


@dataclass(frozen=True)
class ApplyRequest:
    """The manifests, parsed and validated (`from_text`), and whether to take
    fields other managers own."""

    manifests: Sequence[Resource]
    force: bool = False

    @classmethod
    def from_text(cls, text: str, source: str = "-", force: bool = False) -> ApplyRequest:
        """InvalidInput naming `source` (a file name, `-` for stdin) and the document."""
        return cls(load_manifests(text, source), force)


@dataclass(frozen=True)
class ApplyAnswer:
    applied: list[Applied]

    def lines(self) -> list[str]:
        """`kind/name action` per object, as kubectl prints them."""
        return [f"{a.object.kind.lower()}/{a.object.metadata.name} {a.action}" for a in self.applied]


def apply(store: Store, request: ApplyRequest, manager: str) -> ApplyAnswer:
    """Every manifest applied in one atomic write (ClaimRequired for a
    Reservation that must be claimed)."""
    return ApplyAnswer(apply_manifests(store, request.manifests, manager, force=request.force))
