"""The HTTP/1.1 connection of `hvfleet serve`: one of uvicorn's two HTTP
implementations (`httptools`, uvicorn's binding of llhttp, when it is
installed; else h11), plus a deadline for a request's head and a bound on
its size.

uvicorn closes a kept-alive connection that stays idle (`timeout_keep_alive`),
but it arms that timer only after a response and disarms it at the first byte:
a connection that never sends anything, or sends its request line and
headers a byte at a time, would be held forever, and enough of them exhaust
the server's sockets. Here every connection must deliver a whole request
head within `HEADER_TIMEOUT_S` of being opened (or of the previous response
plus the keep-alive time), or it is dropped. A head still incomplete after
`MAX_HEAD_BYTES` is answered 400 and the connection closed, so one
connection's head never holds more memory: h11 refuses it itself (uvicorn's
`h11_max_incomplete_event_size`); llhttp has no such bound, so the httptools
protocol counts the bytes received while a head is incomplete. When the
server stops, a connection is dropped once it has sent its last answer, not
held open until the client closes it.

A request whose Content-Length is not a number is refused by both parsers
before any app sees it, and uvicorn would answer its own plain-text 400.
Both protocols here hand such a head, whose only fault that is, to the app
without its body (its framing is unknown) and close the connection after the
answer, whether it arrives on a fresh connection, split over reads, or on a
kept-alive one in the same read as the requests before it (pipelined): the
Placement API then answers Placement's 400 and the Kubernetes-shaped API a
400 Status (`UNFRAMED`, server/guard.py).

Why two: the server's CPU per write (docs/scaling.md, "The cost of a
write") is to a large part HTTP parsing on the event loop; httptools parses
a request head in C, where h11 does it in Python. h11 stays the fallback and
is what `http="h11"` serves with.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
from collections.abc import Callable
from typing import Any, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from hvfleet.model.errors import InvalidInput

# Seconds a client has to send a complete request line and headers.
HEADER_TIMEOUT_S = 10.0
# The largest request head (request line and headers) accepted, as h11's default.
MAX_HEAD_BYTES = 16 * 1024
# While the server stops: how often a connection is checked for having sent
# its last answer, after which it is dropped rather than closed.
STOP_CHECK_S = 0.1
# Writes of one turn smaller than this in all are joined into one (one TLS
# record for a small answer); larger ones go out as they are (`writelines`):
# joining a 444 KiB body to its head copied it once more per answer.
JOIN_BELOW = 64 * 1024

HTTP_IMPLEMENTATIONS = ("auto", "h11", "httptools")
# The ASGI scope extension of a request handed to the app without its body
# because its Content-Length is not a number (the app must refuse it).
UNFRAMED = "hvfleet.unframed"
# uvicorn's words for a head its parser refused (both implementations).
_REFUSED = "Invalid HTTP request received."
# The bytes the httptools protocol keeps of what arrived since the parser was
# last between requests, to find a refused head in a read that also held the
# requests before it (`_refused_head`). A read past this (a large body) is
# not kept, and a head refused after it in the same stream gets uvicorn's 400.
MAX_PIPELINED_BYTES = 64 * 1024


def malformed_length(head: bytes) -> tuple[bytes, bytes] | None:
    """(`head` without its Content-Length line, that line's value) when the
    head's one Content-Length is not a number and no Transfer-Encoding frames
    the body instead; else None. `head` is a request head or the start of
    one: only its complete lines are read (a line ends in CRLF, as llhttp
    requires), and what follows them is kept as it is."""
    lines = head.split(b"\r\n")
    lengths: list[int] = []
    for i, line in enumerate(lines[1:-1], start=1):
        name, colon, value = line.partition(b":")
        if not colon:
            continue
        name = name.lower()
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            lengths.append(i)
    if len(lengths) != 1:
        return None
    value = lines[lengths[0]].partition(b":")[2].strip(b" \t")
    if value.isdigit():
        return None
    return b"\r\n".join(lines[:lengths[0]] + lines[lengths[0] + 1:]), value


def may_be_malformed_length(start: bytes) -> bool:
    """Whether `start`, the start of a head a parser refused before it was
    complete, may still turn out to be one whose only fault is its
    Content-Length: it has such a line already (`malformed_length`), or its
    last, unfinished line is the Content-Length's (llhttp refuses at the
    first character that is not a digit, before the line ends)."""
    if malformed_length(start) is not None:
        return True
    _, crlf, last = start.rpartition(b"\r\n")
    name, colon, _ = last.partition(b":")
    return bool(crlf) and bool(colon) and name.lower() == b"content-length"


def messages_in(data: bytes, parser_of: Callable[[object], Any]) -> int:
    """How many requests a fresh parser (`parser_of(callbacks)`, httptools'
    HttpRequestParser) completes in `data`, up to where it refuses it."""
    class Count:
        done = 0

        def on_message_complete(self) -> None:
            self.done += 1

    count = Count()
    with contextlib.suppress(Exception):  # its refusal or upgrade: what came before counts
        parser_of(count).feed_data(data)
    return count.done


def after_messages(data: bytes, n: int, parser_of: Callable[[object], Any]) -> int | None:
    """Where in `data` (read from a point between requests) the request after
    the first `n` starts, as the parser judges it: the shortest start of
    `data` in which it completes `n` requests (a binary search, each step a
    fresh parse; only when a head was refused). None if it completes fewer."""
    if n == 0:
        return 0
    if messages_in(data, parser_of) < n:
        return None
    low, high = 0, len(data)
    while low < high:
        mid = (low + high) // 2
        if messages_in(data[:mid], parser_of) >= n:
            high = mid
        else:
            low = mid + 1
    return low


class CoalescedWrites:
    """The connection's transport, with the writes made in one turn of the
    event loop sent as one. An answer is written as its head, then its body
    (uvicorn writes each ASGI message at once): over TLS that was two
    records and two `send` calls per answer, now one of each (a large answer:
    one `send`, its pieces handed over uncopied). Everything but writing and
    closing is the transport's own."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))

    def writelines(self, lines: list[bytes]) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        if self._transport.is_closing():
            return
        if len(pending) == 1:
            self._transport.write(pending[0])
        elif sum(map(len, pending)) < JOIN_BELOW:
            self._transport.write(b"".join(pending))
        else:
            # A large body is not copied to be joined to its head: the TLS
            # transport encrypts each piece in turn into its one outgoing
            # buffer (one `send` still), the plain one sends them in one writev.
            self._transport.writelines(pending)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def __getattr__(self, name: str) -> object:
        return getattr(self._transport, name)


class _HeadDeadline:
    """What both protocols add to uvicorn's: the head deadline (armed while a
    head is awaited, it drops the connection if the head is still incomplete
    then) and the coalesced writes. Put before the uvicorn protocol class, so
    `super()` is that protocol."""

    header_timeout = HEADER_TIMEOUT_S
    _head_deadline: asyncio.TimerHandle | None = None
    _stop_check: asyncio.TimerHandle | None = None
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    timeout_keep_alive: int

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        coalesced = CoalescedWrites(cast(asyncio.Transport, transport), self.loop)
        super().connection_made(coalesced)  # type: ignore[misc]
        self._arm_head_deadline(self.header_timeout)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if not self.transport.is_closing():
            # The next head may start up to the keep-alive time from now.
            self._arm_head_deadline(self.timeout_keep_alive + self.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        if self._stop_check is not None:
            self._stop_check.cancel()
        super().connection_lost(exc)  # type: ignore[misc]

    def shutdown(self) -> None:
        """The server is stopping: uvicorn closes the connection now when idle,
        else once the answer in flight is complete (the server ends open
        streams first: ApiContext.stopping). Once closing with everything sent,
        it is dropped: a TLS close waits for the client's close_notify, which a
        client that keeps the connection for its next request never sends, and
        uvicorn waits for every connection to be gone, up to its graceful bound."""
        super().shutdown()  # type: ignore[misc]
        self._stop_check = self.loop.call_later(STOP_CHECK_S, self._drop_once_sent)

    def _drop_once_sent(self) -> None:
        if self.transport.is_closing() and not self.transport.get_write_buffer_size():
            self._stop_check = None
            self.transport.abort()
        else:
            self._stop_check = self.loop.call_later(STOP_CHECK_S, self._drop_once_sent)

    def _awaiting_head(self) -> bool:
        raise NotImplementedError

    def _arm_head_deadline(self, seconds: float) -> None:
        self._disarm_head_deadline()
        self._head_deadline = self.loop.call_later(seconds, self._head_late)

    def _disarm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_late(self) -> None:
        self._head_deadline = None
        if self._awaiting_head() and not self.transport.is_closing():
            # Dropped, not closed: a TLS close waits (up to 30 s) for the peer's
            # close_notify while it reads on, and a slow client never sends one.
            self.transport.abort()


class _HeadKeepingConnection(h11.Connection):
    """An h11 connection that keeps what it held when it last looked for a
    request head (at most MAX_HEAD_BYTES and the head's end): h11 reads a
    head only while idle, from the start of what it holds, and once it has
    refused one, what it read of it is gone."""

    head_start = b""

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        if self.their_state is h11.IDLE:
            self.head_start = self.trailing_data[0][:MAX_HEAD_BYTES + 4]
        return super().next_event()


class HeaderDeadlineProtocol(_HeadDeadline, H11Protocol):
    """H11Protocol that drops a connection whose request head is late, and
    hands a head refused for its Content-Length alone to the app."""

    # The Content-Length, not a number, of the request handed over without
    # its body; from then on nothing more is read and the connection closes.
    _unframed: bytes | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The same connection state uvicorn makes (its incomplete-event bound
        # is h11's default, MAX_HEAD_BYTES), keeping each head's start.
        self.conn = _HeadKeepingConnection(h11.SERVER, MAX_HEAD_BYTES)

    def _awaiting_head(self) -> bool:
        return self.conn.their_state is h11.IDLE

    def data_received(self, data: bytes) -> None:
        if self._unframed is not None:
            return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm_head_deadline()  # the head is complete: the request runs

    def send_400_response(self, msg: str) -> None:
        if msg == _REFUSED and self._unframed is None and self._hand_over():
            return
        super().send_400_response(msg)

    def _hand_over(self) -> bool:
        """The head h11 refused, if its only fault is a Content-Length that is
        not a number, to the app without its body, on a new h11 connection
        state that closes after the answer (h11 has no other way back from its
        error state). False: uvicorn's plain 400."""
        received = cast(_HeadKeepingConnection, self.conn).head_start
        end = received.find(b"\r\n\r\n")
        found = None if end < 0 else malformed_length(received[:end + 4])
        if found is None:
            return False
        head, value = found
        # "Connection: close" makes h11 close after the answer (and say so).
        head = head[:-2] + b"Connection: close\r\n\r\n"
        conn = h11.Connection(h11.SERVER, MAX_HEAD_BYTES)
        conn.receive_data(head)
        try:
            if not isinstance(conn.next_event(), h11.Request):
                return False
        except h11.RemoteProtocolError:
            return False
        conn = _HeadKeepingConnection(h11.SERVER, MAX_HEAD_BYTES)
        conn.receive_data(head)
        self.conn, self._unframed = conn, value
        self._disarm_head_deadline()
        self.handle_events()  # the request, as uvicorn starts every one
        self.headers.append((b"content-length", value))
        self.scope.setdefault("extensions", {})[UNFRAMED] = {}  # before its task first runs
        return True


def httptools_protocol() -> type[asyncio.Protocol] | None:
    """The httptools protocol with the same deadline and head bound, or None
    when httptools is not installed."""
    if importlib.util.find_spec("httptools") is None:
        return None
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class HttpToolsDeadlineProtocol(_HeadDeadline, HttpToolsProtocol):
        """HttpToolsProtocol that drops a connection whose request head is
        late, answers 400 to a head still incomplete after MAX_HEAD_BYTES, and
        hands a head llhttp refuses for its Content-Length alone to the app."""

        # A head is awaited from the end of the previous request (or the
        # connection's start) until the parser has read all of its headers.
        _head_open = True
        # Bytes received while a head is awaited (a head not yet complete).
        _head_bytes = 0

        def _awaiting_head(self) -> bool:
            return self._head_open

        # What arrived since the parser was last between requests at the end
        # of a read (at most MAX_PIPELINED_BYTES, else None until it is again),
        # and how many requests it completed in it: where a refused head
        # starts is found from these (`_refused_head`), not on every read.
        _since_between: bytearray | None = None
        _completed = 0
        # The parser is inside a request (on_message_begin .. _complete).
        _in_message = False
        # The start of a refused head that may still be one whose only fault
        # is its Content-Length: the rest is awaited (`_awaiting_rest`).
        _head_seen = b""
        # The Content-Length, not a number, of the request handed over without
        # its body; from then on nothing more is read and the connection closes.
        _unframed: bytes | None = None
        # Such a head is still arriving.
        _awaiting_rest = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self._since_between = bytearray()  # a connection starts between requests
            super().connection_made(transport)

        def data_received(self, data: bytes) -> None:
            if self._unframed is not None:
                return
            if self._awaiting_rest:
                self._head_seen += data[:MAX_HEAD_BYTES + 1 - len(self._head_seen)]
                self._awaiting_rest = False
                if not self._hand_over(self._head_seen):
                    HttpToolsProtocol.send_400_response(self, _REFUSED)
                return
            if self._head_open:
                self._head_bytes += len(data)
            kept = self._since_between
            if kept is None or len(kept) + len(data) > MAX_PIPELINED_BYTES:
                self._since_between = None
            else:
                kept += data
            super().data_received(data)
            if not self._in_message:  # between requests: nothing of one is kept
                self._since_between = bytearray()
                self._completed = 0
            if self._head_open and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                # llhttp keeps an incomplete header line in memory: bounded here.
                self.send_400_response("Request head too large.")

        def send_400_response(self, msg: str) -> None:
            # uvicorn answers every head llhttp refuses with a plain 400 of its own.
            if msg == _REFUSED and self._head_open and self._unframed is None and self._hand_over():
                return
            super().send_400_response(msg)

        def _refused_head(self) -> bytes | None:
            """What arrived of the head llhttp refused: what came since the
            parser was last between requests, after the requests it completed
            in it (pipelined ones read with the refused head). None when that
            was not kept."""
            kept = self._since_between
            if kept is None:
                return None
            data = bytes(kept)
            start = after_messages(data, self._completed, httptools.HttpRequestParser)
            if start is None:
                return None
            return data[start:].lstrip(b"\r\n")  # llhttp skips line ends between requests

        def _hand_over(self, received: bytes | None = None) -> bool:
            """A head whose only fault is a Content-Length that is not a number
            goes to the app (which answers it: Placement's 400, or the API's
            Status) without a body, whose framing is unknown, and the
            connection closes after the answer. True when handed over, or when
            such a head is still arriving (then the rest is awaited, within
            the head's deadline and size); False: uvicorn's plain 400."""
            if received is None:
                received = self._refused_head()
                if received is None:
                    return False
            end = received.find(b"\r\n\r\n")
            if end < 0:
                self._awaiting_rest = len(received) <= MAX_HEAD_BYTES and may_be_malformed_length(received)
                self._head_seen = received if self._awaiting_rest else b""
                return self._awaiting_rest
            found = malformed_length(received[:end + 4])
            if found is None:
                return False
            head, value = found
            self._unframed = value
            self.parser = httptools.HttpRequestParser(self)  # the refusing one is in its error state
            try:
                self.parser.feed_data(head)
            except httptools.HttpParserError:
                self._unframed = None
                return False
            return True

        def on_message_begin(self) -> None:
            self._in_message = True
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._head_open = False
            self._head_bytes = 0
            if self._unframed is not None:
                self.headers.append((b"content-length", self._unframed))
                self.scope.setdefault("extensions", {})[UNFRAMED] = {}
                super().on_headers_complete()
                self.cycle.keep_alive = False
                return
            self._disarm_head_deadline()  # the head is complete: the request runs
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._in_message = False
            self._completed += 1
            self._head_open = True  # whatever comes next is the next request's head

    return HttpToolsDeadlineProtocol


def http_protocol(implementation: str = "auto") -> type[asyncio.Protocol]:
    """The protocol class uvicorn serves with: httptools when asked for or, for
    "auto", when installed; else h11."""
    if implementation not in HTTP_IMPLEMENTATIONS:
        raise InvalidInput(f"http: {implementation!r} is not one of {', '.join(HTTP_IMPLEMENTATIONS)}")
    if implementation != "h11":
        chosen = httptools_protocol()
        if chosen is not None:
            return chosen
        if implementation == "httptools":
            raise InvalidInput("http: httptools is not installed (pip install httptools)")
    return HeaderDeadlineProtocol
