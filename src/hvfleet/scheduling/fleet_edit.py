"""Spec edits on one hypervisor or on every hypervisor a label selector matches,
all or nothing: `hvfleet overcommit set -l role=compute cpu=4` and the API's
equivalent call `edit_hosts`.

Every host's new spec is computed and checked first (values, and each host's
field ownership exactly as a single-host write checks it, in
`store.ownership.prepare_update`), so a bad value or a field another manager
owns on any host leaves every host untouched. The writes themselves go through
`write_all`, the one place that knows how several objects are written
together. Until the Store contract has an atomic multi-object write, it writes
each with compare-and-swap and, if one fails (a concurrent writer), puts the
ones already written back to their previous spec and retries the whole edit
from a fresh read; readers may see the partial state for that moment. When the
Store gains its multi-object write, `write_all` becomes that one call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import UTC, datetime

from hvfleet.model.errors import HvfleetError, NotFound
from hvfleet.model.hypervisor import Hypervisor
from hvfleet.model.selectors import Selector
from hvfleet.model.spec_edits import SpecEdit
from hvfleet.store.base import StaleVersion, Store, as_selector
from hvfleet.store.ownership import prepare_update

# Whole-edit retries after a concurrent write to one of the hosts.
MAX_ATTEMPTS = 20


def write_all(store: Store, pairs: Sequence[tuple[Hypervisor, Hypervisor]], manager: str,
              force: bool) -> list[Hypervisor]:
    """Write every (old, new) pair or none: new objects carry the old
    resourceVersion. On a failure the ones written are put back (their spec as
    read) before the error propagates."""
    written: list[tuple[Hypervisor, Hypervisor]] = []
    try:
        for old, new in pairs:
            out = store.update(new, manager, force=force)
            assert isinstance(out, Hypervisor)
            written.append((old, out))
    except HvfleetError:
        for old, out in reversed(written):
            # Compare-and-swap on what we wrote: a later writer's change is kept.
            undo = out.model_copy(update={"spec": old.spec})
            # Best effort: the error that stopped the edit is what counts.
            with contextlib.suppress(HvfleetError):
                store.update(undo, manager, force=force)
        raise
    return [out for _, out in written]


def edit_hosts(
    store: Store,
    edit: SpecEdit,
    manager: str,
    *,
    name: str | None = None,
    selector: Selector | str | None = None,
    force: bool = False,
) -> list[Hypervisor]:
    """Apply `edit` to hypervisor `name`, or to every hypervisor `selector`
    matches, all or nothing; returns the written hosts by name. NotFound when no
    hypervisor matches; InvalidInput, OwnershipConflict or Forbidden (from any
    host) before anything is written."""
    sel = None if name is not None else as_selector(selector)
    last: StaleVersion | None = None
    for attempt in range(MAX_ATTEMPTS):
        hosts = [store.get_hypervisor(name)] if name is not None else store.list_hypervisors(sel)
        if not hosts:
            raise NotFound(f"no hypervisor matches selector {str(sel)!r}")
        now = datetime.now(UTC)
        pairs = []
        for h in hosts:
            new = edit.apply(h)
            prepare_update(h, new, manager, force=force, now=now)  # checks only; raises for any host
            if new.spec != h.spec:
                pairs.append((h, new))
        try:
            written = {h.name: h for h in write_all(store, pairs, manager, force)}
        except StaleVersion as exc:
            last = exc
            store.pause_after_conflict(attempt)
            continue
        return [written.get(h.name, h) for h in hosts]
    assert last is not None
    raise last
