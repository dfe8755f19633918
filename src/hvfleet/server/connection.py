"""The HTTP/1.1 connection of `hvfleet serve`: uvicorn's h11 protocol, plus a
deadline for a request's head.

uvicorn closes a kept-alive connection that stays idle (`timeout_keep_alive`),
but it arms that timer only after a response and disarms it at the first byte:
a connection that never sends anything, or sends its request line and
headers a byte at a time, would be held forever, and enough of them exhaust
the server's sockets. Here every connection must deliver a whole request
head within `HEADER_TIMEOUT_S` of being opened (or of the previous response
plus the keep-alive time), or it is closed. h11 itself refuses a head larger
than 16 KiB (uvicorn's `h11_max_incomplete_event_size`, answered 400).
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

# Seconds a client has to send a complete request line and headers.
HEADER_TIMEOUT_S = 10.0


class HeaderDeadlineProtocol(H11Protocol):
    """H11Protocol that closes a connection whose request head is late."""

    header_timeout = HEADER_TIMEOUT_S
    _head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_deadline(self.header_timeout)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm_head_deadline()  # the head is complete: the request runs

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            # The next head may start up to the keep-alive time from now.
            self._arm_head_deadline(self.timeout_keep_alive + self.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def _arm_head_deadline(self, seconds: float) -> None:
        self._disarm_head_deadline()
        self._head_deadline = self.loop.call_later(seconds, self._head_late)

    def _disarm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_late(self) -> None:
        self._head_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()
