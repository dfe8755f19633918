"""A request whose Content-Length is not a number (server/connection.py,
`malformed_length`): llhttp and h11 refuse its head, and uvicorn would answer
a plain-text 400 of its own before any app sees it. `hvfleet serve`, with
either implementation (the session's server: httptools; one started with
`--http h11`), hands such a head to the app without a body, whose framing is
unknown, and closes the connection after the answer: the Placement API
answers it as Placement does (400 "content-length header must be an integer"
in its error body), the Kubernetes-shaped API with a 400 Status and no
handler run. So on a fresh connection, split over reads, and on a kept-alive
one, also when it arrives in the same read as the requests before it
(pipelined), which are answered first. A head with another fault still gets
uvicorn's 400. Over raw TLS sockets."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import time
from collections.abc import Iterator

import httptools
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hvfleet.server.connection import (
    MAX_PIPELINED_BYTES,
    after_messages,
    malformed_length,
    may_be_malformed_length,
)
from tests.support.serve import Server, start_server, stop_server

GV = "/apis/hvfleet.io/v1"
Answer = tuple[int, dict[str, str], bytes]


@pytest.fixture(scope="module")
def h11_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("h11-length"), options=("--http", "h11"))
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(params=["httptools", "h11"])
def any_server(request: pytest.FixtureRequest, server: Server) -> Server:
    """The session's server (httptools), or one started with --http h11."""
    if request.param == "h11":
        return request.getfixturevalue("h11_server")  # type: ignore[no-any-return]
    return server


def _answers(data: bytes) -> list[Answer]:
    """Every answer in `data`, each (status, headers, body), framed by its
    Content-Length (the last one by the connection's end)."""
    out: list[Answer] = []
    while data:
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", len(data)))
        out.append((int(lines[0].split()[1]), headers, data[:length]))
        data = data[length:]
    return out


def _send(server: Server, pieces: list[bytes]) -> Answer:
    """Send `pieces` one write apart; (status, headers, body) of the answer,
    read until the server closes the connection."""
    [answer] = _send_all(server, pieces)
    return answer


def _send_all(server: Server, pieces: list[bytes]) -> list[Answer]:
    """Send `pieces` one write apart; every answer, read until the server
    closes the connection."""
    host, port = server.url.removeprefix("https://").split(":")
    ctx = ssl.create_default_context(cafile=str(server.ca))
    sock = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=10), server_hostname=host)
    try:
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(0.05)
        data = b""
        with contextlib.suppress(ssl.SSLError, ConnectionError, TimeoutError):
            while chunk := sock.recv(65536):
                data += chunk
    finally:
        sock.close()
    return _answers(data)


def _head(method: str, path: str, token: str, length: str, *, more: str = "") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: hvfleet\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\nX-Auth-Token: {token}\r\n{more}\r\n").encode()


def test_placement_answers_a_content_length_that_is_not_a_number_as_placement_does(
        any_server: Server) -> None:
    body = json.dumps({"name": "rp-bad-length"}).encode()
    status, headers, answer = _send(any_server, [
        _head("POST", "/placement/resource_providers", any_server.tokens["admin"], "hi mom") + body])
    assert status == 400, answer
    assert headers["connection"] == "close" and headers["content-type"].startswith("application/json")
    error = json.loads(answer)["errors"][0]
    assert error["status"] == 400 and "content-length header must be an integer" in error["detail"]
    # Nothing was created: the request never reached a handler.
    listed = any_server.session(any_server.tokens["admin"]).get(
        f"{any_server.url}/placement/resource_providers?name=rp-bad-length", timeout=10)
    assert listed.json()["resource_providers"] == []


def test_a_head_split_inside_its_bad_content_length_is_answered_the_same(any_server: Server) -> None:
    raw = _head("POST", "/placement/resource_providers", any_server.tokens["admin"], "12x")
    cut = raw.index(b"12x") + 2
    status, _, answer = _send(any_server, [raw[:cut], raw[cut:] + b'{"name": "x"}'])
    assert status == 400 and "content-length header must be an integer" in answer.decode()


def test_the_kubernetes_api_refuses_it_with_a_status_and_runs_no_handler(any_server: Server) -> None:
    doc = {"apiVersion": "hvfleet.io/v1", "kind": "OvercommitPolicy", "metadata": {"name": "bad-length"},
           "spec": {"overcommit": {"cpu": 2.0}}}
    status, _, answer = _send(any_server, [
        _head("POST", f"{GV}/overcommitpolicies", any_server.tokens["admin"], "-1",
              more=f"Authorization: Bearer {any_server.tokens['admin']}\r\n") + json.dumps(doc).encode()])
    assert status == 400
    got = json.loads(answer)
    assert got["kind"] == "Status" and got["reason"] == "BadRequest" and "Content-Length" in got["message"]
    r = any_server.session(any_server.tokens["admin"]).get(
        f"{any_server.url}{GV}/overcommitpolicies/bad-length", timeout=10)
    assert r.status_code == 404


def test_a_head_with_another_fault_gets_the_plain_400(any_server: Server) -> None:
    raw = _head("POST", "/placement/resource_providers", any_server.tokens["admin"], "hi",
                more="Bad Name: x\r\n")
    status, headers, answer = _send(any_server, [raw])
    assert status == 400 and headers["content-type"].startswith("text/plain"), answer


def _get(path: str, token: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: hvfleet\r\nX-Auth-Token: {token}\r\n\r\n".encode()


def _post(path: str, token: str, doc: object) -> bytes:
    body = json.dumps(doc).encode()
    return _head("POST", path, token, str(len(body))) + body


@pytest.mark.parametrize("one_read", [True, False], ids=["same-read", "later-read"])
def test_a_bad_content_length_on_a_kept_alive_connection_is_answered_after_the_requests_before_it(
        any_server: Server, one_read: bool) -> None:
    token = any_server.tokens["admin"]
    before = _get("/placement/", token) + _post("/placement/resource_providers", token, {"name": "rp-piped"})
    bad = _head("POST", "/placement/resource_providers", token, "hi mom") + b'{"name": "rp-never"}'
    answers = _send_all(any_server, [before + bad] if one_read else [before, bad])
    assert [status for status, _, _ in answers] == [200, 201, 400], answers
    _, headers, body = answers[2]
    assert headers["connection"] == "close" and headers["content-type"].startswith("application/json")
    assert "content-length header must be an integer" in json.loads(body)["errors"][0]["detail"]
    listed = any_server.session(token).get(f"{any_server.url}/placement/resource_providers", timeout=10)
    assert sorted(rp["name"] for rp in listed.json()["resource_providers"]) == ["rp-piped"]
    any_server.session(token).delete(
        f"{any_server.url}/placement/resource_providers/{answers[1][1]['location'].rsplit('/', 1)[1]}",
        timeout=10)


def test_after_more_than_64_kib_in_one_read_httptools_gives_the_plain_400(
        any_server: Server, request: pytest.FixtureRequest) -> None:
    # The documented bound (MAX_PIPELINED_BYTES): with httptools, what came
    # before a refused head is kept up to 64 KiB, and past it uvicorn's plain
    # 400 is written at once (before the answer in flight, which is lost, as
    # uvicorn always did); h11 needs nothing kept.
    token = any_server.tokens["admin"]
    big = b" " * (MAX_PIPELINED_BYTES + 1)
    before = _head("GET", "/placement/", token, str(len(big))) + big
    bad = _head("POST", "/placement/resource_providers", token, "hi mom")
    answers = _send_all(any_server, [before + bad])
    if request.node.callspec.params["any_server"] == "httptools":
        assert answers[-1][0] == 400 and answers[-1][1]["content-type"].startswith("text/plain"), answers
    else:
        assert [status for status, _, _ in answers] == [200, 400], answers
        assert "content-length header must be an integer" in answers[1][2].decode()


def test_a_head_refused_at_its_bad_content_length_before_the_line_ends_awaits_the_rest(
        any_server: Server) -> None:
    raw = _head("POST", "/placement/resource_providers", any_server.tokens["admin"], "12x")
    cut = raw.index(b"12x") + 3  # llhttp refuses at "x", before its line's end arrives
    status, _, answer = _send(any_server, [raw[:cut], raw[cut:] + b'{"name": "x"}'])
    assert status == 400 and "content-length header must be an integer" in answer.decode()


_request = st.tuples(st.sampled_from(["GET", "POST", "PUT"]), st.binary(max_size=40),
                     st.booleans())


_tails = st.sampled_from([b"", b"\r\n", b"POST /x HTTP/1.1\r\nContent-Length: 1x", b"PO",
                          b"POST /x HTTP/1.1\r\nContent-Length: hi\r\n\r\n{}", b"\x00garbage"])


@given(requests=st.lists(_request, max_size=5), tail=_tails)
def test_after_messages_finds_where_each_pipelined_request_ends(
        requests: list[tuple[str, bytes, bool]], tail: bytes) -> None:
    # Requests with and without bodies, some after blank lines, then the start
    # of a head (refused or not yet complete) or nothing.
    data, ends = b"", [0]
    for method, body, blank in requests:
        framing = f"Content-Length: {len(body)}\r\n" if body or method != "GET" else ""
        data += (b"\r\n" if blank else b"") + (
            f"{method} /x HTTP/1.1\r\nHost: h\r\n{framing}\r\n").encode() + body
        ends.append(len(data))
    for n in range(len(requests) + 1):
        assert after_messages(data + tail, n, httptools.HttpRequestParser) == ends[n], n
    assert after_messages(data, len(requests) + 1, httptools.HttpRequestParser) is None


def test_may_be_malformed_length_awaits_only_a_head_that_may_still_be_one() -> None:
    assert may_be_malformed_length(b"POST /x HTTP/1.1\r\nContent-Length: 1x")
    assert may_be_malformed_length(b"POST /x HTTP/1.1\r\ncontent-length: x\r\nHost: h")
    assert not may_be_malformed_length(b"POST /x HTTP/1.1\r\nBad Name: x")
    assert not may_be_malformed_length(b"POST /x HTTP/1.1\r\nContent-Length: 12\r\nHo")
    assert not may_be_malformed_length(b"POST /x HT")


_token = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-"), min_size=1, max_size=12)
_value = st.text(st.sampled_from("0123456789 hiom-x+"), max_size=8)


@given(before=st.lists(st.tuples(_token, _value), max_size=4), after=st.lists(st.tuples(_token, _value),
                                                                               max_size=4),
       length=_value, cut=st.integers(0, 400))
def test_malformed_length_finds_the_one_bad_content_length_and_drops_only_its_line(
        before: list[tuple[str, str]], after: list[tuple[str, str]], length: str, cut: int) -> None:
    others = [(n, v) for n, v in before + after if n not in ("content-length", "transfer-encoding")]
    lines = [f"{n}: {v}" for n, v in others[:len(before)]]
    rest = [f"{n}: {v}" for n, v in others[len(before):]]
    head = "\r\n".join(["POST /x HTTP/1.1", *lines, f"Content-Length: {length}", *rest, "", ""]).encode()
    found = malformed_length(head)
    if length.strip(" \t").isdigit():
        assert found is None
    else:
        assert found == ("\r\n".join(["POST /x HTTP/1.1", *lines, *rest, "", ""]).encode(),
                         length.strip(" \t").encode())
    # A start of the head: found only once the Content-Length line is complete, then the same value.
    part = head[:cut]
    complete = part.find(f"Content-Length: {length}\r\n".encode()) >= 0
    got = malformed_length(part)
    assert (got is not None) == (complete and found is not None)
    if got is not None and found is not None:
        assert got[1] == found[1]
    # Two lengths, or a Transfer-Encoding, frame the body otherwise: never handed over.
    assert malformed_length(head.replace(b"\r\n\r\n", b"\r\nContent-Length: 5\r\n\r\n")) is None
    assert malformed_length(head.replace(b"\r\n\r\n", b"\r\nTransfer-Encoding: chunked\r\n\r\n")) is None
