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

Why two: the server's CPU per write (docs/scaling.md, "The cost of a
write") is to a large part HTTP parsing on the event loop; httptools parses
a request head in C, where h11 does it in Python. h11 stays the fallback and
is what `http="h11"` serves with.
"""

from __future__ import annotations

import asyncio
import importlib.util
from typing import cast

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


class HeaderDeadlineProtocol(_HeadDeadline, H11Protocol):
    """H11Protocol that drops a connection whose request head is late."""

    def _awaiting_head(self) -> bool:
        return self.conn.their_state is h11.IDLE

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm_head_deadline()  # the head is complete: the request runs


def httptools_protocol() -> type[asyncio.Protocol] | None:
    """The httptools protocol with the same deadline and head bound, or None
    when httptools is not installed."""
    if importlib.util.find_spec("httptools") is None:
        return None
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class HttpToolsDeadlineProtocol(_HeadDeadline, HttpToolsProtocol):
        """HttpToolsProtocol that drops a connection whose request head is
        late, and answers 400 to a head still incomplete after MAX_HEAD_BYTES."""

        # A head is awaited from the end of the previous request (or the
        # connection's start) until the parser has read all of its headers.
        _head_open = True
        # Bytes received while a head is awaited (a head not yet complete).
        _head_bytes = 0

        def _awaiting_head(self) -> bool:
            return self._head_open

        # What arrived of the current head (at most MAX_HEAD_BYTES), kept for
        # a head llhttp refuses for its Content-Length alone (`_hand_over`).
        _head_seen = b""
        # The Content-Length, not a number, of the request handed over without
        # its body; from then on nothing more is read and the connection closes.
        _unframed: bytes | None = None
        # Such a head is still arriving.
        _awaiting_rest = False

        def data_received(self, data: bytes) -> None:
            if self._unframed is not None:
                return
            if self._head_open:
                self._head_bytes += len(data)
                if len(self._head_seen) < MAX_HEAD_BYTES:
                    self._head_seen += data[:MAX_HEAD_BYTES - len(self._head_seen)]
            if self._awaiting_rest:
                self._awaiting_rest = False
                if not self._hand_over():
                    HttpToolsProtocol.send_400_response(self, "Invalid HTTP request received.")
                return
            super().data_received(data)
            if self._head_open and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                # llhttp keeps an incomplete header line in memory: bounded here.
                self.send_400_response("Request head too large.")

        def send_400_response(self, msg: str) -> None:
            # uvicorn answers every head llhttp refuses with a plain 400 of its own.
            if msg == "Invalid HTTP request received." and self._head_open and self._hand_over():
                return
            super().send_400_response(msg)

        def _hand_over(self) -> bool:
            """A head whose only fault is a Content-Length that is not a number
            goes to the app (which answers it: Placement's 400, or the API's
            Status) without a body, whose framing is unknown, and the
            connection closes after the answer. True when handed over, or when
            such a head is still arriving (then the rest is awaited, within
            the head's deadline and size); False: uvicorn's plain 400."""
            received = self._head_seen
            end = received.find(b"\r\n\r\n")
            found = malformed_length(received if end < 0 else received[:end + 4])
            if found is None:
                return False
            if end < 0:
                self._awaiting_rest = self._head_bytes <= MAX_HEAD_BYTES
                return self._awaiting_rest
            head, value = found
            self._unframed = value
            self.parser = httptools.HttpRequestParser(self)  # the refusing one is in its error state
            try:
                self.parser.feed_data(head)
            except httptools.HttpParserError:
                self._unframed = None
                return False
            return True

        def on_headers_complete(self) -> None:
            self._head_open = False
            self._head_bytes = 0
            self._head_seen = b""
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
