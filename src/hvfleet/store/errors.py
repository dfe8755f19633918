"""The errors of the store layer, in one place: what a backend's write or read
can refuse beyond the model's own errors (`hvfleet.model.errors`).

- `StaleVersion`: a compare-and-swap named a resourceVersion that is no
  longer current;
- `OwnershipConflict`: an apply changes fields other managers own;
- `ClaimRefused`: a claim refused by the check a remote store's server ran;
- `ClaimRequired`: a manifest would create a Reservation, which only a claim may;
- `Undecodable`: a stored object this hvfleet's model does not read;
- `RevisionNotReached`: a read at a revision newer than the store's current one.

Like every hvfleet error they carry no transport code: each edge maps the
class (the CLI to an exit code, the API to a Status).
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from hvfleet.model.errors import Conflict, HvfleetError, InvalidInput, Unavailable


class StaleVersion(Conflict):
    """A write named a resourceVersion that is no longer current."""


class OwnershipConflict(Conflict):
    """A spec field is owned by another manager (pass force to take it over).
    `conflicts` lists every (field path, owning manager), e.g. ("spec.overcommit.cpu",
    "ops"): the API turns each into a FieldManagerConflict cause."""

    def __init__(self, message: str, conflicts: builtins.list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.conflicts = conflicts or []

    @classmethod
    def of(cls, kind: str, name: str, conflicts: Sequence[tuple[str, str]]) -> OwnershipConflict:
        """The conflict of a write to `kind` `name` over these (field, owner)
        pairs, with the one message every backend gives for it (the remote
        backend rebuilds it from the API's FieldManagerConflict causes)."""
        ordered = sorted(conflicts)
        field, owner = ordered[0]
        more = f" (and {len(ordered) - 1} more)" if len(ordered) > 1 else ""
        out = cls(
            f"{kind} {name}: {field} is owned by manager {owner!r}{more}; "
            "force the write to take it over",
            ordered,
        )
        out.kind, out.name = kind, name
        return out

    kind: str = ""  # the object written, when known (an atomic batch has several)
    name: str = ""


class ClaimRefused(Conflict):
    """A claim refused by a check the store ran itself: the remote backend's
    server runs its own scheduling check (its POST of a Reservation is a claim),
    and answers with one (reason, message, resource) per rejection, which
    `hvfleet.scheduling.claims` turns back into DoesNotFit."""

    def __init__(self, message: str, host: str,
                 rejections: Sequence[tuple[str, str, str | None]]) -> None:
        super().__init__(message)
        self.host = host
        self.rejections = list(rejections)


class RevisionNotReached(Unavailable):
    """A read at a revision this store has not reached (`Store.list_at`): it
    may be reached later, as the API's 504 "Too large resource version" says."""


class ClaimRequired(InvalidInput):
    """A manifest would create a Reservation: only a claim (`Store.claim` with
    the capacity check) may, so apply refuses it."""


class Undecodable(HvfleetError):
    """A stored object that does not decode with this hvfleet's model. It can be
    deleted, or replaced by a write naming its resourceVersion."""

    def __init__(self, kind: str, name: str, revision: int, reason: str,
                 metadata: dict[str, Any] | None = None) -> None:
        super().__init__(
            f"{kind} {name}: the stored object (resourceVersion {revision}) cannot be read: "
            f"{reason}; delete it, or replace it with a write of resourceVersion {revision}"
        )
        self.kind = kind
        self.name = name
        self.revision = revision
        self.reason = reason
        # What could still be read of metadata (uid, labels, ...), as stored.
        self.metadata = metadata or {}

    @property
    def uid(self) -> str | None:
        uid = self.metadata.get("uid")
        return uid if isinstance(uid, str) else None

    @property
    def labels(self) -> dict[str, str]:
        labels = self.metadata.get("labels")
        if not isinstance(labels, dict):
            return {}
        return {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}
