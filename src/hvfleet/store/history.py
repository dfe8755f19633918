"""Reading a kind as it was at an earlier revision, on any backend.

A list with `resourceVersionMatch=Exact` asks for the objects exactly as they
were at one revision. Every backend keeps a history of events and tells each
event's previous state (etcd from prev_kv, SQLite from its event log, the
remote store asks its server instead), so the state at revision R is
the current state with every object touched after R put back as it was
before its first event after R. A revision the history no longer covers is
Gone, as a watch from it is.
"""

from __future__ import annotations

from hvfleet.model.errors import Gone
from hvfleet.model.selectors import Selector
from hvfleet.store.base import ListResult, Store, WatchEvent, as_selector
from hvfleet.store.errors import RevisionNotReached

# Seconds a quiet store watch waits before the history is taken as read.
_QUIET = 0.2


def list_at(store: Store, kind: str, revision: int,
            selector: Selector | str | None = None) -> ListResult:
    """The objects of `kind` (matching `selector`) as they were at `revision`,
    which must not be newer than the store's current one (RevisionNotReached;
    `Store.list_at`; a backend without local history, the remote store, asks
    its server)."""
    current = store.list(kind)
    if revision > current.revision:
        raise RevisionNotReached(f"revision {revision} is newer than the store's {current.revision}")
    state = {o.metadata.name: o for o in current.items}
    if revision < current.revision:
        first: dict[str, WatchEvent] = {}
        for event in store.watch(kind, since=revision, timeout=_QUIET):
            if event.revision > current.revision:
                break
            first.setdefault(event.object.metadata.name, event)
            if event.revision == current.revision and event.last_of_revision:
                break
        for name, event in first.items():
            if not event.knows_previous:
                raise Gone(f"the state at revision {revision} is not known any more")
            before = event.previous()
            if before is None:
                state.pop(name, None)
            else:
                state[name] = before
    wanted = as_selector(selector)
    items = [state[n] for n in sorted(state) if wanted.matches(state[n].metadata.labels)]
    return ListResult(items, revision)
