"""Field ownership and metadata bookkeeping, shared by every store backend.

Modelled on Kubernetes server-side apply (structured-merge-diff): every write
names a field manager, and `metadata.managedFields` records, as FieldsV1, which
fields each manager owns: every leaf of `spec` (e.g. `spec.overcommit.cpu`),
every key of `metadata.labels` and `metadata.annotations`, and a Hypervisor's
`status` (its agent's). There is one entry per (manager, operation,
subresource), as kube-apiserver keeps them:
- an **Update** (create, PUT, merge or JSON patch, `Store.update`) always
  succeeds as far as ownership goes: the fields it changes leave every other
  entry and join the writer's Update entry;
- an **Apply** (`Write.applied`: server-side apply, `hvfleet apply`, the CLI's
  and the dashboard's spec edits) names the fields of its configuration: they
  become exactly the writer's Apply entry (co-owned with whoever owns them at
  the same value), and changing a field another manager owns (by Apply or
  Update) is an OwnershipConflict naming every owner, unless forced, which
  moves it. Fields the manager applied before and leaves out are removed from
  the object only when nobody else owns them (`apply_merge`, structured-merge-
  diff's prune). Unlike kube-apiserver, which keys conflicts by (manager,
  operation), a manager never conflicts with itself: hvfleet takes the manager
  from the caller's identity, so one person's patch and apply share a name.
- a status write by the Hypervisor's agent is recorded in its entry with
  `subresource: status`.

`status` of a Hypervisor is written only by `agent/<name>`, and agents never
write its `spec` (the seed's split of duties). A liveness `Lease` is the
agent's alone: only `agent/<name>` creates or renews the Lease `<name>`,
holding it as itself.

A write that changes nothing (an identical PUT or apply, an empty patch) is
not written at all: `prepare_update` returns the stored object itself, and
every backend answers it as stored, without a new resourceVersion, generation
or watch event (`unchanged`).

Backends call `prepare_create` / `prepare_update` inside their atomic write, so
the check and the write can never be separated by another writer.
"""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from hvfleet.model.bounds import MAX_MANAGER
from hvfleet.model.errors import Forbidden, HvfleetError, InvalidInput
from hvfleet.model.hypervisor import Resource
from hvfleet.model.kinds import AGENT_PREFIX as AGENT_PREFIX
from hvfleet.model.kinds import agent_manager as agent_manager
from hvfleet.model.kinds import strategy_of
from hvfleet.model.meta import ManagedFieldsEntry
from hvfleet.store import lifecycle
from hvfleet.store.base import FieldPath, OwnershipConflict, StaleVersion, check_overwrite
from hvfleet.store.undecodable import Undecodable, overwrite

Path = FieldPath
Operation = Literal["Apply", "Update"]
STATUS: Path = ("status",)
# The metadata maps whose keys are owned one by one.
_META_MAPS = ("labels", "annotations")


def check_manager(manager: str) -> str:
    if not manager or len(manager) > MAX_MANAGER or not manager.isprintable():
        raise InvalidInput(f"manager: must be a printable name of 1 to {MAX_MANAGER} characters")
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


def owned_fields(obj: Resource, spec_leaves: dict[Path, Any] | None = None) -> dict[Path, Any]:
    """Every field ownership is recorded for, with its value: the spec leaves
    that are set (`spec_leaves`, when the caller has them already), and every
    label and annotation key."""
    leaves_of_spec = _spec_leaves(obj) if spec_leaves is None else spec_leaves
    out = {p: v for p, v in leaves_of_spec.items() if _is_set(v)}
    for attr in _META_MAPS:
        for key, value in getattr(obj.metadata, attr).items():
            out[("metadata", attr, key)] = value
    return out


def _given(value: Any, prefix: Path) -> dict[Path, Any]:
    """The leaves a document names explicitly (pydantic's fields set), by the
    paths `leaves` gives them: a field left to its default is not named."""
    if isinstance(value, BaseModel):
        out: dict[Path, Any] = {}
        fields = type(value).model_fields
        for name in value.model_fields_set:
            alias = fields[name].alias or name
            out.update(_given(getattr(value, name), (*prefix, alias)))
        return out
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(_given(v, (*prefix, str(k))))
        return out
    return {prefix: value}


def applied_fields(manifest: Resource) -> frozenset[Path]:
    """The field set of an apply configuration: the spec leaves it names (a
    leaf named at its zero value too: `maintenance: ""` is a value, as in
    kube-apiserver, which clears a field another manager set, a conflict
    unless forced), and its label and annotation keys."""
    spec = set(_given(manifest.spec, ("spec",)))
    return frozenset(spec | {p for p in owned_fields(manifest) if p[0] == "metadata"})


def named_fields(doc: Mapping[str, Any]) -> frozenset[Path]:
    """The field set of an apply configuration as sent (a partial document:
    kube-apiserver's apply configurations name only the fields their manager
    manages): the spec leaves it names, at any value, and its label and
    annotation keys, by the names the API spells them."""
    spec = doc.get("spec")
    paths: set[Path] = set(leaves(spec, ("spec",))) if isinstance(spec, dict) else set()
    meta = doc.get("metadata")
    for attr in _META_MAPS:
        given = meta.get(attr) if isinstance(meta, dict) else None
        paths |= {("metadata", attr, str(k)) for k in given or {}}
    return frozenset(paths)


def spec_paths(obj: Resource) -> set[Path]:
    """Every spec leaf of `obj`, by the names the API spells them."""
    return set(_spec_leaves(obj))


def spec_changes(current: Resource, new: Resource) -> set[Path]:
    """The spec leaves whose value `new` changes from `current`'s."""
    before, after = _spec_leaves(current), _spec_leaves(new)
    missing = object()
    return {p for p in set(before) | set(after) if before.get(p, missing) != after.get(p, missing)}


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
        if not key.startswith("f:"):
            continue  # "." (the map itself) and list keys: hvfleet owns leaves
        path = (*prefix, key[2:])
        if isinstance(sub, dict) and any(k.startswith("f:") for k in sub):
            out |= from_fields_v1(sub, path)
        else:
            out.add(path)
    return out


@dataclass
class _Entry:
    """One managedFields entry, decoded."""

    manager: str
    operation: Operation
    subresource: str
    paths: set[Path] = field(default_factory=set)
    time: datetime | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return self.manager, self.operation, self.subresource


def _entries(obj: Resource) -> dict[tuple[str, str, str], _Entry]:
    """The object's managedFields by (manager, operation, subresource). A status
    path recorded in a main entry (as hvfleet wrote it before subresources were
    recorded) counts as that manager's status Update."""
    out: dict[tuple[str, str, str], _Entry] = {}
    for e in obj.metadata.managed_fields:
        paths = from_fields_v1(e.fields_v1)
        sub = e.subresource or ""
        status = {p for p in paths if p[0] == "status"} if not sub else set()
        for key, part, op in (((e.manager, e.operation, sub), paths - status, e.operation),
                              ((e.manager, "Update", "status"), status, "Update")):
            if not part:
                continue
            entry = out.setdefault(key, _Entry(e.manager, op, key[2]))
            entry.paths |= part
            entry.time = max((t for t in (entry.time, e.time) if t is not None), default=None)
    return out


def _encode(entries: Iterable[_Entry]) -> list[ManagedFieldsEntry]:
    return [
        ManagedFieldsEntry(manager=e.manager, operation=e.operation, time=e.time,
                           fields_v1=to_fields_v1(e.paths), subresource=e.subresource or None)
        for e in sorted(entries, key=lambda e: e.key)
        if e.paths
    ]


def owners(obj: Resource) -> dict[Path, str]:
    """Who owns each recorded spec leaf: one manager, or co-owners joined by ", "."""
    found: dict[Path, set[str]] = {}
    for entry in _entries(obj).values():
        for path in entry.paths:
            if path[0] == "spec":
                found.setdefault(path, set()).add(entry.manager)
    return {p: ", ".join(sorted(ms)) for p, ms in found.items()}


def _record(
    entries: dict[tuple[str, str, str], _Entry],
    manager: str,
    changed: set[Path],
    present: Mapping[Path, Any],
    applied: frozenset[Path] | None,
    status_written: bool,
    now: datetime,
) -> list[ManagedFieldsEntry]:
    """managedFields after `manager` changed `changed` (fields now `present`),
    as an Apply of `applied` or, when None, as an Update."""
    operation: Operation = "Update" if applied is None else "Apply"
    mine = (manager, operation, "")
    for entry in entries.values():
        if entry.key != mine and entry.subresource == "":
            entry.paths -= changed
    own = entries.setdefault(mine, _Entry(manager, operation, ""))
    before = set(own.paths)
    if applied is None:
        own.paths = (own.paths | changed) & set(present)
    else:
        own.paths = set(applied) & set(present)
    if changed or own.paths != before or own.time is None:
        own.time = now
    if status_written:
        for entry in entries.values():
            entry.paths.discard(STATUS)
        status = entries.setdefault((manager, "Update", "status"),
                                    _Entry(manager, "Update", "status"))
        status.paths, status.time = {STATUS}, now
    return _encode(entries.values())


def _check_status_writer(obj: Resource, manager: str) -> None:
    writer = strategy_of(obj).status_owner(obj)
    if writer is not None and manager != writer:
        raise Forbidden(
            f"{obj.kind} {obj.metadata.name}: status is written only by {writer!r}, "
            f"not by {manager!r}"
        )


@contextlib.contextmanager
def _about(obj: Resource) -> Iterator[None]:
    """A kind's refusal of `obj`, marked with the object it is about (one
    manifest among many in an apply or a restore)."""
    try:
        yield
    except HvfleetError as exc:
        if exc.about is None:
            exc.about = f"{obj.kind} {obj.metadata.name}"
        raise


def prepare_create(
    obj: Resource, manager: str, now: datetime, applied: frozenset[Path] | None = None
) -> Resource:
    """The object as stored on create (resourceVersion is set by the backend);
    with `applied`, created by a server-side apply of those fields."""
    check_manager(manager)
    obj = lifecycle.on_create(obj)
    kind = strategy_of(obj)
    with _about(obj):
        kind.validate_create(obj, manager)
    writer = kind.status_owner(obj)
    status_written = writer is None or manager == writer
    if not status_written:
        # As in Kubernetes with a status subresource: status in a create is ignored.
        obj = obj.model_copy(update={"status": type(kind.status_of(obj))()})
    present = owned_fields(obj)
    meta = obj.metadata.model_copy(
        update={
            "uid": str(uuid.uuid4()),
            "creation_timestamp": now,
            "generation": 1,
            "resource_version": None,
            "managed_fields": _record(
                {}, manager, set(present), present, applied,
                status_written and writer is not None, now,
            ),
        }
    )
    return _without_lease_fields(obj.model_copy(update={"metadata": meta}))


def _without_lease_fields(obj: Resource) -> Resource:
    """A Lease records no managedFields (`KindStrategy.records_fields`): it has
    one possible writer (its agent), so per-field ownership would say nothing,
    and would be 45% of the bytes of every renewal."""
    if not strategy_of(obj).records_fields and obj.metadata.managed_fields:
        meta = obj.metadata.model_copy(update={"managed_fields": []})
        return obj.model_copy(update={"metadata": meta})
    return obj


def prepare_update_over(
    read: Callable[[], Resource],
    new: Resource,
    manager: str,
    *,
    force: bool,
    now: datetime,
    applied: frozenset[Path] | None = None,
) -> tuple[Resource | None, Resource]:
    """The stored object (`read()`; None when it does not decode) and `new` as
    an update over it stores it: `prepare_update`, or over an object that does
    not decode, an overwrite, which must name the version stored (every
    backend's rule, in one place)."""
    try:
        old = read()
    except Undecodable as exc:
        check_overwrite(exc, new)
        return None, overwrite(exc, new, manager, now)
    return old, prepare_update(old, new, manager, force=force, now=now, applied=applied)


def prepare_update(
    old: Resource,
    new: Resource,
    manager: str,
    *,
    force: bool,
    now: datetime,
    applied: frozenset[Path] | None = None,
) -> Resource:
    """The object as stored after `manager` writes `new` over `old`: an Update,
    or with `applied` an Apply of those fields (see the module docstring).
    When the write changes nothing, `old` itself (`unchanged`): nothing to write.

    Raises StaleVersion, OwnershipConflict (Apply only) or Forbidden; backends
    call this inside the same transaction as the write."""
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
    kind = strategy_of(new)
    with _about(new):
        kind.validate_update(old, new, manager, now)
    status_changed = kind.status_of(new) != kind.status_of(old)
    if status_changed:
        _check_status_writer(new, manager)
    old_leaves, new_leaves = _spec_leaves(old), _spec_leaves(new)
    spec_changed = any(old_leaves.get(p) != new_leaves.get(p)
                       for p in set(old_leaves) | set(new_leaves))
    if spec_changed and manager.startswith(AGENT_PREFIX) and not kind.agent_writes_spec:
        raise Forbidden(f"{new.kind} {new.metadata.name}: agents do not write spec ({manager!r})")
    before, after = owned_fields(old, old_leaves), owned_fields(new, new_leaves)
    missing = object()
    changed = {p for p in set(before) | set(after)
               if before.get(p, missing) != after.get(p, missing)}
    writer = kind.status_owner(new)
    status_written = status_changed and writer is not None
    if not changed and applied is None:
        # The hot path of an agent's status write: no owned field changes, so
        # only its status entry's time moves (or nothing at all).
        managed = _status_time_moved(old, manager, now) if status_written else \
            old.metadata.managed_fields
        if managed is not None:
            if not status_changed and managed == old.metadata.managed_fields:
                out = _as_stored(old, new, old.metadata.generation, managed)
                return old if out == old else out
            return _as_stored(old, new, old.metadata.generation + (1 if spec_changed else 0), managed)
    generation = old.metadata.generation + (1 if spec_changed else 0)
    if not kind.records_fields and (applied is None or not old.metadata.managed_fields):
        # A Lease renewal: no managedFields are kept (one writer), so there is
        # nothing to record, and no other manager's entry to conflict with.
        out = _as_stored(old, new, generation, [])
        return old if not (changed or status_changed) and out == old else out
    entries = _entries(old)
    if applied is not None:
        conflicts = sorted(
            (".".join(p), e.manager)
            for e in entries.values() if e.manager != manager and e.subresource == ""
            for p in e.paths & changed
        )
        if conflicts and not force:
            raise OwnershipConflict.of(new.kind, new.metadata.name, conflicts)
    out = _as_stored(old, new, generation,
                     _record(entries, manager, changed, after, applied, status_written, now))
    return old if not (changed or status_changed) and out == old else out


def _as_stored(old: Resource, new: Resource, generation: int,
               managed: list[ManagedFieldsEntry]) -> Resource:
    """`new` as an update stores it: `old`'s uid and creation time, `generation`,
    and `managed` as its managedFields (none for a kind that records none)."""
    return _without_lease_fields(new.model_copy(update={"metadata": new.metadata.model_copy(
        update={"uid": old.metadata.uid,
                "creation_timestamp": old.metadata.creation_timestamp,
                "generation": generation,
                "managed_fields": managed})}))


def _status_time_moved(old: Resource, manager: str, now: datetime) -> list[ManagedFieldsEntry] | None:
    """`old`'s managedFields with `manager`'s status entry stamped `now`, when
    that entry exists as recorded today and holds the status alone; else None
    (the full bookkeeping decides)."""
    out = list(old.metadata.managed_fields)
    for i, e in enumerate(out):
        if (e.manager, e.operation, e.subresource) == (manager, "Update", "status"):
            if e.fields_v1 != {"f:status": {}}:
                return None
            out[i] = e.model_copy(update={"time": now})
            return out
    return None


def unchanged(old: Resource, stored: Resource) -> bool:
    """Whether `prepare_update` found nothing to write (the write changes
    nothing): the backend answers `old` as it is, with no new revision."""
    return stored is old


def apply_merge(current: Resource, manifest: Resource, manager: str, *,
                prune: bool = True, applied: frozenset[Path] | None = None) -> Resource:
    """Server-side-apply merge of `manifest` onto `current`, as `manager`
    (structured-merge-diff's merge and prune, on the fields hvfleet records):
    the spec leaves, labels and annotations the manifest names are set; those
    `manager` applied before (its Apply entry) and leaves out now are removed,
    unless another manager (or its own Update) owns them too; everything else
    is kept. Conflicts are found by the write (`prepare_update` with the
    manifest's `applied_fields`, or `applied` when the caller read them from
    the document as sent: `named_fields`)."""
    if applied is None:
        applied = applied_fields(manifest)
    entries = _entries(current)
    last = entries.get((manager, "Apply", ""), _Entry(manager, "Apply", "")).paths
    owned_by_others = set().union(
        *(e.paths for k, e in entries.items() if k != (manager, "Apply", "")))
    pruned = last - applied - owned_by_others if prune else set()
    desired = {p: v for p, v in (_spec_leaves(manifest) | owned_fields(manifest)).items() if p in applied}

    spec = copy.deepcopy(current.spec.model_dump(by_alias=True))
    maps: dict[str, dict[str, str]] = {a: dict(getattr(current.metadata, a)) for a in _META_MAPS}
    for path in pruned:
        if path[0] == "spec":
            _remove(spec, path[1:])
        else:
            maps[path[1]].pop(path[2], None)
    for path, value in desired.items():
        if path[0] == "spec":
            _place(spec, path[1:], value)
        else:
            maps[path[1]][path[2]] = value
    meta = current.metadata.model_copy(update=maps)
    return current.model_copy(update={"spec": type(current.spec).model_validate(spec),
                                      "metadata": meta})


def _place(doc: dict[str, Any], path: Path, value: Any) -> None:
    for part in path[:-1]:
        child = doc.get(part)
        if not isinstance(child, dict):
            child = doc[part] = {}
        doc = child
    doc[path[-1]] = value


def _remove(doc: dict[str, Any], path: Path) -> None:
    for part in path[:-1]:
        child = doc.get(part)
        if not isinstance(child, dict):
            return
        doc = child
    doc.pop(path[-1], None)


def taken_from_others(old: Resource, new: Resource, manager: str) -> list[tuple[str, str]]:
    """Every (field, owner) that writing `new` over `old` as `manager` changes
    while another manager owns it: what an Update takes over, and what an
    Apply conflicts on. A role that may not force may not take them either
    (hvfleet.server.auth)."""
    before, after = owned_fields(old), owned_fields(new)
    missing = object()
    changed = {p for p in set(before) | set(after)
               if before.get(p, missing) != after.get(p, missing)}
    return sorted((".".join(p), e.manager) for e in _entries(old).values()
                  if e.manager != manager and e.subresource == ""
                  for p in e.paths & changed)


def applied_after_edit(old: Resource, new: Resource, manager: str) -> frozenset[Path]:
    """An edit of some fields (the CLI's and the dashboard's spec edits) as an
    apply: what `manager` applied before and still holds, plus what the edit
    changes. Written with this set, the edit conflicts with other managers'
    fields as `hvfleet apply` would, and a field the edit drops is no longer
    `manager`'s."""
    entries = _entries(old)
    mine = entries.get((manager, "Apply", ""), _Entry(manager, "Apply", "")).paths
    before, after = owned_fields(old), owned_fields(new)
    missing = object()
    changed = {p for p in set(before) | set(after)
               if before.get(p, missing) != after.get(p, missing)}
    return frozenset((mine | changed) & set(after))
