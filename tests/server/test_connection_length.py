"""A request whose Content-Length is not a number (server/connection.py,
`malformed_length`): llhttp refuses its head, and uvicorn would answer a
plain-text 400 of its own before any app sees it. `hvfleet serve` (httptools)
hands such a head to the app without a body, whose framing is unknown, and
closes the connection after the answer: the Placement API answers it as
Placement does (400 "content-length header must be an integer" in its error
body), the Kubernetes-shaped API with a 400 Status and no handler run. A
head with another fault still gets uvicorn's 400."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import time

from hypothesis import given
from hypothesis import strategies as st

from hvfleet.server.connection import malformed_length
from tests.support.serve import Server

GV = "/apis/hvfleet.io/v1"


def _send(server: Server, pieces: list[bytes]) -> tuple[int, dict[str, str], bytes]:
    """Send `pieces` one write apart; (status, headers, body) of the answer,
    read until the server closes the connection."""
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
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def _head(method: str, path: str, token: str, length: str, *, more: str = "") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: hvfleet\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\nX-Auth-Token: {token}\r\n{more}\r\n").encode()


def test_placement_answers_a_content_length_that_is_not_a_number_as_placement_does(server: Server) -> None:
    body = json.dumps({"name": "rp-bad-length"}).encode()
    status, headers, answer = _send(server, [
        _head("POST", "/placement/resource_providers", server.tokens["admin"], "hi mom") + body])
    assert status == 400, answer
    assert headers["connection"] == "close" and headers["content-type"].startswith("application/json")
    error = json.loads(answer)["errors"][0]
    assert error["status"] == 400 and "content-length header must be an integer" in error["detail"]
    # Nothing was created: the request never reached a handler.
    listed = server.session(server.tokens["admin"]).get(
        f"{server.url}/placement/resource_providers?name=rp-bad-length", timeout=10)
    assert listed.json()["resource_providers"] == []


def test_a_head_split_inside_its_bad_content_length_is_answered_the_same(server: Server) -> None:
    raw = _head("POST", "/placement/resource_providers", server.tokens["admin"], "12x")
    cut = raw.index(b"12x") + 2
    status, _, answer = _send(server, [raw[:cut], raw[cut:] + b'{"name": "x"}'])
    assert status == 400 and "content-length header must be an integer" in answer.decode()


def test_the_kubernetes_api_refuses_it_with_a_status_and_runs_no_handler(server: Server) -> None:
    doc = {"apiVersion": "hvfleet.io/v1", "kind": "OvercommitPolicy", "metadata": {"name": "bad-length"},
           "spec": {"overcommit": {"cpu": 2.0}}}
    status, _, answer = _send(server, [
        _head("POST", f"{GV}/overcommitpolicies", server.tokens["admin"], "-1",
              more=f"Authorization: Bearer {server.tokens['admin']}\r\n") + json.dumps(doc).encode()])
    assert status == 400
    got = json.loads(answer)
    assert got["kind"] == "Status" and got["reason"] == "BadRequest" and "Content-Length" in got["message"]
    r = server.session(server.tokens["admin"]).get(f"{server.url}{GV}/overcommitpolicies/bad-length",
                                                   timeout=10)
    assert r.status_code == 404


def test_a_head_with_another_fault_gets_the_plain_400(server: Server) -> None:
    raw = _head("POST", "/placement/resource_providers", server.tokens["admin"], "hi", more="Bad Name: x\r\n")
    status, headers, answer = _send(server, [raw])
    assert status == 400 and headers["content-type"].startswith("text/plain"), answer


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
