"""Hand-offs from a store's reading thread, sent once it has handled all it read.

The shared etcd feed reads its stream a burst at a time (every revision that
came within `--follow-pace`) and hands each revision to the watches on its
own thread. A watch served elsewhere is then woken: an API watcher's event
loop with `call_soon_threadsafe`, a watch with a thread of its own by a put
into its queue. Woken per revision, the woken thread competes for the GIL with
the feed thread that is still working through the burst, and is woken again
for the next revision once it has taken the first; on this project's 2-core
machine a wake-up costs the woken thread 90-170 µs of CPU (a bare
`time.sleep(0.01)` costs 88 µs there: `bench/wakeups.py`, docs/scaling.md
item 21).

Within a `batch` (the feed's thread, for as long as it reads), `call_soon_threadsafe`
and `defer` keep the hand-off instead: one call per event loop and the queue
puts, in the order they were made, are sent by `flush`, which the stream's
reader calls just before it waits for more (`etcd_watch.chunked_lines`).
Everything handed over within a burst then goes out at its end: each
consumer is woken once per burst, after the feed thread is done with it.
Outside a batch both send at once, so any other thread is unaffected.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

_local = threading.local()

_Call = tuple[Callable[..., Any], tuple[Any, ...]]


class _Pending:
    __slots__ = ("calls", "loops")

    def __init__(self) -> None:
        self.loops: dict[asyncio.AbstractEventLoop, list[_Call]] = {}
        self.calls: list[_Call] = []  # in the order `defer` was asked


def _pending() -> _Pending | None:
    return getattr(_local, "pending", None)


def call_soon_threadsafe(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """`loop.call_soon_threadsafe(fn, *args)`, at the batch's next flush when
    this thread is in one (then a closed loop is skipped there); at once
    otherwise (then a closed loop raises RuntimeError, as asyncio does)."""
    pending = _pending()
    if pending is None:
        loop.call_soon_threadsafe(fn, *args)
    else:
        pending.loops.setdefault(loop, []).append((fn, args))


def defer(fn: Callable[..., Any], *args: Any) -> None:
    """`fn(*args)` on this thread at the batch's next flush when it is in one
    (a wake-up of another thread, such as a queue put); at once otherwise."""
    pending = _pending()
    if pending is None:
        fn(*args)
    else:
        pending.calls.append((fn, args))


def flush() -> None:
    """Send what this thread's batch holds (nothing outside a batch)."""
    pending = _pending()
    if pending is None or not (pending.loops or pending.calls):
        return
    _local.pending = _Pending()
    for fn, args in pending.calls:
        fn(*args)
    for loop, calls in pending.loops.items():
        with contextlib.suppress(RuntimeError):  # the loop closed: whoever it served is gone
            loop.call_soon_threadsafe(_run, calls)


def _run(calls: list[_Call]) -> None:
    for fn, args in calls:
        fn(*args)


@contextlib.contextmanager
def batch() -> Iterator[None]:
    """Hold this thread's hand-offs until each `flush`, and flush at the end."""
    if _pending() is not None:  # already in one: the outer batch flushes
        yield
        return
    _local.pending = _Pending()
    try:
        yield
    finally:
        try:
            flush()
        finally:
            _local.pending = None
