"""An object kept current from one long store stream, in a thread: the fleet
index (`FleetIndex.follow_stream`) and the Placement snapshot
(`ProviderSnapshot.follow`) follow alike. Each event is applied under the
object's lock; the object's `revision` moves, and its waiters are woken, only
at the end of a revision (one atomic write's events share it) or when the
stream reports progress (a write beside the objects: every event before it
applied). Compacted history loads the object again from the store; any other
failure (the store down) is logged and followed again after a pause."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Protocol

from hvfleet.model.errors import Gone
from hvfleet.store.base import Store, WatchEvent

log = logging.getLogger(__name__)

# The pause before following again after the store failed.
RETRY_S = 0.5


class Followed(Protocol):
    revision: int

    def load_from(self, store: Store) -> None: ...


def follow_in_thread(
    target: Followed,
    seen: threading.Condition,
    store: Store,
    stop: threading.Event,
    events: Callable[[int, Callable[[int], None]], Iterator[WatchEvent]],
    apply: Callable[[WatchEvent], None],
    name: str,
) -> threading.Thread:
    """Start a thread that applies `events(since, on_progress)` to `target`
    until `stop` is set. `seen` is the condition over `target`'s lock: held
    while an event is applied, notified when `target.revision` moves."""

    def progressed(revision: int) -> None:
        with seen:
            if revision > target.revision:
                target.revision = revision
                seen.notify_all()

    def run() -> None:
        while not stop.is_set():
            try:
                for event in events(target.revision, progressed):
                    with seen:
                        apply(event)
                        if event.last_of_revision:  # not before: one atomic write's events share it
                            target.revision = max(target.revision, event.revision)
                            seen.notify_all()
            except Gone:
                with seen:
                    target.load_from(store)
                    seen.notify_all()
            except Exception:  # the store is down: follow again after a pause
                log.warning("%s: following the store failed", name, exc_info=True)
                stop.wait(RETRY_S)

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    return t
