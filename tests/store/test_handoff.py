"""Hand-offs from the etcd feed's thread go out once per burst read
(`hvfleet.store.handoff`): within a batch, loop wake-ups and queue puts are
held, in order, until the stream's reader is about to wait for more
(`chunked_lines` flushes then), one `call_soon_threadsafe` per event loop;
outside a batch they go at once. The feed's joined watches and the API's
watch fan-out are handed a burst only when the feed has handled all of it."""

from __future__ import annotations

import asyncio
import io
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hvfleet.model import Hypervisor
from hvfleet.server.watch import KindFanout
from hvfleet.store import handoff, open_store
from hvfleet.store.base import WatchEvent
from hvfleet.store.etcd_watch import chunked_lines
from hvfleet.store.feed import Interest, SharedFeed


class CountingLoop(asyncio.SelectorEventLoop):
    """A real event loop that counts the wake-ups asked of it from other threads."""

    def __init__(self) -> None:
        super().__init__()
        self.woken = 0

    def call_soon_threadsafe(self, callback: Callable[..., object], *args: Any,  # type: ignore[override]
                             context: Any = None) -> asyncio.Handle:
        self.woken += 1
        return super().call_soon_threadsafe(callback, *args, context=context)


@pytest.fixture
def loop() -> Iterator[CountingLoop]:
    """A CountingLoop running on a thread of its own (not the test's)."""
    lp = CountingLoop()
    runner = threading.Thread(target=lp.run_forever, name="test-loop", daemon=True)
    runner.start()
    try:
        yield lp
    finally:
        lp.call_soon_threadsafe(lp.stop)
        runner.join(10)
        lp.close()


def _on_loop(lp: CountingLoop, fn: Callable[[], Any]) -> Any:
    """`fn()` run on the loop's thread, its result handed back."""
    done: list[Any] = []
    ran = threading.Event()

    def call() -> None:
        done.append(fn())
        ran.set()

    super(CountingLoop, lp).call_soon_threadsafe(call)  # not counted
    assert ran.wait(10)
    return done[0]


def test_outside_a_batch_each_hand_off_goes_at_once(loop: CountingLoop) -> None:
    ran: list[int] = []
    handoff.defer(ran.append, 1)
    assert ran == [1]
    before = loop.woken
    handoff.call_soon_threadsafe(loop, ran.append, 2)
    assert loop.woken == before + 1
    _on_loop(loop, lambda: None)  # after what was queued before it
    assert ran == [1, 2]


def test_within_a_batch_hand_offs_wait_for_the_flush_in_order_one_wake_up_per_loop(
        loop: CountingLoop) -> None:
    ran: list[str] = []
    on_loop: list[str] = []
    before = loop.woken
    with handoff.batch():
        for i in range(3):
            handoff.defer(ran.append, f"put{i}")
            handoff.call_soon_threadsafe(loop, on_loop.append, f"wake{i}")
        with handoff.batch():  # an inner batch leaves the flushing to the outer one
            handoff.defer(ran.append, "inner")
        assert ran == [] and loop.woken == before
        handoff.flush()
        assert ran == ["put0", "put1", "put2", "inner"]
        assert loop.woken == before + 1  # the three wake-ups as one
        _on_loop(loop, lambda: None)
        assert on_loop == ["wake0", "wake1", "wake2"]
        handoff.defer(ran.append, "last")
        assert ran[-1] != "last"
    assert ran[-1] == "last"  # the batch's end flushes


def test_a_closed_loop_is_skipped_at_the_flush() -> None:
    closed = asyncio.new_event_loop()
    closed.close()
    ran: list[int] = []
    with handoff.batch():
        handoff.call_soon_threadsafe(closed, ran.append, 1)
        handoff.defer(ran.append, 2)
    assert ran == [2]
    with pytest.raises(RuntimeError):  # outside a batch, as asyncio says it
        handoff.call_soon_threadsafe(closed, ran.append, 3)


def _chunk(line: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(line), line)


def test_the_stream_reader_flushes_when_it_has_handled_every_line_read_and_not_before() -> None:
    """Three lines come in one read, a fourth later: what was handed over for
    the first three goes out once the third is handled, before the reader
    waits for the fourth, and not after each line."""
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"".join(_chunk(b"line %d\n" % i) for i in range(3)))
        threading.Timer(0.3, lambda: a.sendall(_chunk(b"line 3\n") + b"0\r\n\r\n")).start()
        ran: list[int] = []
        seen: list[list[int]] = []  # what had gone out when each line came
        with handoff.batch():
            for i, line in enumerate(chunked_lines(io.BufferedReader(socket.SocketIO(b, "rb")))):
                assert line == b"line %d\n" % i
                seen.append(list(ran))
                handoff.defer(ran.append, i)
    assert seen == [[], [], [], [0, 1, 2]]
    assert ran == [0, 1, 2, 3]


def test_the_reader_flushes_before_it_waits_for_the_rest_of_a_long_message() -> None:
    """A long catch-up message is read whole in one call: what was handed over
    for the lines before it goes out before that read waits for the socket."""
    a, b = socket.socketpair()
    with a, b:
        long_line = b"x" * (600 << 10) + b"\n"
        whole = _chunk(b"one\n") + _chunk(b"two\n") + _chunk(long_line) + b"0\r\n\r\n"
        cut = len(_chunk(b"one\n") + _chunk(b"two\n")) + 1000  # into the long chunk
        ran: list[int] = []
        when_long_came: list[list[int]] = []

        def send() -> None:
            a.sendall(whole[:cut])
            time.sleep(0.3)
            a.sendall(whole[cut:])

        sender = threading.Thread(target=send)
        sender.start()
        with handoff.batch():
            for i, line in enumerate(chunked_lines(io.BufferedReader(socket.SocketIO(b, "rb")))):
                if line == long_line:
                    when_long_came.append(list(ran))
                handoff.defer(ran.append, i)
        sender.join()
    assert when_long_came == [[0, 1]]
    assert ran == [0, 1, 2]


def _event(revision: int) -> WatchEvent:
    host = Hypervisor.model_validate({"metadata": {"name": f"hv{revision}"}})
    return WatchEvent("MODIFIED", host, revision)


def test_the_feed_hands_a_burst_to_a_waiting_watch_once_it_has_handled_all_of_it() -> None:
    queued_before_flush: list[int] = []
    release = threading.Event()
    inboxes: list[Any] = []

    def stream(since: int, stop: threading.Event, on_undecodable: Any, inline: Any,
               on_progress: Any) -> Iterator[WatchEvent]:
        for revision in (since + 1, since + 2, since + 3):  # one read's worth
            yield _event(revision)
        queued_before_flush.append(sum(q.qsize() for q in inboxes))
        handoff.flush()  # as chunked_lines does before it waits for more
        release.wait(10)

    feed = SharedFeed(stream)
    try:
        joined = feed._join(Interest("Hypervisor"), 0)
        assert joined is not None
        inboxes.append(joined.inbox)
        deadline = time.monotonic() + 10
        while joined.inbox.qsize() < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert queued_before_flush == [0]  # nothing handed over while the burst was read
        got = [joined.inbox.get(timeout=1) for _ in range(3)]
        assert [[e.revision for e in g] for g in got] == [[1], [2], [3]]  # each revision, in order
    finally:
        release.set()
        feed.close()


def test_the_api_fan_out_wakes_a_watchers_loop_once_per_burst(tmp_path: Path, loop: CountingLoop) -> None:
    with open_store(f"sqlite:///{tmp_path}/w.db") as store:
        fanout = KindFanout(store, "Hypervisor", 100)
        try:
            sub, _, _ = _on_loop(loop, lambda: fanout.subscribe(0, None, 1000, loop))
            before = loop.woken
            with handoff.batch():  # the feed's thread, reading a burst of five revisions
                for revision in range(1, 6):
                    fanout._take([_event(revision)])
                assert loop.woken == before  # not yet: the burst is not all handled
            assert loop.woken == before + 1

            async def batch() -> list[int]:
                events, _ = await sub.next_batch(5.0)
                return [e.revision for e in events]

            got = asyncio.run_coroutine_threadsafe(batch(), loop).result(10)
            assert got == [1, 2, 3, 4, 5]
        finally:
            fanout.close()
