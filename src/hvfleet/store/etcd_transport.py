"""Talking to etcd v3 through its JSON gateway (etcd3gw), whatever the member.

Owns the endpoints and failover, the wire shapes (base64 keys and values,
range/txn bodies, compares and operations), and turning etcd's failures into
hvfleet's error classes: a member that is down, has no leader or timed out is
left for the next one until `unavailable_after` seconds have passed, then
Unavailable names the endpoints; a compacted revision is Gone; a request etcd
finds too large is TooLarge. It knows nothing of hvfleet objects.

A request whose answer was lost (the member died after accepting it) is sent
again, so a write may already have been applied once: its result says so
(`TxnResult.ambiguous`) and `landed()` tells, from what the key holds now,
whether that earlier attempt was this very write.
"""

from __future__ import annotations

import base64
import contextlib
import json
import random
import select
import socket
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from etcd3gw import exceptions as etcd_errors

from hvfleet.model.errors import Gone, InvalidInput, TooLarge, Unavailable

# Rounds over all endpoints, each refusing the connection, before giving up early.
REFUSED_ROUNDS = 3


def b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def unb64(data: str) -> bytes:
    return base64.b64decode(data)


def prefix_end(prefix: str) -> str:
    """The first key after every key starting with `prefix` (etcd's range_end)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return raw.decode()


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    version: int
    lease: int = 0

    @staticmethod
    def from_json(kv: dict[str, Any]) -> KeyValue:
        return KeyValue(
            key=unb64(kv["key"]).decode(),
            value=unb64(kv.get("value", "")),
            mod_revision=int(kv.get("mod_revision", 0)),
            create_revision=int(kv.get("create_revision", 0)),
            version=int(kv.get("version", 0)),
            lease=int(kv.get("lease", 0)),
        )


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int
    # Key-values of the range requests of the branch that ran, one list each.
    ranges: list[list[KeyValue]]
    # True when an earlier attempt of this very transaction failed without an
    # answer: it may have been applied (see the module docstring).
    ambiguous: bool

    def first(self, index: int = 0) -> KeyValue | None:
        """The key-value of the `index`-th range request, if the key exists."""
        if index < len(self.ranges) and self.ranges[index]:
            return self.ranges[index][0]
        return None


def landed(result: TxnResult, expected: Sequence[bytes | None]) -> int | None:
    """The lost-answer recovery, for every write: after a transaction whose
    compares failed, whether an earlier attempt of it, whose answer was lost,
    was applied. `expected[i]` is what the write left at the key of the failure
    branch's i-th range (its bytes, or None for a delete). If the answer was
    lost and every key holds exactly that, it was this write, applied once:
    the revision it was applied at is returned. Otherwise None (a real
    conflict, reported by the caller)."""
    if not result.ambiguous or len(result.ranges) < len(expected):
        return None
    revision = 0
    for i, want in enumerate(expected):
        kv = result.first(i)
        if want is None:
            if kv is not None:
                return None
        elif kv is None or kv.value != want:
            return None
        else:
            revision = max(revision, kv.mod_revision)
    return revision or result.revision


# -- compares and operations of a transaction ---------------------------------------------

def cmp_mod(key: str, revision: int) -> dict[str, Any]:
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": revision}


def cmp_absent(key: str) -> dict[str, Any]:
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": 0}


def op_put(key: str, value: bytes, lease: int = 0) -> dict[str, Any]:
    put: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease:
        put["lease"] = lease
    return {"request_put": put}


def op_delete(key: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": b64(key)}}


def op_get(key: str, range_end: str | None = None, keys_only: bool = False) -> dict[str, Any]:
    req: dict[str, Any] = {"key": b64(key)}
    if range_end is not None:
        req["range_end"] = b64(range_end)
    if keys_only:
        req["keys_only"] = True
    return {"request_range": req}


# -- URLs -------------------------------------------------------------------------------------

def parse_etcd_url(url: str) -> tuple[list[str], dict[str, str]]:
    """`etcd://host:port[,host:port...][?prefix=/p&timeout=S]` → endpoints, options."""
    parts = urlsplit(url)
    if parts.scheme != "etcd" or not parts.netloc:
        raise InvalidInput(f"store: {url!r} is not an etcd URL (etcd://HOST:PORT[,HOST:PORT])")
    endpoints: list[str] = []
    for ep in parts.netloc.split(","):
        host, sep, port = ep.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidInput(f"store: etcd endpoint {ep!r} in {url!r} is not HOST:PORT")
        endpoints.append(f"{host}:{int(port)}")
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(options) - {"prefix", "timeout"}
    if unknown:
        raise InvalidInput(
            f"store: unknown option {sorted(unknown)[0]!r} in {url!r} (known: prefix, timeout)"
        )
    return endpoints, options


def normalize_prefix(prefix: str) -> str:
    p = "/" + prefix.strip().strip("/")
    if p == "/" or any(not part or part in (".", "..") for part in p[1:].split("/")):
        raise InvalidInput(f"store prefix {prefix!r}: expected a key path such as /hvfleet/fleet-a")
    return p


# -- errors -----------------------------------------------------------------------------------

def reason(exc: Exception) -> str:
    """A short cause for a failed request, for one-line messages."""
    text = getattr(exc, "detail_text", None) or str(exc)
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        body = json.loads(text)
        return str(body.get("message") or body.get("error") or text)[:200]
    if "Connection refused" in text:
        return "connection refused"
    if any(s in text for s in ("Connection reset", "RemoteDisconnected", "Connection aborted")):
        return "connection lost before an answer"
    if isinstance(exc, etcd_errors.ConnectionTimeoutError) or "timed out" in text.lower():
        return "no answer (timed out)"
    return text.splitlines()[0][:200] if text else type(exc).__name__


def retryable(exc: etcd_errors.Etcd3Exception) -> bool:
    """Errors after which another attempt (maybe on another member) can succeed."""
    if isinstance(
        exc,
        etcd_errors.ConnectionFailedError
        | etcd_errors.ConnectionTimeoutError
        | etcd_errors.InternalServerError,
    ):
        return True
    text = (exc.detail_text or "").lower()
    return any(
        s in text
        for s in ("too many requests", "no leader", "leader changed", "timed out", "unavailable")
    )


# The gateway's HTTP answers that mean "try again, maybe elsewhere", as etcd3gw maps them.
_ERRORS_BY_STATUS: dict[int, type[etcd_errors.Etcd3Exception]] = {
    500: etcd_errors.InternalServerError,
    503: etcd_errors.ConnectionFailedError,
    408: etcd_errors.ConnectionTimeoutError,
    504: etcd_errors.ConnectionTimeoutError,
    412: etcd_errors.PreconditionFailedError,
}
# The largest answer head accepted from the gateway (its heads are a few hundred bytes).
_MAX_ANSWER_HEAD = 64 * 1024


class GatewayProtocolError(Exception):
    """The gateway's answer is not HTTP/1.1 as this client reads it."""


class GatewayConnection:
    """One keep-alive HTTP/1.1 connection to one member's JSON gateway, used by
    one thread: a request is one `sendall` of its head and body, the answer
    is read from the socket into one buffer (Content-Length or chunked). First
    `requests` (etcd3gw's session: cookie jars, hooks, URL parsing, header
    merging), then `http.client` (its request building and email-parser
    headers) were most of a gateway call's own CPU, on every write
    (docs/scaling.md, "The cost of a write"). Failures are etcd3gw's exception
    classes, as before, so the failover above is unchanged."""

    def __init__(self, endpoint: str, api_path: str = "/v3/") -> None:
        host, _, port = endpoint.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.api_path = api_path
        self._host_header = endpoint.encode("ascii")
        self._sock: socket.socket | None = None
        self._timeout: float | None = None  # the kernel's timeouts set on the socket
        self._buffer = bytearray()

    def _socket(self, timeout: float) -> socket.socket:
        sock = self._sock
        if sock is not None:
            # A kept connection the member closed meanwhile (idle, restarted) reads
            # as ready (EOF): open a new one rather than send into it and report a
            # lost answer for a request that never left.
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                self.close()
                sock = None
        if sock is None:
            sock = socket.create_connection((self.host, self.port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # Blocking, with the kernel's timeouts: each send and each read is
            # one system call (Python's own timeout polls before each of them).
            sock.settimeout(None)
            self._sock, self._timeout = sock, None
            self._buffer.clear()
        if timeout != self._timeout:
            whole = int(timeout)
            value = struct.pack("ll", whole, int((timeout - whole) * 1e6))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
            self._timeout = timeout
        return sock

    def post(self, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        data = json.dumps(body, separators=(",", ":")).encode()
        head = (b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                b"Accept: application/json\r\nContent-Length: %d\r\n\r\n"
                % ((self.api_path + path).encode("ascii"), self._host_header, len(data)))
        try:
            sock = self._socket(timeout)
            sock.sendall(head + data)
            status, reason, text, keep = self._answer(sock)
        except (TimeoutError, BlockingIOError) as exc:  # BlockingIOError: SO_RCVTIMEO/SO_SNDTIMEO ran out
            self.close()
            raise etcd_errors.ConnectionTimeoutError(f"{self.host}:{self.port}: timed out") from exc
        except (OSError, GatewayProtocolError, ValueError) as exc:
            self.close()
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
            raise etcd_errors.ConnectionFailedError(f"{self.host}:{self.port}: {why}") from exc
        if not keep:
            self.close()
        if status != 200:
            error = _ERRORS_BY_STATUS.get(status, etcd_errors.Etcd3Exception)
            raise error(text.decode("utf-8", "replace"), reason)
        out: dict[str, Any] = json.loads(text)
        return out

    # -- reading an answer -----------------------------------------------------------

    def _fill(self, sock: socket.socket) -> None:
        chunk = sock.recv(65536)
        if not chunk:
            raise GatewayProtocolError("the connection closed before the answer was complete")
        self._buffer += chunk

    def _until(self, sock: socket.socket, mark: bytes) -> bytes:
        """The buffered bytes up to `mark` (taken, with the mark)."""
        buf = self._buffer
        while (end := buf.find(mark)) < 0:
            if len(buf) > _MAX_ANSWER_HEAD:
                raise GatewayProtocolError("the answer's head or a chunk size line is too long")
            self._fill(sock)
        out = bytes(buf[:end])
        del buf[: end + len(mark)]
        return out

    def _exactly(self, sock: socket.socket, size: int) -> bytes:
        buf = self._buffer
        while len(buf) < size:
            self._fill(sock)
        out = bytes(buf[:size])
        del buf[:size]
        return out

    def _answer(self, sock: socket.socket) -> tuple[int, str, bytes, bool]:
        """(status, reason, body, whether the connection may be kept)."""
        lines = self._until(sock, b"\r\n\r\n").split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        code, _, reason = rest.partition(b" ")
        if not version.startswith(b"HTTP/1.") or not code.isdigit():
            raise GatewayProtocolError(f"not an HTTP/1.1 answer: {lines[0][:80]!r}")
        length: int | None = None
        chunked = False
        keep = version == b"HTTP/1.1"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                token = value.strip().lower()
                keep = False if token == b"close" else True if token == b"keep-alive" else keep
        if chunked:
            body = self._chunked(sock)
        elif length is not None:
            body = self._exactly(sock, length)
        else:  # delimited by the end of the connection
            try:
                while True:
                    self._fill(sock)
            except GatewayProtocolError:
                pass
            body, keep = bytes(self._buffer), False
            self._buffer.clear()
        return int(code), reason.decode("latin-1"), body, keep

    def _chunked(self, sock: socket.socket) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int(self._until(sock, b"\r\n").split(b";", 1)[0].strip(), 16)
            if size == 0:
                while self._until(sock, b"\r\n"):  # trailers, up to the empty line
                    pass
                return b"".join(parts)
            parts.append(self._exactly(sock, size))
            if self._until(sock, b"\r\n"):
                raise GatewayProtocolError("a chunk is longer than its size says")

    def close(self) -> None:
        sock, self._sock = self._sock, None
        self._buffer.clear()
        if sock is not None:
            with contextlib.suppress(Exception):
                sock.close()


class EtcdTransport:
    """Requests to the first endpoint of `endpoints` that answers."""

    def __init__(
        self,
        endpoints: Sequence[str],
        url: str,
        *,
        request_timeout: float = 5.0,
        unavailable_after: float = 15.0,
    ) -> None:
        if not endpoints:
            raise InvalidInput("store: etcd needs at least one endpoint (HOST:PORT)")
        self.endpoints = list(endpoints)
        self.url = url
        self.request_timeout = request_timeout
        self.unavailable_after = unavailable_after
        self.current = 0
        self._local = threading.local()
        self._sessions_lock = threading.Lock()
        self._clients: list[GatewayConnection] = []
        self.closed = False

    @property
    def endpoint(self) -> str:
        """The endpoint requests go to now (the next one is tried when it fails)."""
        return self.endpoints[self.current]

    def move_on(self, index: int) -> None:
        """The endpoint at `index` failed: the next request goes to the one after it
        (unless another thread moved on already)."""
        if self.current == index:
            self.current = (index + 1) % len(self.endpoints)

    def _client(self, index: int) -> GatewayConnection:
        """This thread's connection to endpoint `index` (no proxy variables or
        ~/.netrc: etcd is reached directly)."""
        clients: dict[int, GatewayConnection] | None = getattr(self._local, "clients", None)
        if clients is None:
            clients = self._local.clients = {}
        client = clients.get(index)
        if client is None:
            client = GatewayConnection(self.endpoints[index])
            clients[index] = client
            with self._sessions_lock:
                self._clients.append(client)
        return client

    def unavailable(self, what: str, last: str) -> Unavailable:
        return Unavailable(
            f"store {self.url}: {what}: no etcd endpoint answered within "
            f"{self.unavailable_after:g}s (last: {last})"
        )

    def post(self, path: str, body: dict[str, Any], what: str) -> tuple[dict[str, Any], bool]:
        """POST to the first endpoint that answers. Returns the answer and whether an
        earlier attempt failed without one (it may have been applied)."""
        if self.closed:
            raise Unavailable(f"store {self.url}: closed")
        deadline = time.monotonic() + self.unavailable_after
        ambiguous = False
        tried = 0
        refused = 0  # consecutive "connection refused" answers
        while True:
            index = self.current
            client = self._client(index)
            timeout = max(0.05, min(self.request_timeout, deadline - time.monotonic()))
            try:
                return client.post(path, body, timeout), ambiguous
            except etcd_errors.Etcd3Exception as exc:
                text = exc.detail_text or ""
                if "compacted" in text:
                    raise Gone(f"store {self.url}: {what}: revision was compacted") from None
                if "request is too large" in text or "larger than max" in text:
                    raise TooLarge(
                        f"store {self.url}: {what}: {len(json.dumps(body))} bytes is more than "
                        "etcd accepts in one request (--max-request-bytes, 1.5 MiB by default)"
                    ) from None
                if "too many operations in txn" in text:
                    raise TooLarge(
                        f"store {self.url}: {what}: more operations than etcd accepts in one "
                        "transaction (--max-txn-ops, 128 by default)"
                    ) from None
                if "database space exceeded" in text:
                    raise Unavailable(
                        f"store {self.url}: {what}: etcd's database quota is full (compact and "
                        "defragment, or raise --quota-backend-bytes)"
                    ) from None
                if not retryable(exc):
                    raise Unavailable(
                        f"store {self.url}: {what}: etcd {self.endpoints[index]} refused the "
                        f"request: {reason(exc)}"
                    ) from None
                ambiguous = True
                why = reason(exc)
                last = f"{self.endpoints[index]}: {why}"
                refused = refused + 1 if why == "connection refused" else 0
            if time.monotonic() >= deadline:
                raise self.unavailable(what, last)
            if refused >= REFUSED_ROUNDS * len(self.endpoints):
                # Nothing listens on any endpoint (a wrong address, or the whole
                # cluster is down): say so now rather than after the full wait.
                raise Unavailable(
                    f"store {self.url}: {what}: every etcd endpoint refused the connection "
                    f"(last: {last})"
                )
            # Next endpoint; after a full round, back off a little (an election
            # takes about one election timeout).
            self.move_on(index)
            tried += 1
            if tried % len(self.endpoints) == 0:
                rounds = tried // len(self.endpoints)
                pause = min(0.02 * 2**rounds, 0.5) * (0.5 + random.random())
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))

    def range(
        self,
        key: str,
        range_end: str | None = None,
        *,
        limit: int | None = None,
        revision: int | None = None,
        keys_only: bool = False,
        count_only: bool = False,
        what: str = "read",
    ) -> tuple[list[KeyValue], int, bool]:
        """Key-values in [key, range_end), the revision read at, and whether more
        are left beyond `limit`."""
        body: dict[str, Any] = {"key": b64(key)}
        if range_end is not None:
            body["range_end"] = b64(range_end)
        if limit is not None:
            body["limit"] = limit
        if revision is not None:
            body["revision"] = revision
        if keys_only:
            body["keys_only"] = True
        if count_only:
            body["count_only"] = True
        out, _ = self.post("kv/range", body, what)
        kvs = [KeyValue.from_json(kv) for kv in out.get("kvs", [])]
        return kvs, int(out["header"]["revision"]), bool(out.get("more", False))

    def txn(
        self,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]] | None = None,
        what: str = "write",
    ) -> TxnResult:
        body = {"compare": compare, "success": success, "failure": failure or []}
        out, ambiguous = self.post("kv/txn", body, what)
        ranges = [
            [KeyValue.from_json(kv) for kv in r["response_range"].get("kvs", [])]
            for r in out.get("responses", [])
            if "response_range" in r
        ]
        return TxnResult(
            succeeded=bool(out.get("succeeded", False)),
            revision=int(out["header"]["revision"]),
            ranges=ranges,
            ambiguous=ambiguous,
        )

    def close(self) -> None:
        self.closed = True
        with self._sessions_lock:
            for client in self._clients:
                client.close()
            self._clients.clear()
