"""A long-lived watch read by a thread of its own, and what it saw: for the
shared feeds' tests (store/feed.py on etcd and SQLite)."""

from __future__ import annotations

import threading
import time

from hvfleet.store.base import Store, WatchEvent

# (type, kind, name, revision, last_of_revision) of an event.
Seen = tuple[str, str, str, int, bool]


def seen_of(e: WatchEvent) -> Seen:
    return e.type, e.object.kind, e.object.metadata.name, e.revision, e.last_of_revision


class Watching:
    """A long-lived watch (no timeout: served by the feed) read by a thread,
    named `test-watch-KIND-NAME`."""

    def __init__(self, store: Store, kind: str | None, since: int, name: str | None = None) -> None:
        self.stop = threading.Event()
        self.seen: list[Seen] = []
        self.errors: list[BaseException] = []

        def run() -> None:
            try:
                for e in store.watch(kind, since=since, name=name, stop=self.stop):
                    self.seen.append(seen_of(e))
            except BaseException as exc:
                self.errors.append(exc)

        self.thread = threading.Thread(target=run, name=f"test-watch-{kind}-{name}", daemon=True)
        self.thread.start()

    def until(self, count: int, seconds: float = 15) -> list[Seen]:
        deadline = time.monotonic() + seconds
        while len(self.seen) < count and not self.errors and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.seen

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
