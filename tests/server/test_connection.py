"""The HTTP connection of `hvfleet serve`, with each of uvicorn's two HTTP
implementations it serves with (server/connection.py): the session's server
(httptools, installed with hvfleet) and one started with `--http h11`. Both
drop a connection whose request head is late, refuse a head still
incomplete after 16 KiB, and serve pipelined requests and large bodies."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterator

import pytest

from hvfleet.server.connection import HEADER_TIMEOUT_S, MAX_HEAD_BYTES, CoalescedWrites, http_protocol
from tests.support.loops import run_on_own_thread
from tests.support.serve import Server, start_server, stop_server

GV = "/apis/hvfleet.io/v1"


@pytest.fixture(scope="module")
def h11_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("h11"), options=("--http", "h11"))
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def servers(server: Server, h11_server: Server) -> dict[str, Server]:
    return {"httptools": server, "h11": h11_server}


def _tls_socket(server: Server) -> ssl.SSLSocket:
    host, port = server.url.removeprefix("https://").split(":")
    ctx = ssl.create_default_context(cafile=str(server.ca))
    sock = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=5), server_hostname=host)
    sock.settimeout(HEADER_TIMEOUT_S + 10)
    return sock


def _read_all(sock: ssl.SSLSocket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    with contextlib.suppress(ssl.SSLError, ConnectionError, TimeoutError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _exchange(server: Server, raw: bytes, answers: int) -> list[bytes]:
    """Send `raw` in one write; the status lines of the first `answers` answers."""
    sock = _tls_socket(server)
    sock.settimeout(10)
    try:
        sock.sendall(raw)
        data = b""
        while data.count(b"HTTP/1.1 ") < answers:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    finally:
        sock.close()
    # A body ("ok") runs into the next answer's status line.
    return re.findall(rb"HTTP/1\.1 \d{3} [^\r]*", data)


def test_the_server_serves_with_httptools_when_it_is_installed_and_h11_when_asked() -> None:
    assert http_protocol("auto").__name__ == "HttpToolsDeadlineProtocol"
    assert http_protocol("httptools").__name__ == "HttpToolsDeadlineProtocol"
    assert http_protocol("h11").__name__ == "HeaderDeadlineProtocol"


def test_an_idle_or_trickling_connection_is_closed_after_the_header_timeout(
        servers: dict[str, Server]) -> None:
    closed: dict[str, float] = {}

    def idle(name: str) -> None:
        sock = _tls_socket(servers[name])
        t0 = time.monotonic()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            assert sock.recv(1024) == b""
        closed[f"{name} idle"] = time.monotonic() - t0
        sock.close()

    def trickle(name: str) -> None:
        sock = _tls_socket(servers[name])
        t0 = time.monotonic()
        try:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            for _ in range(int(HEADER_TIMEOUT_S * 3)):
                sock.sendall(b"X")  # a header that never ends, a byte at a time
                time.sleep(0.5)
        except (ssl.SSLError, ConnectionError, OSError):
            pass
        closed[f"{name} trickle"] = time.monotonic() - t0
        sock.close()

    threads = [threading.Thread(target=how, args=(name,)) for name in servers for how in (idle, trickle)]
    for t in threads:
        t.start()
    # Meanwhile ordinary requests are served.
    for srv in servers.values():
        assert srv.session(None).get(srv.url + "/healthz", timeout=5).status_code == 200
    for t in threads:
        t.join(HEADER_TIMEOUT_S * 3 + 10)
    for name in servers:
        assert HEADER_TIMEOUT_S - 1 <= closed[f"{name} idle"] <= HEADER_TIMEOUT_S + 4, closed
        assert closed[f"{name} trickle"] <= HEADER_TIMEOUT_S + 4, closed


@pytest.mark.parametrize("name", ["httptools", "h11"])
def test_a_request_head_still_incomplete_after_16_kib_is_refused_with_400(
        servers: dict[str, Server], name: str) -> None:
    srv = servers[name]
    pad = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (MAX_HEAD_BYTES - 200)
    assert _exchange(srv, pad + b"\r\n\r\n", 1) == [b"HTTP/1.1 200 OK"]
    sock = _tls_socket(srv)
    try:
        sock.sendall(pad + b"a" * 1000)  # past the bound, and the head goes on
        time.sleep(0.5)
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            sock.sendall(b"a" * 1000 + b"\r\n\r\n")
        answer = _read_all(sock)  # answered, then closed
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]


@pytest.mark.parametrize("name", ["httptools", "h11"])
def test_pipelined_requests_and_a_large_body_sent_with_its_head_are_served(
        servers: dict[str, Server], name: str) -> None:
    srv = servers[name]
    two = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"
    assert _exchange(srv, two, 2) == [b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK"]
    # A body far over the head's bound, in the same write as its head: a body, not a head.
    body = json.dumps({"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor",
                       "metadata": {"name": f"big-{name}", "annotations": {"note": "x" * 60_000}}}).encode()
    head = (f"POST {GV}/hypervisors HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {srv.tokens['operator']}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    assert _exchange(srv, head + body, 1) == [b"HTTP/1.1 201 Created"]


def test_a_write_through_the_h11_server_is_answered_and_stored(h11_server: Server) -> None:
    s = h11_server.session(h11_server.tokens["operator"])
    doc = {"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor", "metadata": {"name": "via-h11"}}
    r = s.post(f"{h11_server.url}{GV}/hypervisors", json=doc, timeout=10)
    assert r.status_code == 201, r.text
    got = s.get(f"{h11_server.url}{GV}/hypervisors/via-h11", timeout=10)
    assert got.json()["metadata"]["resourceVersion"] == r.json()["metadata"]["resourceVersion"]


class RecordingTransport:
    """A fake transport (no socket): what was written, and whether it was closed."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.lines: list[list[bytes]] = []  # each writelines() call's pieces
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def writelines(self, lines: list[bytes]) -> None:
        self.lines.append(list(lines))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def test_writes_in_one_turn_of_the_loop_go_out_as_one_and_close_sends_what_is_pending() -> None:
    async def scenario() -> list[list[bytes]]:
        seen = []
        t = RecordingTransport()
        w = CoalescedWrites(t, asyncio.get_running_loop())  # type: ignore[arg-type]
        w.write(b"HTTP/1.1 200 OK\r\n\r\n")
        w.write(b"")
        w.write(memoryview(b"body"))
        seen.append(list(t.written))  # nothing yet: sent at the end of this turn
        await asyncio.sleep(0)
        seen.append(list(t.written))
        w.write(b"last")
        w.close()  # flushed first, then closed
        seen.append(list(t.written))
        assert t.closed and w.get_extra_info("peername") == "info:peername"
        t2 = RecordingTransport()
        w2 = CoalescedWrites(t2, asyncio.get_running_loop())  # type: ignore[arg-type]
        w2.write(b"dropped")
        w2.abort()
        await asyncio.sleep(0)
        seen.append(list(t2.written))
        return seen

    before, after, closed, aborted = run_on_own_thread(scenario())  # see tests/support/loops.py
    assert before == []
    assert after == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    assert closed == [b"HTTP/1.1 200 OK\r\n\r\nbody", b"last"]
    assert aborted == []


def test_a_large_answer_goes_out_in_one_call_without_its_body_copied() -> None:
    """A head and a body of 444 KiB written in one turn are handed to the
    transport together (one `send` over TLS) as the very objects written:
    joining them copied the body once more per answer."""
    head, body = b"HTTP/1.1 200 OK\r\ncontent-length: 454656\r\n\r\n", b"x" * (444 * 1024)

    async def scenario() -> RecordingTransport:
        t = RecordingTransport()
        w = CoalescedWrites(t, asyncio.get_running_loop())  # type: ignore[arg-type]
        w.write(head)
        w.write(body)
        await asyncio.sleep(0)
        return t

    t = run_on_own_thread(scenario())
    assert t.written == [] and len(t.lines) == 1
    sent_head, sent_body = t.lines[0]
    assert sent_head == head and sent_body is body
