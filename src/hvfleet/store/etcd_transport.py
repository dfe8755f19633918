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

import asyncio
import base64
import contextlib
import json
import random
import select
import socket
import struct
import threading
import time
import weakref
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from etcd3gw import exceptions as etcd_errors

from hvfleet.model.errors import Gone, InvalidInput, TooLarge, Unavailable

# Rounds over all endpoints, each refusing the connection, before giving up early.
REFUSED_ROUNDS = 3
# Idle asyncio connections kept per event loop and endpoint: a burst of writes
# on the loop opens one connection per write in flight; once it is over this
# many stay open for the next ones and the rest are closed (each is a socket
# here and a goroutine and buffers in the member's gateway).
ASYNC_IDLE_KEPT = 8


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
    """`etcd://host:port[,host:port...][?prefix=/p&timeout=S&follow=all|prefix]` → endpoints, options."""
    parts = urlsplit(url)
    if parts.scheme != "etcd" or not parts.netloc:
        raise InvalidInput(f"store: {url!r} is not an etcd URL (etcd://HOST:PORT[,HOST:PORT])")
    endpoints: list[str] = []
    for ep in parts.netloc.split(","):
        host, sep, port = ep.strip().rpartition(":")
        if not sep or not host or not port.isdecimal() or not 0 < int(port) < 65536:
            raise InvalidInput(f"store: etcd endpoint {ep!r} in {url!r} is not HOST:PORT")
        endpoints.append(f"{host}:{int(port)}")
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(options) - {"prefix", "timeout", "follow"}
    if unknown:
        raise InvalidInput(
            f"store: unknown option {sorted(unknown)[0]!r} in {url!r} (known: prefix, timeout, follow)"
        )
    return endpoints, options


# What a store's watches of its every object follow (`?follow=`): every key of
# the etcd (its other writers' writes, dropped by key, reach the watches as
# progress) or only the store's prefix. See docs/etcd.md, "Sharing an etcd".
FOLLOW_ALL = "all"
FOLLOW_PREFIX = "prefix"
FOLLOW_CHOICES = (FOLLOW_ALL, FOLLOW_PREFIX)


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


def _result(status: int, reason: str, text: bytes) -> dict[str, Any]:
    """The answer's JSON, or its status as etcd3gw's error class."""
    if status != 200:
        error = _ERRORS_BY_STATUS.get(status, etcd_errors.Etcd3Exception)
        raise error(text.decode("utf-8", "replace"), reason)
    out: dict[str, Any] = json.loads(text)
    return out


def _failed(exc: Exception, endpoint: str) -> etcd_errors.Etcd3Exception:
    """A connection's failure as etcd3gw's error class (the failover's input)."""
    if isinstance(exc, (TimeoutError, BlockingIOError)):  # BlockingIOError: SO_RCVTIMEO/SO_SNDTIMEO ran out
        return etcd_errors.ConnectionTimeoutError(f"{endpoint}: timed out")
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
    return etcd_errors.ConnectionFailedError(f"{endpoint}: {why}")


# An answer is read by one parser for both connections (sans I/O): a generator
# over the connection's buffer that yields whenever it needs the next read and
# is sent what was read (b"" once the connection ended).
Reading = Generator[None, bytes, Any]


def _more(buf: bytearray) -> Generator[None, bytes, None]:
    chunk = yield
    if not chunk:
        raise GatewayProtocolError("the connection closed before the answer was complete")
    buf += chunk


def _until(buf: bytearray, mark: bytes) -> Generator[None, bytes, bytes]:
    """The buffered bytes up to `mark` (taken, with the mark)."""
    while (end := buf.find(mark)) < 0:
        if len(buf) > _MAX_ANSWER_HEAD:
            raise GatewayProtocolError("the answer's head or a chunk size line is too long")
        yield from _more(buf)
    out = bytes(buf[:end])
    del buf[: end + len(mark)]
    return out


def _exactly(buf: bytearray, size: int) -> Generator[None, bytes, bytes]:
    while len(buf) < size:
        yield from _more(buf)
    out = bytes(buf[:size])
    del buf[:size]
    return out


def _chunked(buf: bytearray) -> Generator[None, bytes, bytes]:
    parts: list[bytes] = []
    while True:
        size = int((yield from _until(buf, b"\r\n")).split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (yield from _until(buf, b"\r\n")):  # trailers, up to the empty line
                pass
            return b"".join(parts)
        parts.append((yield from _exactly(buf, size)))
        if (yield from _until(buf, b"\r\n")):
            raise GatewayProtocolError("a chunk is longer than its size says")


def _read_answer(buf: bytearray) -> Generator[None, bytes, tuple[int, str, bytes, bool]]:
    """(status, reason, body, whether the connection may be kept)."""
    lines = (yield from _until(buf, b"\r\n\r\n")).split(b"\r\n")
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
        body = yield from _chunked(buf)
    elif length is not None:
        body = yield from _exactly(buf, length)
    else:  # delimited by the end of the connection
        while chunk := (yield):
            buf += chunk
        body, keep = bytes(buf), False
        buf.clear()
    return int(code), reason.decode("latin-1"), body, keep


class _Member:
    """What both connections to one member's gateway keep: its address, and
    the buffer an answer is read into."""

    def __init__(self, endpoint: str, api_path: str) -> None:
        host, _, port = endpoint.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.api_path = api_path
        self._host_header = endpoint.encode("ascii")
        self._buffer = bytearray()

    def _request(self, path: str, body: dict[str, Any]) -> bytes:
        """One gateway request, head and body, as one buffer to send."""
        data = json.dumps(body, separators=(",", ":")).encode()
        head = (b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                b"Accept: application/json\r\nContent-Length: %d\r\n\r\n"
                % ((self.api_path + path).encode("ascii"), self._host_header, len(data)))
        return head + data


class GatewayConnection(_Member):
    """One keep-alive HTTP/1.1 connection to one member's JSON gateway, used by
    one thread: a request is one `sendall` of its head and body, the answer
    is read from the socket into one buffer (Content-Length or chunked). First
    `requests` (etcd3gw's session: cookie jars, hooks, URL parsing, header
    merging), then `http.client` (its request building and email-parser
    headers) were most of a gateway call's own CPU, on every write
    (docs/scaling.md, "The cost of a write"). Failures are etcd3gw's exception
    classes, as before, so the failover above is unchanged."""

    def __init__(self, endpoint: str, api_path: str = "/v3/") -> None:
        super().__init__(endpoint, api_path)
        self._sock: socket.socket | None = None
        self._timeout: float | None = None  # the kernel's timeouts set on the socket

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
        request = self._request(path, body)
        try:
            sock = self._socket(timeout)
            sock.sendall(request)
            status, reason, text, keep = self._answer(sock)
        except (OSError, GatewayProtocolError, ValueError) as exc:
            self.close()
            raise _failed(exc, f"{self.host}:{self.port}") from exc
        if not keep:
            self.close()
        return _result(status, reason, text)

    def _answer(self, sock: socket.socket) -> tuple[int, str, bytes, bool]:
        """(status, reason, body, whether the connection may be kept)."""
        reading = _read_answer(self._buffer)
        try:
            next(reading)
            while True:
                reading.send(sock.recv(65536))
        except StopIteration as done:
            answer: tuple[int, str, bytes, bool] = done.value
            return answer

    def close(self) -> None:
        sock, self._sock = self._sock, None
        self._buffer.clear()
        if sock is not None:
            with contextlib.suppress(Exception):
                sock.close()


class AsyncGatewayConnection(_Member):
    """The same connection for an asyncio event loop: a request awaited on the
    loop itself, no thread crossed (a Lease renewal's one transaction,
    docs/scaling.md "The lease fast path"). Used by one request at a time (the
    transport keeps idle ones per loop); the answer is read by the same
    parser as GatewayConnection's; failures are the same error classes."""

    def __init__(self, endpoint: str, api_path: str = "/v3/") -> None:
        super().__init__(endpoint, api_path)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _stream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = self._reader, self._writer
        if reader is not None and writer is not None and (reader.at_eof() or writer.is_closing()):
            # Kept, but the member closed it meanwhile: a new one, rather than a
            # lost answer reported for a request that never left.
            self.close()
            reader = writer = None
        if reader is None or writer is None:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            with contextlib.suppress(OSError):
                writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._reader, self._writer = reader, writer
            self._buffer.clear()
        return reader, writer

    async def post(self, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        request = self._request(path, body)
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await self._stream()
                writer.write(request)
                status, reason, text, keep = await self._answer(reader)
        except (OSError, GatewayProtocolError, ValueError) as exc:  # TimeoutError is an OSError
            self.close()
            raise _failed(exc, f"{self.host}:{self.port}") from exc
        except BaseException:
            self.close()  # cancelled mid-answer: the connection's state is unknown
            raise
        if not keep:
            self.close()
        return _result(status, reason, text)

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[int, str, bytes, bool]:
        reading = _read_answer(self._buffer)
        try:
            next(reading)
            while True:
                reading.send(await reader.read(65536))
        except StopIteration as done:
            answer: tuple[int, str, bytes, bool] = done.value
            return answer

    def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        self._buffer.clear()
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()


def _close_all(connections: list[AsyncGatewayConnection]) -> None:
    for c in connections:
        c.close()


def _txn_result(out: dict[str, Any], ambiguous: bool) -> TxnResult:
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


class _Attempts:
    """One request's failover over the endpoints (shared by `post` and
    `post_async`): a member that is down, has no leader or timed out is left
    for the next one until `unavailable_after` seconds have passed; after a
    full round a short pause (an election takes about one election timeout)."""

    def __init__(self, transport: EtcdTransport, what: str) -> None:
        if transport.closed:
            raise Unavailable(f"store {transport.url}: closed")
        self.transport, self.what = transport, what
        self.deadline = time.monotonic() + transport.unavailable_after
        self.ambiguous = False  # an earlier attempt failed without an answer
        self.tried = 0
        self.refused = 0  # consecutive "connection refused" answers

    def timeout(self) -> float:
        return max(0.05, min(self.transport.request_timeout, self.deadline - time.monotonic()))

    def failed(self, exc: etcd_errors.Etcd3Exception, index: int, body: dict[str, Any]) -> float:
        """After attempt `index` failed with `exc`: raise what the caller gets,
        or move on to the next endpoint and return how long to pause first."""
        t, what = self.transport, self.what
        text = exc.detail_text or ""
        if "compacted" in text:
            raise Gone(f"store {t.url}: {what}: revision was compacted") from None
        if "request is too large" in text or "larger than max" in text:
            raise TooLarge(
                f"store {t.url}: {what}: {len(json.dumps(body))} bytes is more than "
                "etcd accepts in one request (--max-request-bytes, 1.5 MiB by default)"
            ) from None
        if "too many operations in txn" in text:
            raise TooLarge(
                f"store {t.url}: {what}: more operations than etcd accepts in one "
                "transaction (--max-txn-ops, 128 by default)"
            ) from None
        if "database space exceeded" in text:
            raise Unavailable(
                f"store {t.url}: {what}: etcd's database quota is full (compact and "
                "defragment, or raise --quota-backend-bytes)"
            ) from None
        if not retryable(exc):
            raise Unavailable(
                f"store {t.url}: {what}: etcd {t.endpoints[index]} refused the "
                f"request: {reason(exc)}"
            ) from None
        self.ambiguous = True
        why = reason(exc)
        last = f"{t.endpoints[index]}: {why}"
        self.refused = self.refused + 1 if why == "connection refused" else 0
        if time.monotonic() >= self.deadline:
            raise t.unavailable(what, last)
        if self.refused >= REFUSED_ROUNDS * len(t.endpoints):
            # Nothing listens on any endpoint (a wrong address, or the whole
            # cluster is down): say so now rather than after the full wait.
            raise Unavailable(
                f"store {t.url}: {what}: every etcd endpoint refused the connection "
                f"(last: {last})"
            )
        t.move_on(index)
        self.tried += 1
        if self.tried % len(t.endpoints):
            return 0.0
        rounds = self.tried // len(t.endpoints)
        pause = min(0.02 * 2.0**rounds, 0.5) * (0.5 + random.random())
        return min(pause, max(0.0, self.deadline - time.monotonic()))


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
        self._async_idle: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[int, list[AsyncGatewayConnection]]] = weakref.WeakKeyDictionary()
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
        attempts = _Attempts(self, what)
        while True:
            index = self.current
            try:
                return self._client(index).post(path, body, attempts.timeout()), attempts.ambiguous
            except etcd_errors.Etcd3Exception as exc:
                pause = attempts.failed(exc, index, body)
            if pause:
                time.sleep(pause)

    async def post_async(self, path: str, body: dict[str, Any], what: str) -> tuple[dict[str, Any], bool]:
        """`post`, awaited on the running event loop (its own connections, one
        per request in flight, at most ASYNC_IDLE_KEPT per endpoint kept open
        once idle), with the same failover and errors."""
        attempts = _Attempts(self, what)
        idle = self._idle_async()
        while True:
            index = self.current
            waiting = idle.setdefault(index, [])
            client = waiting.pop() if waiting else AsyncGatewayConnection(self.endpoints[index])
            try:
                answer = await client.post(path, body, attempts.timeout())
            except etcd_errors.Etcd3Exception as exc:
                pause = attempts.failed(exc, index, body)
            else:
                if not self.closed and len(waiting) < ASYNC_IDLE_KEPT:
                    waiting.append(client)
                else:
                    client.close()
                return answer, attempts.ambiguous
            if pause:
                await asyncio.sleep(pause)

    def _idle_async(self) -> dict[int, list[AsyncGatewayConnection]]:
        """The running loop's idle connections, by endpoint."""
        if self.closed:
            raise Unavailable(f"store {self.url}: closed")
        loop = asyncio.get_running_loop()
        with self._sessions_lock:
            return self._async_idle.setdefault(loop, {})

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
        return _txn_result(*self.post("kv/txn", body, what))

    async def txn_async(self, compare: list[dict[str, Any]], success: list[dict[str, Any]],
                        failure: list[dict[str, Any]], what: str) -> TxnResult:
        """`txn`, awaited on the running event loop (`post_async`)."""
        return _txn_result(*await self.post_async(
            "kv/txn", {"compare": compare, "success": success, "failure": failure}, what))

    def close(self) -> None:
        self.closed = True
        with self._sessions_lock:
            for client in self._clients:
                client.close()
            self._clients.clear()
            pools = list(self._async_idle.items())
            self._async_idle.clear()
        for loop, idle in pools:
            kept = [c for waiting in idle.values() for c in waiting]
            # A loop's connections are closed on that loop (a stream is not thread-safe).
            with contextlib.suppress(RuntimeError):  # the loop has stopped: nothing to close on
                loop.call_soon_threadsafe(_close_all, kept)
