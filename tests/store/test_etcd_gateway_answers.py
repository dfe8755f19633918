"""The etcd gateway client's own HTTP/1.1 reading (`etcd_transport.GatewayConnection`,
and `AsyncGatewayConnection`, its asyncio twin, through the same parser):
whatever the framing (Content-Length, chunked with extensions and trailers, or
the end of the connection) and however the bytes are cut into reads, the body
read is the body sent and the connection is kept exactly when it may be; a
malformed answer is a connection failure, never a wrong body. The answers
come from a real socket pair; the real gateway is exercised by every etcd
test (tests/store/test_etcd_*.py)."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest
from etcd3gw import exceptions as etcd_errors
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.loops import run_on_own_thread

from hvfleet.store.etcd_transport import AsyncGatewayConnection, GatewayConnection, GatewayProtocolError


def framed(body: bytes, framing: str, chunks: list[int]) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    if framing == "length":
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    if framing == "close":
        return head + b"Connection: close\r\n\r\n" + body
    out, at = [head + b"Transfer-Encoding: chunked\r\n\r\n"], 0
    for size in chunks:
        piece = body[at:at + size]
        if piece:
            out.append(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece))
        at += size
    if at < len(body):
        out.append(b"%X\r\n%s\r\n" % (len(body) - at, body[at:]))
    out.append(b"0\r\nX-Trailer: t\r\n\r\n")
    return b"".join(out)


def read_answer(raw: bytes, cuts: list[int], close_after: bool,
                on_loop: bool = False) -> tuple[int, str, bytes, bool]:
    """`raw` sent in pieces cut at `cuts` over a socket pair; what the client
    reads (`on_loop`: the asyncio connection, on an event loop of its own)."""
    ours, theirs = socket.socketpair()
    ours.settimeout(5)

    def send() -> None:
        at = 0
        for cut in [*sorted(set(cuts)), len(raw)]:
            if at < cut <= len(raw):
                theirs.sendall(raw[at:cut])
                at = cut
        if close_after:
            theirs.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        if on_loop:
            async def read() -> tuple[int, str, bytes, bool]:
                ours.setblocking(False)
                reader, writer = await asyncio.open_connection(sock=ours)
                try:
                    return await AsyncGatewayConnection("127.0.0.1:1")._answer(reader)
                finally:
                    writer.close()

            return run_on_own_thread(read(), timeout=20)
        return GatewayConnection("127.0.0.1:1")._answer(ours)
    finally:
        sender.join()
        ours.close()
        theirs.close()


@settings(max_examples=150, deadline=None)
@given(body=st.binary(max_size=3000), framing=st.sampled_from(["length", "chunked", "close"]),
       chunks=st.lists(st.integers(1, 700), max_size=8), cuts=st.lists(st.integers(1, 4000), max_size=6))
def test_the_body_read_is_the_body_sent_whatever_the_framing_and_the_reads(
        body: bytes, framing: str, chunks: list[int], cuts: list[int]) -> None:
    status, reason, got, keep = read_answer(framed(body, framing, chunks), cuts, framing == "close")
    assert (status, reason, got) == (200, "OK", body)
    assert keep == (framing != "close")


@settings(max_examples=40, deadline=None)
@given(body=st.binary(max_size=3000), framing=st.sampled_from(["length", "chunked", "close"]),
       chunks=st.lists(st.integers(1, 700), max_size=8), cuts=st.lists(st.integers(1, 4000), max_size=6))
def test_the_connection_on_an_event_loop_reads_the_same_body(
        body: bytes, framing: str, chunks: list[int], cuts: list[int]) -> None:
    status, reason, got, keep = read_answer(framed(body, framing, chunks), cuts, framing == "close",
                                            on_loop=True)
    assert (status, reason, got) == (200, "OK", body)
    assert keep == (framing != "close")


@pytest.mark.parametrize("raw", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",       # the connection ends early
    b"SSH-2.0-OpenSSH\r\n\r\n",                                    # not HTTP
    b"HTTP/1.1 2xx OK\r\nContent-Length: 0\r\n\r\n",               # no status code
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcdef\r\n0\r\n\r\n",  # chunk overrun
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # no chunk size
])
@pytest.mark.parametrize("on_loop", [False, True], ids=["thread", "loop"])
def test_a_malformed_or_cut_answer_is_an_error_not_a_body(raw: bytes, on_loop: bool) -> None:
    with pytest.raises((GatewayProtocolError, ValueError)):
        read_answer(raw, [], close_after=True, on_loop=on_loop)


def test_a_gateway_that_answers_garbage_is_a_connection_failure_and_the_connection_is_dropped() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        peer, _ = listener.accept()
        peer.recv(65536)
        peer.sendall(b"garbage that is no HTTP\r\n\r\n")
        peer.close()

    t = threading.Thread(target=serve)
    t.start()
    conn = GatewayConnection(f"127.0.0.1:{port}")
    try:
        with pytest.raises(etcd_errors.ConnectionFailedError) as failed:
            conn.post("kv/range", {"key": "a"}, timeout=5)
        assert "not an HTTP/1.1 answer" in failed.value.detail_text
        assert conn._sock is None  # the next request opens a new connection
    finally:
        t.join()
        listener.close()
        conn.close()


def test_on_an_event_loop_garbage_is_a_connection_failure_and_a_closed_connection_is_not_reused() -> None:
    """The asyncio connection fails as the threaded one does, and a kept
    connection the member closed meanwhile is replaced before a request is sent
    into it (not reported as a lost answer)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    answer = b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{"ok": "1"}'
    served: list[bytes] = []

    def serve() -> None:
        for reply in (answer, b"garbage that is no HTTP\r\n\r\n", answer):
            peer, _ = listener.accept()  # one connection per request: each is closed after it
            served.append(peer.recv(65536))
            peer.sendall(reply)
            peer.close()

    t = threading.Thread(target=serve)
    t.start()
    conn = AsyncGatewayConnection(f"127.0.0.1:{port}")

    async def requests() -> tuple[dict[str, str], str, bool, dict[str, str]]:
        first = await conn.post("kv/range", {"key": "a"}, timeout=5)
        await asyncio.sleep(0.2)  # the member closes the kept connection meanwhile
        try:
            await conn.post("kv/range", {"key": "b"}, timeout=5)
            failed = ""
        except etcd_errors.ConnectionFailedError as exc:
            failed = exc.detail_text
        dropped = conn._writer is None
        third = await conn.post("kv/range", {"key": "c"}, timeout=5)
        conn.close()
        return first, failed, dropped, third

    try:
        first, failed, dropped, third = run_on_own_thread(requests(), timeout=20)
    finally:
        t.join()
        listener.close()
    assert first == third == {"ok": "1"}
    assert "not an HTTP/1.1 answer" in failed
    assert dropped
    assert [r.split(b"\r\n\r\n")[1] for r in served] == [b'{"key":"a"}', b'{"key":"b"}', b'{"key":"c"}']
