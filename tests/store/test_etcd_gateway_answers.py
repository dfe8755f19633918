"""The etcd gateway client's own HTTP/1.1 reading (`etcd_transport.GatewayConnection`):
whatever the framing (Content-Length, chunked with extensions and trailers, or
the end of the connection) and however the bytes are cut into reads, the body
read is the body sent and the connection is kept exactly when it may be; a
malformed answer is a connection failure, never a wrong body. The answers
come from a real socket pair; the real gateway is exercised by every etcd
test (tests/store/test_etcd_*.py)."""

from __future__ import annotations

import socket
import threading

import pytest
from etcd3gw import exceptions as etcd_errors
from hypothesis import given, settings
from hypothesis import strategies as st

from hvfleet.store.etcd_transport import GatewayConnection, GatewayProtocolError


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


def read_answer(raw: bytes, cuts: list[int], close_after: bool) -> tuple[int, str, bytes, bool]:
    """`raw` sent in pieces cut at `cuts` over a socket pair; what the client reads."""
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
    conn = GatewayConnection("127.0.0.1:1")
    try:
        return conn._answer(ours)
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


@pytest.mark.parametrize("raw", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",       # the connection ends early
    b"SSH-2.0-OpenSSH\r\n\r\n",                                    # not HTTP
    b"HTTP/1.1 2xx OK\r\nContent-Length: 0\r\n\r\n",               # no status code
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcdef\r\n0\r\n\r\n",  # chunk overrun
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # no chunk size
])
def test_a_malformed_or_cut_answer_is_an_error_not_a_body(raw: bytes) -> None:
    with pytest.raises((GatewayProtocolError, ValueError)):
        read_answer(raw, [], close_after=True)


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
