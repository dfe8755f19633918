"""Field ownership and metadata bookkeeping, shared by every store backend.

Modelled on Kubernetes server-side apply: every write names a field manager;
each leaf of `spec` (e.g. `spec.overcommit.cpu`) is owned by the manager that
last set it, recorded in `metadata.managedFields` as FieldsV1. A different
manager changing an owned leaf gets a Conflict naming the owner, unless it
forces, which moves ownership. `status` of a Hypervisor is written only by
`agent/<name>`, and agents never write its `spec` (the seed's split of
duties). A liveness `Lease` is the agent's alone: only `agent/<name>` creates
or renews the Lease `<name>`, holding it as itself.

Backends call `prepare_create` / `prepare_update` inside their atomic write, so
the check and the write can never be separated by another writer.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from hvfleet.model.capacity import growth_past_claim
from hvfleet.model.errors import Forbidden, InvalidInput
from hvfleet.model.hypervisor import Hypervisor, HypervisorSpec, Reservation, Resource
from hvfleet.model.lease import Lease
from hvfleet.model.meta import ManagedFieldsEntry
from hvfleet.store import lifecycle
from hvfleet.store.base import OwnershipConflict, StaleVersion

Path = tuple[str, ...]
AGENT_PREFIX = "agent/"


def agent_manager(hypervisor_name: str) -> str:
    return f"{AGENT_PREFIX}{hypervisor_name}"


def check_manager(manager: str) -> str:
    if not manager or len(manager) > 128 or not manager.isprintable():
        raise InvalidInput("manager: must be a printable name of 1 to 128 characters")
    return manager


def leaves(value: Any, prefix: Path) -> dict[Path, Any]:
    """Flatten nested dicts to {path: leaf}. Lists and scalars are leaves."""
    if isinstance(value, dict):
        out: dict[Path, Any] = {}
        for k, v in value.items():
            out.update(leaves(v, (*prefix, str(k))))
        return out
    return {prefix: value}


def _spec_leaves(obj: Resource) -> dict[Path, Any]:
    # Python-mode dump keeps Quantity objects, which compare by value: 1Gi == 1024Mi.
    spec = obj.spec.model_dump(by_alias=True)
    return leaves(spec, ("spec",))


def _is_set(value: Any) -> bool:
    """A leaf at its zero value ("", empty map) is not owned by anyone."""
    return value not in ("", None) and value != {} and value != []


def to_fields_v1(paths: Iterable[Path]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for path in sorted(paths):
        node = root
        for part in path:
            node = node.setdefault(f"f:{part}", {})
    return root


def from_fields_v1(fields: dict[str, Any], prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for key, sub in fields.items():
        path = (*prefix, key.removeprefix("f:"))
        if isinstance(sub, dict) and sub:
            out |= from_fields_v1(sub, path)
        else:
            out.add(path)
    return out


def owners(obj: Resource) -> dict[Path, str]:
    """Which manager owns each recorded spec leaf."""
    out: dict[Path, str] = {}
    for entry in obj.metadata.managed_fields:
        for path in from_fields_v1(entry.fields_v1):
            if path and path[0] == "spec":
                out[path] = entry.manager
    return out


def _status_of(obj: Resource) -> object:
    """The object's status (a Lease has none, as in Kubernetes)."""
    return None if isinstance(obj, Lease) else obj.status


def _status_writer(obj: Resource) -> str | None:
    """The only manager allowed to write this object's status (None: anyone)."""
    return agent_manager(obj.metadata.name) if isinstance(obj, Hypervisor) else None


def _managed_fields(
    previous: list[ManagedFieldsEntry],
    manager: str,
    set_paths: set[Path],
    dropped_paths: set[Path],
    status_written: bool,
    now: datetime,
) -> list[ManagedFieldsEntry]:
    """managedFields after `manager` set or dropped the given leaves."""
    taken = set_paths | dropped_paths
    out: list[ManagedFieldsEntry] = []
    mine: set[Path] = set()
    mine_time: datetime | None = None
    for entry in previous:
        paths = from_fields_v1(entry.fields_v1)
        if entry.manager == manager:
            mine, mine_time = paths, entry.time
            continue
        paths -= taken
        if paths:
            out.append(entry.model_copy(update={"fields_v1": to_fields_v1(paths)}))
    mine = (mine - dropped_paths) | set_paths | ({("status",)} if status_written else set())
    if mine:
        touched = bool(taken) or status_written
        out.append(
            ManagedFieldsEntry(
                manager=manager,
                time=now if touched or mine_time is None else mine_time,
                fields_v1=to_fields_v1(mine),
            )
        )
    return sorted(out, key=lambda e: e.manager)


def _check_lease_writer(obj: Resource, manager: str) -> None:
    """A Lease is written only by the agent it names, holding it as itself."""
    if not isinstance(obj, Lease):
        return
    agent = agent_manager(obj.metadata.name)
    if manager != agent:
        raise Forbidden(
            f"Lease {obj.metadata.name}: written only by {agent!r}, not by {manager!r}"
        )
    if obj.spec.holder_identity not in ("", agent):
        raise InvalidInput(
            f"Lease {obj.metadata.name}: spec.holderIdentity: must be {agent!r} "
            f"(or empty once released), not {obj.spec.holder_identity!r}"
        )


def _check_reservation_growth(old: Resource, new: Resource, now: datetime) -> None:
    """Only a claim re-checks free capacity in the atomic write (`Store.claim`):
    an update must not make a reservation hold more than was claimed."""
    if not (isinstance(old, Reservation) and isinstance(new, Reservation)):
        return
    grown = growth_past_claim(old, new, now)
    if grown is not None:
        field, what = grown
        raise InvalidInput(
            f"Reservation {new.metadata.name}: {what} would hold more than its claim "
            "checked; release it and claim anew",
            field=field,
        )


def _check_status_writer(obj: Resource, manager: str) -> None:
    writer = _status_writer(obj)
    if writer is not None and manager != writer:
        raise Forbidden(
            f"{obj.kind} {obj.metadata.name}: status is written only by {writer!r}, "
            f"not by {manager!r}"
        )


def prepare_create(obj: Resource, manager: str, now: datetime) -> Resource:
    """The object as stored on create (resourceVersion is set by the backend)."""
    check_manager(manager)
    obj = lifecycle.on_create(obj)
    _check_lease_writer(obj, manager)
    writer = _status_writer(obj)
    if (
        manager.startswith(AGENT_PREFIX)
        and isinstance(obj, Hypervisor)
        and obj.spec != HypervisorSpec()
    ):
        raise Forbidden(f"{obj.kind} {obj.metadata.name}: agents do not write spec ({manager!r})")
    status_written = writer is None or manager == writer
    if not status_written and isinstance(obj, Hypervisor):
        # As in Kubernetes with a status subresource: status in a create is ignored.
        obj = obj.model_copy(update={"status": type(obj.status)()})
    spec_paths = {p for p, v in _spec_leaves(obj).items() if _is_set(v)}
    meta = obj.metadata.model_copy(
        update={
            "uid": str(uuid.uuid4()),
            "creation_timestamp": now,
            "generation": 1,
            "resource_version": None,
            "managed_fields": _managed_fields(
                [], manager, spec_paths, set(), status_written and writer is not None, now
            ),
        }
    )
    return _without_lease_fields(obj.model_copy(update={"metadata": meta}))


def _without_lease_fields(obj: Resource) -> Resource:
    """A Lease records no managedFields: it has one possible writer (its agent),
    so per-field ownership would say nothing, and would be 45% of the bytes of
    every renewal."""
    if isinstance(obj, Lease) and obj.metadata.managed_fields:
        meta = obj.metadata.model_copy(update={"managed_fields": []})
        return obj.model_copy(update={"metadata": meta})
    return obj


def prepare_update(
    old: Resource, new: Resource, manager: str, *, force: bool, now: datetime
) -> Resource:
    """The object as stored after `manager` writes `new` over `old`.

    Raises StaleVersion, OwnershipConflict or Forbidden; backends call this inside
    the same transaction as the write."""
    check_manager(manager)
    if new.kind != old.kind or new.metadata.name != old.metadata.name:
        raise InvalidInput("update: kind and metadata.name cannot change")
    if new.metadata.resource_version is None:
        raise InvalidInput(
            f"{new.kind} {new.metadata.name}: metadata.resourceVersion is required for an update"
        )
    if new.metadata.resource_version != old.metadata.resource_version:
        raise StaleVersion(
            f"{new.kind} {new.metadata.name}: resourceVersion {new.metadata.resource_version} "
            f"is stale (current is {old.metadata.resource_version}); re-read and retry"
        )
    new = lifecycle.on_update(old, new)
    _check_lease_writer(new, manager)
    _check_reservation_growth(old, new, now)
    status_changed = _status_of(new) != _status_of(old)
    if status_changed:
        _check_status_writer(new, manager)
    old_leaves, new_leaves = _spec_leaves(old), _spec_leaves(new)
    changed = {
        p for p in set(old_leaves) | set(new_leaves) if old_leaves.get(p) != new_leaves.get(p)
    }
    if changed and manager.startswith(AGENT_PREFIX) and not isinstance(new, Lease):
        raise Forbidden(f"{new.kind} {new.metadata.name}: agents do not write spec ({manager!r})")
    owned = owners(old)
    conflicts = sorted(
        (".".join(p), owned[p]) for p in changed if p in owned and owned[p] != manager
    )
    if conflicts and not force:
        raise OwnershipConflict.of(new.kind, new.metadata.name, conflicts)
    set_paths = {p for p in changed if _is_set(new_leaves.get(p))}
    dropped = changed - set_paths
    writer = _status_writer(new)
    meta = new.metadata.model_copy(
        update={
            "uid": old.metadata.uid,
            "creation_timestamp": old.metadata.creation_timestamp,
            "generation": old.metadata.generation + (1 if changed else 0),
            "managed_fields": _managed_fields(
                old.metadata.managed_fields, manager, set_paths, dropped,
                status_changed and writer is not None, now,
            ),
        }
    )
    return _without_lease_fields(new.model_copy(update={"metadata": meta}))


def apply_spec(current: Resource, manifest: Resource, manager: str) -> Resource:
    """Server-side-apply merge of `manifest.spec` onto `current`, as `manager`.

    Leaves in the manifest are set; leaves `manager` owned before and left out of
    the manifest are removed; leaves owned by others and absent from the
    manifest are kept. Conflicts are found later by `prepare_update`."""
    mine = {p for p, owner in owners(current).items() if owner == manager}
    desired = {p: v for p, v in _spec_leaves(manifest).items() if _is_set(v)}
    merged = {p: v for p, v in _spec_leaves(current).items() if p not in mine}
    merged.update(desired)
    spec: dict[str, Any] = {}
    for path, value in merged.items():
        node = spec
        for part in path[1:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    new_spec = type(current.spec).model_validate(spec)
    return current.model_copy(update={"spec": new_spec})
