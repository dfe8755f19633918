"""Applying manifests: parsing them, planning each object, writing them atomically.

This is the one home of `apply` for every edge (the CLI's `apply -f`, the
API's server-side apply):
- `load_manifests(text, source)` parses and validates YAML/JSON documents
  (a `List` is unrolled) before anything is written;
- `plan_one(current, manifest, manager)` is the pure planning of one object:
  server-side-apply merge of the manifest's spec leaves, labels and
  annotations onto what is stored (`hvfleet.store.ownership.apply_merge`:
  fields the manager applied before and left out are removed unless someone
  else owns them too, others' fields kept), written as an Apply of the
  manifest's fields (`Write.applied`: conflicts with other managers' fields
  are the write's), CAS on the manifest's resourceVersion if it names one,
  else on the stored one;
- `apply_manifests(store, manifests, manager, force=)` plans every document
  against the store and writes them with one `Store.write_all`: all or
  nothing. When an object changed between the read and the write, and no
  manifest pinned a resourceVersion, it plans again (as kubectl apply would
  just re-apply); a pinned stale version is the caller's Conflict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from hvfleet.model.errors import AlreadyExists, InvalidInput, NotFound, TooLarge
from hvfleet.model.hypervisor import KINDS, Resource
from hvfleet.model.kinds import strategy, strategy_of
from hvfleet.model.meta import API_VERSION, validation_message
from hvfleet.store.base import FieldPath, StaleVersion, Store, Write
from hvfleet.store.errors import ClaimRequired as ClaimRequired  # its home; importable from here
from hvfleet.store.ownership import applied_fields, apply_merge

MAX_MANIFEST_BYTES = 4 * 1024 * 1024
# Re-plans after a concurrent change before the Conflict is the caller's.
APPLY_ATTEMPTS = 20


@dataclass(frozen=True)
class Applied:
    """What apply did to one object, in kubectl's words: "unchanged" when the
    manifest said nothing new (the store kept the object and its version)."""

    action: Literal["created", "configured", "unchanged"]
    object: Resource


def load_manifests(text: str, source: str) -> list[Resource]:
    """Parse and validate every document before anything is written."""
    if len(text.encode()) > MAX_MANIFEST_BYTES:
        raise TooLarge(f"{source}: larger than {MAX_MANIFEST_BYTES} bytes")
    # Here, not at the top: only apply reads YAML (CLI start-up).
    from hvfleet.model.documents import DocumentError, load_yaml_all

    try:
        # No aliases or anchors, bounded depth: the one YAML reader of every edge.
        docs = load_yaml_all(text)
    except DocumentError as exc:
        raise InvalidInput(f"{source}: {exc}") from None
    out: list[Resource] = []
    for i, doc in enumerate(docs, 1):
        what = f"{source}: document {i}"
        if not isinstance(doc, dict):
            raise InvalidInput(f"{what}: expected a mapping with apiVersion and kind")
        items = doc.get("items") if doc.get("kind") == "List" else [doc]
        for item in items or []:
            out.append(_manifest(item, what))
    names = [(o.kind, o.metadata.name) for o in out]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        kind, name = sorted(dupes)[0]
        raise InvalidInput(f"{source}: {kind} {name} appears more than once")
    return out


def _manifest(item: Any, what: str) -> Resource:
    if not isinstance(item, dict):
        raise InvalidInput(f"{what}: list item is not a mapping")
    if item.get("apiVersion") != API_VERSION:
        raise InvalidInput(
            f"{what}: apiVersion: expected {API_VERSION!r}, got {item.get('apiVersion')!r}"
        )
    kind = item.get("kind")
    if kind not in KINDS:
        raise InvalidInput(f"{what}: kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    name = (item.get("metadata") or {}).get("name", "?")
    try:
        from hvfleet.model.documents import without_nulls

        manifest: Resource = strategy(kind).decode(without_nulls(item))
        return manifest
    except ValidationError as exc:
        raise InvalidInput(validation_message(exc, f"{what} ({kind} {name})")) from None


def plan_one(current: Resource | None, manifest: Resource, manager: str, *,
             prune: bool = True, applied: frozenset[FieldPath] | None = None) -> Write:
    """What applying `manifest` as `manager` writes over `current` (None: absent);
    `prune=False` sets what the manifest names and removes nothing. `applied`:
    the fields the configuration names, when read from the document as sent
    (server-side apply of a partial one); else the manifest's own.

    Pure: the ownership conflicts and the version check happen in the write
    (`Store.write_all`, `Store.update`), against the state it lands on."""
    if current is None:
        if strategy_of(manifest).claimed:
            # Only the claim re-checks free capacity in the same atomic write, so
            # apply must not bypass it.
            raise ClaimRequired(
                f"Reservation {manifest.metadata.name}: a new reservation must be claimed, "
                "which checks free capacity atomically; apply only updates existing ones"
            )
        return Write("create", manifest, applied_fields(manifest))
    rv = manifest.metadata.resource_version or current.metadata.resource_version
    if applied is None:
        applied = applied_fields(manifest)
    merged = apply_merge(current, manifest, manager, prune=prune, applied=applied)
    meta = merged.metadata.model_copy(update={"resource_version": rv})
    merged = merged.model_copy(update={"metadata": meta})
    if strategy_of(manifest).status_applied and "status" in manifest.model_fields_set:
        # Only a status the manifest gives: `hvfleet export` writes none, and
        # applying its output back must leave a Released claim released.
        merged = merged.model_copy(update={"status": strategy_of(manifest).status_of(manifest)})
    return Write("update", merged, applied)


def plan_apply(store: Store, manifests: Sequence[Resource], manager: str) -> list[Write]:
    """Every manifest planned against what the store holds now."""
    plan: list[Write] = []
    for m in manifests:
        try:
            current: Resource | None = store.get(m.kind, m.metadata.name)
        except NotFound:
            current = None
        plan.append(plan_one(current, m, manager))
    return plan


def _action(write: Write, stored: Resource) -> Literal["created", "configured", "unchanged"]:
    if write.action == "create":
        return "created"
    # A write that changes nothing is no write: the store keeps the version it had.
    same = stored.metadata.resource_version == write.object.metadata.resource_version
    return "unchanged" if same else "configured"


def apply_manifests(
    store: Store, manifests: Sequence[Resource], manager: str, *, force: bool = False
) -> list[Applied]:
    """Apply every manifest, all or nothing (see the module docstring)."""
    pinned = any(m.metadata.resource_version for m in manifests)
    for attempt in range(APPLY_ATTEMPTS):
        plan = plan_apply(store, manifests, manager)
        try:
            written = store.write_all(plan, manager, force=force)
        except (StaleVersion, AlreadyExists, NotFound):
            # Something changed between the plan's reads and the write. Only a
            # version the manifest itself named makes that the caller's conflict.
            if pinned or attempt == APPLY_ATTEMPTS - 1:
                raise
            store.pause_after_conflict(attempt)
            continue
        return [Applied(_action(w, obj), obj) for w, obj in zip(plan, written, strict=True)]
    raise AssertionError("unreachable")
