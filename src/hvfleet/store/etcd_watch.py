"""Watching a key range of etcd over the JSON gateway's streaming HTTP.

`watch_range` yields every event after a revision, in order, and resumes on
the next endpoint from the last revision delivered when a stream breaks (a
member dies, loses its leader, or the connection drops), so a consumer sees
each event exactly once. Compacted history is Gone; an outage longer than the
transport's `unavailable_after` is Unavailable (unless the watch has an idle
timeout, which then ends it). `_WatchStream` is one stream, read by a thread,
or, for a watch without a timeout that is stopped by closing its stream (the
shared feed, `inline`), read by the consuming thread itself: one thread
hand-off less per event, which on a loaded machine costs more than parsing it.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import math
import os
import queue
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from hvfleet.model.errors import Gone
from hvfleet.model.hypervisor import Resource
from hvfleet.store import handoff
from hvfleet.store.base import EventType, Stored, WatchEvent
from hvfleet.store.etcd_transport import EtcdTransport, KeyValue, b64, unb64
from hvfleet.store.undecodable import Undecodable, skipped

# A watch with a timeout waits at least this long for etcd to send the history
# it asked for (etcd syncs lagging watchers every 100 ms).
CATCH_UP_GRACE_S = 0.5

# A value's object: decoded, or (a value the store can vouch for) left to decode on first use.
DecodeKv = Callable[[KeyValue], Resource | Stored]

# The longest chunk-size line read (hex size, extensions, CRLF).
_CHUNK_HEAD_MAX = 1024


def watch_range(
    transport: EtcdTransport,
    start: str,
    end: str,
    since: int,
    decode: DecodeKv,
    *,
    stop: threading.Event | None = None,
    timeout: float | None = None,
    on_undecodable: Callable[[Undecodable], None] | None = None,
    log_skipped: bool = True,
    inline: Callable[[Callable[[], None]], None] | None = None,
    within: str | None = None,
    on_progress: Callable[[int], None] | None = None,
    pace: float = 0.0,
    hurry: Hurry | threading.Event | None = None,
) -> Iterator[WatchEvent]:
    """Events on keys in [start, end) with revision > since. With a `timeout`,
    history up to the revision the watch was created at is delivered first:
    until it has been, the idle timer is at least CATCH_UP_GRACE_S, as etcd
    sends the history asynchronously. Without `log_skipped`, an undecodable
    object is only handed to `on_undecodable` (the shared feed: each watch it
    serves logs and counts it, as its own stream would). With `inline`, the
    stream is read in the consuming thread (no timeout then) and `inline` is
    given each stream's abort (what unblocks that read when `stop` is set).
    With `within`, only the events of keys starting with it are decoded and
    yielded, the others dropped by their key (the range is wider: the writes
    beside the objects move the store's revision too); a revision with none
    of them is handed to `on_progress` once every event before it has been
    yielded, so a reader waiting for a revision knows it has it. `pace` and
    `hurry`: see `chunked_lines`."""
    assert inline is None or timeout is None
    keep = None if within is None else within.encode()
    last = since
    idle_base = time.monotonic()
    created_at: int | None = None  # store revision when the current stream began
    down_since: float | None = None
    last_error = ""
    tried = 0
    endpoints = transport.endpoints

    def stopped() -> bool:
        return stop is not None and stop.is_set()

    def idle_deadline() -> float | None:
        if timeout is None:
            return None
        caught_up = created_at is not None and last >= created_at
        return idle_base + (timeout if caught_up else max(timeout, CATCH_UP_GRACE_S))

    def idle() -> bool:
        deadline = idle_deadline()
        return deadline is not None and time.monotonic() >= deadline

    while not stopped() and not idle():
        index = transport.current
        endpoint = endpoints[index]
        try:
            stream = _WatchStream(endpoint, start, end, last + 1, transport.request_timeout,
                                  threaded=inline is None, pace=pace, hurry=hurry)
            if inline is not None:
                inline(stream.abort)
        except OSError as exc:
            stream = None
            last_error = f"{endpoint}: {exc}"
        if stream is not None:
            opened_at = time.monotonic()
            # This stream starts after `floor`: nothing at or below it is new. (Not
            # `last`: one atomic write's events share a revision.)
            floor = last
            try:
                for msg in stream.messages(stopped, idle_deadline):
                    if msg.get("created"):
                        created_at = int(msg.get("header", {}).get("revision", 0))
                        continue
                    if msg.get("canceled"):
                        compacted = int(msg.get("compact_revision", 0))
                        if compacted:
                            raise Gone(
                                f"watch: revision {last} was compacted (history starts at "
                                f"{compacted}); list again and watch from the list's revision"
                            )
                        last_error = f"{endpoint}: {msg.get('cancel_reason', 'watch canceled')}"
                        break
                    # etcd never splits one revision's events over two messages.
                    raw: list[Any] = msg.get("events", [])
                    if keep is not None and raw:
                        raw = _within(raw, keep)
                    for i, ev in enumerate(raw):
                        if isinstance(ev, int):  # a revision with nothing within
                            if ev > floor:
                                last = ev
                                if on_progress is not None:
                                    on_progress(ev)
                            continue
                        after = raw[i + 1] if i + 1 < len(raw) else None
                        following = after["kv"] if isinstance(after, dict) else None
                        try:
                            event = _event(ev, decode, following)
                        except Undecodable as exc:
                            revision = int(ev.get("kv", {}).get("mod_revision", 0))
                            if revision > floor:
                                last = revision
                                if log_skipped:
                                    skipped(exc, "watch")
                                if on_undecodable is not None:
                                    on_undecodable(exc)
                            continue
                        if event.revision <= floor:
                            continue  # already delivered before a reconnect
                        last = event.revision
                        idle_base = time.monotonic()
                        down_since, tried = None, 0
                        yield event
                else:
                    if stream.error is None:
                        return  # stopped or idle timeout
                    last_error = f"{endpoint}: {stream.error}"
            finally:
                stream.close()
        if stopped():
            return
        # The stream broke: another endpoint, from the last revision delivered.
        # A stream that was up for a while starts a new outage; one that breaks
        # right after it was created (e.g. "no leader") continues the old one.
        now = time.monotonic()
        if stream is not None and now - opened_at > transport.unavailable_after:
            down_since, tried = None, 0
        if down_since is None:
            down_since = now
        elif timeout is None and time.monotonic() - down_since > transport.unavailable_after:
            raise transport.unavailable(f"watch from revision {last}", last_error)
        transport.move_on(index)
        tried += 1
        if tried % len(endpoints) == 0:
            pause = min(0.05 * 2 ** (tried // len(endpoints)), 1.0)
            if stop is not None:
                stop.wait(pause)
            else:
                time.sleep(pause)


def _within(raw: list[dict[str, Any]], keep: bytes) -> list[Any]:
    """The events of `raw` on keys starting with `keep` (told by the key alone,
    before any decode), in order, and after the events of each revision none
    of whose events is one of them, that revision (an int)."""
    out: list[Any] = []
    dropped: int | None = None  # the revision of the events dropped last, while none of it is kept
    for ev in raw:
        kv = ev["kv"]
        at = int(kv.get("mod_revision", 0))
        if dropped is not None and dropped != at:
            out.append(dropped)
            dropped = None
        if unb64(kv["key"]).startswith(keep):
            out.append(ev)
            dropped = None
        elif not out or isinstance(out[-1], int) or int(out[-1]["kv"].get("mod_revision", 0)) != at:
            dropped = at
    if dropped is not None:
        out.append(dropped)
    return out


def _event(ev: dict[str, Any], decode: DecodeKv, following: dict[str, Any] | None) -> WatchEvent:
    kv = KeyValue.from_json(ev["kv"])
    last_of_revision = (
        following is None or int(following.get("mod_revision", 0)) != kv.mod_revision
    )
    etype: EventType
    # prev_kv is the key's value just before the event (etcd keeps it through a
    # compaction, as the key's latest version): read and decoded only if asked for.
    raw_prev = ev.get("prev_kv")
    before = None if not raw_prev else _Previous(raw_prev, decode)
    if ev.get("type") == "DELETE":
        # A delete carries no value: the object is the last one stored (prev_kv).
        etype = "DELETED"
        assert raw_prev
        prev = KeyValue.from_json(raw_prev)
        obj = decode(KeyValue(kv.key, prev.value, kv.mod_revision, prev.create_revision, 0))
    else:
        etype = "ADDED" if kv.version == 1 else "MODIFIED"
        obj = decode(kv)
    return WatchEvent(
        type=etype, object=obj, revision=kv.mod_revision, last_of_revision=last_of_revision,
        before=None if etype == "ADDED" else before,
    )


class _Previous:
    """An event's previous object, decoded on the first call (most events are
    never asked: only label-selected watches look back)."""

    __slots__ = ("_decode", "_obj", "_raw")

    def __init__(self, raw: dict[str, Any], decode: DecodeKv) -> None:
        self._raw: dict[str, Any] | None = raw
        self._decode = decode
        self._obj: Resource | None = None

    def __call__(self) -> Resource:
        if self._raw is not None:
            got = self._decode(KeyValue.from_json(self._raw))  # Undecodable: raised on each call
            self._obj = got.decoded() if isinstance(got, Stored) else got
            self._raw = None
        assert self._obj is not None
        return self._obj


class Hurry:
    """The flag that ends a paced reader's pause (`chunked_lines`) when set: a
    reader waiting for a revision sets it (`EtcdStore.follow_now`). A
    `threading.Event` says the same, but its timed wait (a lock acquired with a
    timeout, under a Condition) cost the feed's thread 135-145 µs of CPU per
    pause on this project's 2-core machine, and this wait, a pipe polled with
    the pause as timeout, 87-97 µs (a bare `time.sleep` 80): one pause per
    burst read (docs/scaling.md, item 21). The pipe is made at the first wait
    (only a paced feed waits) and closed by `close`."""

    def __init__(self) -> None:
        self._set = False
        self._pipe: tuple[int, int] | None = None
        self._poll: select.poll | None = None
        self._lock = threading.Lock()  # the pipe's making and closing
        self._closed = False

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        pipe = self._pipe
        if pipe is not None:
            with contextlib.suppress(OSError):  # full (it cannot be: one byte per set) or closed
                os.write(pipe[1], b"!")

    def is_set(self) -> bool:
        return self._set

    def clear(self) -> None:
        self._set = False  # before the drain: a set() after it leaves its byte
        pipe = self._pipe
        if pipe is not None:
            with contextlib.suppress(OSError):  # BlockingIOError: nothing to drain
                os.read(pipe[0], 64)

    def wait(self, timeout: float) -> bool:
        """Until set or `timeout` seconds passed; whether it is set."""
        if self._set:
            return True
        with self._lock:
            if self._closed:  # its store is closing: no pause, and no new pipe
                return self._set
            if self._poll is None:
                r, w = os.pipe()
                os.set_blocking(r, False)
                os.set_blocking(w, False)
                self._poll = select.poll()
                self._poll.register(r, select.POLLIN)
                self._pipe = (r, w)
            waiter = self._poll
        if not self._set:  # again: a set() before the pipe was made wrote nothing
            waiter.poll(max(0, math.ceil(timeout * 1000)))
        return self._set

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pipe, self._pipe, self._poll = self._pipe, None, None
        if pipe is not None:
            for fd in pipe:
                os.close(fd)


def chunked_lines(fp: io.BufferedIOBase, pace: float = 0.0,
                  hurry: Hurry | threading.Event | None = None) -> Iterator[bytes]:
    """The lines of a chunked HTTP body read from `fp` (each with its newline;
    the last one maybe without), until the last chunk or the end of `fp`.
    The gateway sends a watch as a chunked body of one JSON message per line.
    The body is read in the largest pieces at hand (`read1`: what is buffered,
    else one `recv`) and its chunks are cut out of them with bytes methods:
    `HTTPResponse.readline`'s chunked path (peek, chunk bookkeeping) is all
    Python and took a quarter of the feed thread's CPU per followed event.

    With `pace` (seconds), a read that would wait for the socket is made at
    most once per `pace` after the last read that emptied it: while messages
    come faster than that, each read takes all that came meanwhile, so the
    reader (and whoever it wakes) is woken once per several messages instead
    of once per message; a message after a quiet spell is read at once, one
    during a busy spell up to `pace` late. Setting `hurry` ends the pause at
    once (a reader waits for a revision: see `EtcdStore.follow_now`).
    ValueError when a chunk header is not one."""
    buf = b""  # read, not yet cut into chunks
    at = 0  # where the next chunk header starts in buf
    pending = b""  # the start of a line whose end is in a later chunk
    drained_at = float("-inf")  # when a read last emptied the socket
    want = 1 << 18
    while True:
        # Every complete chunk in buf.
        while True:
            eol = buf.find(b"\r\n", at)
            if eol < 0:
                if len(buf) - at > _CHUNK_HEAD_MAX:
                    raise ValueError(f"a chunk header longer than {_CHUNK_HEAD_MAX} bytes")
                break
            size = int(buf[at:eol].split(b";", 1)[0], 16)
            if not size:  # the last chunk
                if pending:
                    yield pending
                return
            missing = eol + 2 + size + 2 - len(buf)
            if missing > want:
                # A large chunk (a long catch-up message): the rest of it in
                # one read, not in pieces each joined to all read before.
                handoff.flush()  # it waits for the socket: what was handed over goes now
                rest = fp.read(missing)
                buf, at = buf[at:] + rest, 0
                if len(rest) < missing:  # the end of fp within the chunk
                    if pending:
                        yield pending
                    return
                continue
            if missing > 0:
                break  # the chunk is not all here yet
            data = buf[eol + 2:eol + 2 + size]
            at = eol + 2 + size + 2
            if pending:
                data, pending = pending + data, b""
            first = 0
            while (nl := data.find(b"\n", first)) >= 0:
                yield data[first:nl + 1]
                first = nl + 1
            pending = data[first:]
        # All read so far is handled: what this thread handed over meanwhile
        # goes out now, before it waits (`handoff`).
        handoff.flush()
        if pace:
            wait = drained_at + pace - time.monotonic()
            if wait > 0:
                if hurry is None:
                    time.sleep(wait)
                else:
                    hurry.wait(wait)
            if hurry is not None:
                hurry.clear()  # set again during the read: the next pause is skipped
        got = fp.read1(want)
        if not got:  # the end of fp
            if pending:
                yield pending
            return
        if len(got) < want:
            drained_at = time.monotonic()
        buf = buf[at:] + got
        at = 0


class _WatchStream:
    """One etcd watch over the gateway's streaming HTTP, read by a thread.

    The reader thread turns each newline-delimited JSON message into a queue
    item, so the consumer can wait with a timeout and stop at any time; closing
    shuts the socket down, which ends the reader's blocking read. Not
    `threaded`, the consumer reads the socket itself and is stopped by
    `abort` (from another thread)."""

    def __init__(
        self, endpoint: str, key: str, range_end: str, start_revision: int, timeout: float,
        threaded: bool = True, pace: float = 0.0, hurry: Hurry | threading.Event | None = None,
    ) -> None:
        self._pace = pace
        self._hurry = hurry
        host, _, port = endpoint.rpartition(":")
        self.error: str | None = None
        self._queue: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self._conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
        body = json.dumps(
            {
                "create_request": {
                    "key": b64(key),
                    "range_end": b64(range_end),
                    "start_revision": start_revision,
                    "prev_kv": True,
                }
            }
        )
        try:
            # "hasleader": etcd cancels the watch if this member loses its leader
            # (a partitioned member would otherwise go silent, not fail).
            self._conn.request(
                "POST",
                "/v3/watch",
                body=body,
                headers={"Content-Type": "application/json", "Grpc-Metadata-hasleader": "true"},
            )
            self._response = self._conn.getresponse()
            if self._response.status != 200:
                detail = self._response.read(2000).decode(errors="replace")
                with contextlib.suppress(ValueError, AttributeError):
                    answer = json.loads(detail)
                    detail = str(answer.get("message") or answer.get("error") or detail)
                raise OSError(f"watch answered HTTP {self._response.status}: {detail.strip()[:200]}")
            sock = self._conn.sock
            if sock is not None:
                sock.settimeout(None)  # the reader blocks; close() unblocks it
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                if hasattr(socket, "TCP_KEEPIDLE"):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 5)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 2)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
        except (OSError, http.client.HTTPException) as exc:
            self._conn.close()
            raise OSError(str(exc) or type(exc).__name__) from None
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(
                target=self._read, name=f"etcd-watch-{endpoint}", daemon=True
            )
            self._thread.start()

    def _lines(self) -> Iterator[bytes]:
        """The stream's lines (one message each), until it ends."""
        if not self._response.chunked:
            while True:
                handoff.flush()
                line = self._response.readline()
                if not line:
                    return
                yield line
        yield from chunked_lines(self._response.fp, self._pace, self._hurry)

    def _results(self) -> Iterator[dict[str, Any]]:
        """The stream's messages as they are read; at its end `error` says why."""
        try:
            for line in self._lines():
                if not line.strip():
                    continue
                msg = json.loads(line)
                if "error" in msg:
                    err = msg["error"]
                    self.error = str(err.get("message", err) if isinstance(err, dict) else err)
                    return
                yield msg.get("result", {})
            self.error = "watch stream closed"
        except Exception as exc:  # abort() from another thread can surface as any error here
            self.error = str(exc) or type(exc).__name__

    def _read(self) -> None:
        try:
            for msg in self._results():
                self._queue.put(msg)
        finally:
            self._queue.put(None)

    def messages(
        self, stopped: Callable[[], bool], deadline: Callable[[], float | None]
    ) -> Iterator[dict[str, Any]]:
        """Messages until the stream ends (then `error` says why), `stopped()` or the
        idle deadline passes (then `error` is None)."""
        if self._thread is None:
            for result in self._results():
                if stopped():
                    self.error = None
                    return
                yield result
            if stopped():
                self.error = None
            return
        while not stopped():
            wait = 0.1
            idle_deadline = deadline()
            if idle_deadline is not None:
                left = idle_deadline - time.monotonic()
                if left <= 0:
                    return
                wait = min(wait, left)
            try:
                msg = self._queue.get(timeout=wait)
            except queue.Empty:
                continue
            if msg is None:
                if self.error is None:
                    self.error = "watch stream closed"
                return
            yield msg

    def abort(self) -> None:
        """End a blocking read of the stream (from any thread)."""
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.abort()
        self._conn.close()
        if self._thread is not None:
            self._thread.join(timeout=2)
