"""Spec edits on one hypervisor or on every hypervisor a label selector matches,
all or nothing: `hvfleet overcommit set -l role=compute cpu=4` and the API's
equivalent call `edit_hosts`.

Every host's new spec is computed from one read (values are validated there),
and all of them are written with one `Store.write_all`, each as an apply of
the fields the edit changes (plus what the manager applied before,
`ownership.applied_after_edit`): the store checks each host's
resourceVersion and field ownership as `hvfleet apply` would, inside one
atomic step, so a bad value or a field another manager owns
on any host leaves every host untouched, and no reader ever sees some hosts
edited and others not. When a host changed between the read and the write
(StaleVersion), the whole edit is planned again from a fresh read.
"""

from __future__ import annotations

from collections.abc import Callable

from hvfleet.model.errors import NotFound
from hvfleet.model.hypervisor import Hypervisor
from hvfleet.model.selectors import Selector
from hvfleet.model.spec_edits import HostEdit
from hvfleet.store.base import StaleVersion, Store, Write, as_selector
from hvfleet.store.ownership import applied_after_edit

# Whole-edit retries after a concurrent write to one of the hosts.
MAX_ATTEMPTS = 20


def edit_hosts(
    store: Store,
    edit: HostEdit,
    manager: str,
    *,
    name: str | None = None,
    selector: Selector | str | None = None,
    force: bool = False,
    check: Callable[[Hypervisor, Hypervisor], None] | None = None,
) -> list[Hypervisor]:
    """Apply `edit` to hypervisor `name`, or to every hypervisor `selector`
    matches, all or nothing; returns the hosts as stored, by name (hosts the
    edit does not change are not written). NotFound when no hypervisor
    matches; InvalidInput, OwnershipConflict or Forbidden (from any host) with
    nothing written. `check(old, new)` is called on every host the edit
    changes before anything is written (the server authorizes there)."""
    sel = None if name is not None else as_selector(selector)
    last: StaleVersion | None = None
    for attempt in range(MAX_ATTEMPTS):
        hosts = [store.get_hypervisor(name)] if name is not None else store.list_hypervisors(sel)
        if not hosts:
            raise NotFound(f"no hypervisor matches selector {str(sel)!r}")
        writes = []
        for h in hosts:
            new = edit.apply(h)
            if new.spec != h.spec:
                if check is not None:
                    check(h, new)
                writes.append(Write("update", new, applied_after_edit(h, new, manager)))
        try:
            out = store.write_all(writes, manager, force=force)
        except StaleVersion as exc:
            last = exc
            store.pause_after_conflict(attempt)
            continue
        written = {o.metadata.name: o for o in out if isinstance(o, Hypervisor)}
        return [written.get(h.name, h) for h in hosts]
    assert last is not None
    raise last
