"""The distributed store: etcd v3, through its JSON gateway with etcd3gw.

Every object is one key, `{prefix}/objects/{Kind}/{name}`, holding the object
as JSON without its resourceVersion: the resourceVersion *is* the key's etcd
mod_revision, so it can never disagree with the store. Every write is one etcd
transaction that compares the revision it read (create: create_revision == 0,
update/delete: mod_revision == the one read) and, for a Reservation, also
bumps its host's reservation-set key, which is what lets `claim` check a host
and all of its reservations and write a new one in one transaction without a
lock. Field ownership (`prepare_create`/`prepare_update`) is computed on the
object read at the revision the transaction then compares, so the check and
the write cannot be split by another writer. Agent liveness is an etcd lease
per hypervisor (`keepalive`/`agent_liveness`). The key layout is in docs/etcd.md.

Several endpoints are tried in turn; a request that fails because its member
is down, has no leader or timed out moves to the next one until
`unavailable_after` seconds have passed, then raises Unavailable naming the
endpoints. A write whose answer was lost (the member died after accepting it)
is retried, and if the retry finds exactly the bytes it meant to write, that
was this write: it succeeded once, not twice.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import http.client
import json
import queue
import random
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

import etcd3gw
from etcd3gw import exceptions as etcd_errors

from hvfleet.model.errors import (
    AlreadyExists,
    Conflict,
    Gone,
    InvalidInput,
    NotFound,
    Unavailable,
)
from hvfleet.model.hypervisor import KINDS, STORED_KINDS, Hypervisor, Reservation, Resource
from hvfleet.model.selectors import Selector
from hvfleet.store.base import (
    ClaimCheck,
    EventType,
    ListResult,
    StaleVersion,
    Store,
    WatchEvent,
    as_selector,
    kind_of,
)
from hvfleet.store.ownership import prepare_create, prepare_update

DEFAULT_PREFIX = "/hvfleet"
# Objects per range request when listing: keeps each response far below etcd's
# and the gateway's message limits even for large Hypervisor objects.
LIST_PAGE = 500
# Rounds over all endpoints, each refusing the connection, before giving up early.
REFUSED_ROUNDS = 3
# A watch with a timeout waits at least this long for etcd to send the history
# it asked for (etcd syncs lagging watchers every 100 ms).
CATCH_UP_GRACE_S = 0.5
# Objects whose last-seen value is kept to save a read before an update.
SEEN_CACHE = 4096
# How long a claim keeps retrying while its host or the host's reservations
# change under it before giving up with a Conflict.
CLAIM_DEADLINE_S = 30.0


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def _unb64(data: str) -> bytes:
    return base64.b64decode(data)


def _prefix_end(prefix: str) -> str:
    """The first key after every key starting with `prefix` (etcd's range_end)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return raw.decode()


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


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
            key=_unb64(kv["key"]).decode(),
            value=_unb64(kv.get("value", "")),
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


def _reason(exc: Exception) -> str:
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


def _retryable(exc: etcd_errors.Etcd3Exception) -> bool:
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


class EtcdStore(Store):
    def __init__(
        self,
        endpoints: Sequence[str],
        prefix: str = DEFAULT_PREFIX,
        *,
        request_timeout: float = 5.0,
        unavailable_after: float = 15.0,
    ) -> None:
        if not endpoints:
            raise InvalidInput("store: etcd needs at least one endpoint (HOST:PORT)")
        self.endpoints = list(endpoints)
        self.prefix = normalize_prefix(prefix)
        self.request_timeout = request_timeout
        self.unavailable_after = unavailable_after
        self.url = "etcd://" + ",".join(self.endpoints)
        if self.prefix != DEFAULT_PREFIX:
            self.url += f"?prefix={self.prefix}"
        self._current = 0
        self._local = threading.local()
        self._sessions_lock = threading.Lock()
        self._clients: list[etcd3gw.Etcd3Client] = []
        self._leases: dict[str, int] = {}
        self._closed = False
        # key -> (mod_revision, value) of objects this store read or wrote. A key's
        # value at a given mod_revision never changes, so an update naming that
        # revision can skip reading the old object again: one round trip, and a
        # shorter window for a concurrent writer.
        self._seen: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        self._seen_lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        """The endpoint requests go to now (the next one is tried when it fails)."""
        return self.endpoints[self._current]

    @classmethod
    def from_url(
        cls, url: str, prefix: str | None = None, *, default_prefix: str | None = None
    ) -> EtcdStore:
        """`prefix`, else the URL's `?prefix=`, else `default_prefix`, else /hvfleet."""
        endpoints, options = parse_etcd_url(url)
        timeout = options.get("timeout")
        kwargs: dict[str, float] = {}
        if timeout is not None:
            try:
                kwargs["unavailable_after"] = float(timeout)
            except ValueError:
                raise InvalidInput(
                    f"store: timeout={timeout!r} in {url!r} is not a number of seconds"
                ) from None
            kwargs["request_timeout"] = min(5.0, kwargs["unavailable_after"])
        chosen = prefix or options.get("prefix") or default_prefix or DEFAULT_PREFIX
        return cls(endpoints, chosen, **kwargs)

    # -- keys ----------------------------------------------------------------------------

    def _key(self, kind: str, name: str) -> str:
        return f"{self.prefix}/objects/{kind}/{name}"

    def _kind_prefix(self, kind: str | None) -> str:
        return f"{self.prefix}/objects/" + (f"{kind}/" if kind else "")

    def _reservation_set_key(self, host: str) -> str:
        return f"{self.prefix}/reservation-sets/{host}"

    def _reservation_index_prefix(self, host: str) -> str:
        return f"{self.prefix}/reservation-index/{host}/"

    def _lease_key(self, name: str) -> str:
        return f"{self.prefix}/leases/{name}"

    def _holder_key(self, name: str) -> str:
        return f"{self.prefix}/lease-holders/{name}"

    # -- transport -----------------------------------------------------------------------

    def _client(self, index: int) -> etcd3gw.Etcd3Client:
        clients: dict[int, etcd3gw.Etcd3Client] | None = getattr(self._local, "clients", None)
        if clients is None:
            clients = self._local.clients = {}
        client = clients.get(index)
        if client is None:
            host, _, port = self.endpoints[index].rpartition(":")
            client = etcd3gw.client(
                host=host, port=int(port), timeout=self.request_timeout, api_path="/v3/"
            )
            clients[index] = client
            with self._sessions_lock:
                self._clients.append(client)
        return client

    def _unavailable(self, what: str, last: str) -> Unavailable:
        return Unavailable(
            f"store {self.url}: {what}: no etcd endpoint answered within "
            f"{self.unavailable_after:g}s (last: {last})"
        )

    def _post(self, path: str, body: dict[str, Any], what: str) -> tuple[dict[str, Any], bool]:
        """POST to the first endpoint that answers. Returns the answer and whether an
        earlier attempt failed without one (it may have been applied)."""
        if self._closed:
            raise Unavailable(f"store {self.url}: closed")
        deadline = time.monotonic() + self.unavailable_after
        ambiguous = False
        tried = 0
        refused = 0  # consecutive "connection refused" answers
        while True:
            index = self._current
            client = self._client(index)
            client.timeout = max(0.05, min(self.request_timeout, deadline - time.monotonic()))
            try:
                out: dict[str, Any] = client.post(client.get_url(path), json=body)
                return out, ambiguous
            except etcd_errors.Etcd3Exception as exc:
                text = exc.detail_text or ""
                if "compacted" in text:
                    raise Gone(f"store {self.url}: {what}: revision was compacted") from None
                if "request is too large" in text or "larger than max" in text:
                    raise InvalidInput(
                        f"store {self.url}: {what}: {len(json.dumps(body))} bytes is more than "
                        "etcd accepts in one request (--max-request-bytes, 1.5 MiB by default)"
                    ) from None
                if "database space exceeded" in text:
                    raise Unavailable(
                        f"store {self.url}: {what}: etcd's database quota is full (compact and "
                        "defragment, or raise --quota-backend-bytes)"
                    ) from None
                if not _retryable(exc):
                    raise Unavailable(
                        f"store {self.url}: {what}: etcd {self.endpoints[index]} refused the "
                        f"request: {_reason(exc)}"
                    ) from None
                ambiguous = True
                reason = _reason(exc)
                last = f"{self.endpoints[index]}: {reason}"
                refused = refused + 1 if reason == "connection refused" else 0
            if time.monotonic() >= deadline:
                raise self._unavailable(what, last)
            if refused >= REFUSED_ROUNDS * len(self.endpoints):
                # Nothing listens on any endpoint (a wrong address, or the whole
                # cluster is down): say so now rather than after the full wait.
                raise Unavailable(
                    f"store {self.url}: {what}: every etcd endpoint refused the connection "
                    f"(last: {last})"
                )
            # Next endpoint; after a full round, back off a little (an election
            # takes about one election timeout).
            if self._current == index:
                self._current = (index + 1) % len(self.endpoints)
            tried += 1
            if tried % len(self.endpoints) == 0:
                rounds = tried // len(self.endpoints)
                pause = min(0.02 * 2**rounds, 0.5) * (0.5 + random.random())
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))

    def _range(
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
        body: dict[str, Any] = {"key": _b64(key)}
        if range_end is not None:
            body["range_end"] = _b64(range_end)
        if limit is not None:
            body["limit"] = limit
        if revision is not None:
            body["revision"] = revision
        if keys_only:
            body["keys_only"] = True
        if count_only:
            body["count_only"] = True
        out, _ = self._post("kv/range", body, what)
        kvs = [KeyValue.from_json(kv) for kv in out.get("kvs", [])]
        return kvs, int(out["header"]["revision"]), bool(out.get("more", False))

    def _txn(
        self,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]] | None = None,
        what: str = "write",
    ) -> TxnResult:
        body = {"compare": compare, "success": success, "failure": failure or []}
        out, ambiguous = self._post("kv/txn", body, what)
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

    def _remember(self, key: str, revision: int, value: bytes) -> None:
        with self._seen_lock:
            self._seen[key] = (revision, value)
            self._seen.move_to_end(key)
            while len(self._seen) > SEEN_CACHE:
                self._seen.popitem(last=False)

    def _recall(self, key: str, revision: int) -> bytes | None:
        with self._seen_lock:
            hit = self._seen.get(key)
        return hit[1] if hit is not None and hit[0] == revision else None

    # -- encoding ------------------------------------------------------------------------

    @staticmethod
    def _encode(obj: Resource) -> bytes:
        data = obj.to_dict()
        data["metadata"].pop("resourceVersion", None)
        return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()

    @staticmethod
    def _decode(kind: str, value: bytes, revision: int) -> Resource:
        data = json.loads(value)
        data["metadata"]["resourceVersion"] = str(revision)
        return STORED_KINDS[kind].model_validate(data)

    def _decode_kv(self, kv: KeyValue) -> Resource:
        kind, _, _ = kv.key.removeprefix(self._kind_prefix(None)).partition("/")
        return self._decode(kind, kv.value, kv.mod_revision)

    @staticmethod
    def _with_version(obj: Resource, revision: int) -> Resource:
        meta = obj.metadata.model_copy(update={"resource_version": str(revision)})
        return obj.model_copy(update={"metadata": meta})

    # -- transaction pieces --------------------------------------------------------------

    @staticmethod
    def _cmp_mod(key: str, revision: int) -> dict[str, Any]:
        return {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": revision}

    @staticmethod
    def _cmp_absent(key: str) -> dict[str, Any]:
        return {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": 0}

    @staticmethod
    def _op_put(key: str, value: bytes, lease: int = 0) -> dict[str, Any]:
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = lease
        return {"request_put": put}

    @staticmethod
    def _op_delete(key: str) -> dict[str, Any]:
        return {"request_delete_range": {"key": _b64(key)}}

    @staticmethod
    def _op_get(key: str, range_end: str | None = None, keys_only: bool = False) -> dict[str, Any]:
        req: dict[str, Any] = {"key": _b64(key)}
        if range_end is not None:
            req["range_end"] = _b64(range_end)
        if keys_only:
            req["keys_only"] = True
        return {"request_range": req}

    def _reservation_ops(self, old: Resource | None, new: Resource | None) -> list[dict[str, Any]]:
        """Keep the per-host reservation index and set keys in step with a
        Reservation write: every write that touches a host's reservations bumps
        that host's set key, so a concurrent claim on that host fails its compare."""
        ops: list[dict[str, Any]] = []
        old_host = old.spec.hypervisor if isinstance(old, Reservation) else None
        new_host = new.spec.hypervisor if isinstance(new, Reservation) else None
        either = new if new is not None else old
        name = either.metadata.name if either is not None else ""
        for host in sorted({h for h in (old_host, new_host) if h is not None}):
            ops.append(self._op_put(self._reservation_set_key(host), name.encode()))
        if old_host is not None and old_host != new_host:
            ops.append(self._op_delete(self._reservation_index_prefix(old_host) + name))
        if new_host is not None and new_host != old_host:
            ops.append(self._op_put(self._reservation_index_prefix(new_host) + name, b""))
        return ops

    # -- the contract --------------------------------------------------------------------

    def get(self, kind: str, name: str) -> Resource:
        kind = kind_of(kind)
        kvs, _, _ = self._range(self._key(kind, name), what=f"get {kind} {name}")
        if not kvs:
            raise NotFound(f"{kind} {name!r} not found")
        self._remember(kvs[0].key, kvs[0].mod_revision, kvs[0].value)
        return self._decode(kind, kvs[0].value, kvs[0].mod_revision)

    def list(self, kind: str, selector: Selector | str | None = None) -> ListResult:
        kind = kind_of(kind)
        sel = as_selector(selector)
        for _ in range(5):
            try:
                return self._list_once(kind, sel)
            except Gone:
                # Compacted between two pages: start again at the current revision.
                continue
        raise Unavailable(f"store {self.url}: list {kind}: history compacted during every attempt")

    def _list_once(self, kind: str, sel: Selector) -> ListResult:
        start = self._kind_prefix(kind)
        end = _prefix_end(start)
        items: builtins.list[Resource] = []
        revision: int | None = None
        key = start
        while True:
            # Every page after the first is read at the first page's revision:
            # one consistent snapshot, and the revision a watch continues from.
            kvs, header_rev, more = self._range(
                key, end, limit=LIST_PAGE, revision=revision, what=f"list {kind}"
            )
            if revision is None:
                revision = header_rev
            for kv in kvs:
                obj = self._decode(kind, kv.value, kv.mod_revision)
                if sel.matches(obj.metadata.labels):
                    self._remember(kv.key, kv.mod_revision, kv.value)
                    items.append(obj)
            if not more or not kvs:
                return ListResult(items=items, revision=revision)
            key = kvs[-1].key + "\0"

    def create(self, obj: Resource, manager: str) -> Resource:
        key = self._key(obj.kind, obj.metadata.name)
        stored = prepare_create(obj, manager, _now())
        value = self._encode(stored)
        result = self._txn(
            [self._cmp_absent(key)],
            [self._op_put(key, value), *self._reservation_ops(None, stored)],
            [self._op_get(key)],
            what=f"create {obj.kind} {obj.metadata.name}",
        )
        if result.succeeded:
            self._remember(key, result.revision, value)
            return self._with_version(stored, result.revision)
        current = result.ranges[0][0] if result.ranges and result.ranges[0] else None
        if result.ambiguous and current is not None and current.value == value:
            return self._with_version(stored, current.mod_revision)
        raise AlreadyExists(f"{obj.kind} {obj.metadata.name!r} already exists")

    def update(self, obj: Resource, manager: str, *, force: bool = False) -> Resource:
        kind, name = obj.kind, obj.metadata.name
        key = self._key(kind, name)
        rv = obj.metadata.resource_version
        cached = self._recall(key, int(rv)) if rv is not None and rv.isdigit() else None
        if cached is not None and rv is not None:
            old_revision, old_value = int(rv), cached
        else:
            kvs, _, _ = self._range(key, what=f"update {kind} {name}")
            if not kvs:
                raise NotFound(f"{kind} {name!r} not found")
            old_revision, old_value = kvs[0].mod_revision, kvs[0].value
        old = self._decode(kind, old_value, old_revision)
        stored = prepare_update(old, obj, manager, force=force, now=_now())
        value = self._encode(stored)
        result = self._txn(
            [self._cmp_mod(key, old_revision)],
            [self._op_put(key, value), *self._reservation_ops(old, stored)],
            [self._op_get(key)],
            what=f"update {kind} {name}",
        )
        if result.succeeded:
            self._remember(key, result.revision, value)
            return self._with_version(stored, result.revision)
        current = result.ranges[0][0] if result.ranges and result.ranges[0] else None
        if current is None:
            raise NotFound(f"{kind} {name!r} not found")
        if result.ambiguous and current.value == value:
            return self._with_version(stored, current.mod_revision)
        self._remember(key, current.mod_revision, current.value)
        raise StaleVersion(
            f"{kind} {name}: resourceVersion {obj.metadata.resource_version} is stale "
            f"(current is {current.mod_revision}); re-read and retry"
        )

    def pause_after_conflict(self, attempt: int) -> None:
        """A short jittered pause: with optimistic writes from many processes on
        one object, retrying at once makes the same writers collide again."""
        time.sleep(random.random() * min(0.001 * 2**attempt, 0.1))

    def delete(self, kind: str, name: str, resource_version: str | None = None) -> None:
        kind = kind_of(kind)
        key = self._key(kind, name)
        while True:
            kvs, _, _ = self._range(key, what=f"delete {kind} {name}")
            if not kvs:
                raise NotFound(f"{kind} {name!r} not found")
            current = str(kvs[0].mod_revision)
            if resource_version is not None and resource_version != current:
                raise StaleVersion(
                    f"{kind} {name}: resourceVersion {resource_version} is stale "
                    f"(current is {current})"
                )
            old = self._decode(kind, kvs[0].value, kvs[0].mod_revision)
            result = self._txn(
                [self._cmp_mod(key, kvs[0].mod_revision)],
                [self._op_delete(key), *self._reservation_ops(old, None)],
                [self._op_get(key)],
                what=f"delete {kind} {name}",
            )
            if result.succeeded:
                return
            now_there = result.ranges[0][0] if result.ranges and result.ranges[0] else None
            if now_there is None:
                if result.ambiguous:
                    return  # our first attempt deleted it
                raise NotFound(f"{kind} {name!r} not found (deleted concurrently)")
            if resource_version is not None:
                raise StaleVersion(
                    f"{kind} {name}: resourceVersion {resource_version} is stale "
                    f"(current is {now_there.mod_revision})"
                )
            # Changed between our read and the delete, no version asked: read again.

    def revision(self) -> int:
        _, revision, _ = self._range(self.prefix + "/", count_only=True, what="revision")
        return revision

    def compact(self, revision: int) -> None:
        """Drop history up to `revision` (as etcd's auto-compaction or an operator
        would); watches from before it then raise Gone."""
        self._post("kv/compaction", {"revision": revision, "physical": True}, "compact")

    def claim(self, reservation: Reservation, manager: str, check: ClaimCheck) -> Reservation:
        host_name = reservation.spec.hypervisor
        name = reservation.metadata.name
        host_key = self._key("Hypervisor", host_name)
        res_key = self._key("Reservation", name)
        set_key = self._reservation_set_key(host_name)
        index = self._reservation_index_prefix(host_name)
        what = f"claim Reservation {name} on {host_name}"
        deadline = time.monotonic() + CLAIM_DEADLINE_S
        attempts = 0
        while True:
            attempts += 1
            # 1. One read-only transaction: the host, its set key, its reservation
            #    names and whether the name is taken, all at one revision.
            snap = self._txn(
                [],
                [
                    self._op_get(host_key),
                    self._op_get(set_key),
                    self._op_get(index, _prefix_end(index), keys_only=True),
                    self._op_get(res_key, keys_only=True),
                ],
                what=what,
            )
            host_kvs, set_kvs, index_kvs, taken = snap.ranges
            if not host_kvs:
                raise NotFound(f"Hypervisor {host_name!r} not found")
            if taken:
                raise AlreadyExists(f"Reservation {name!r} already exists")
            host = self._decode("Hypervisor", host_kvs[0].value, host_kvs[0].mod_revision)
            assert isinstance(host, Hypervisor)
            set_cmp = (
                self._cmp_mod(set_key, set_kvs[0].mod_revision)
                if set_kvs
                else self._cmp_absent(set_key)
            )
            # 2. The reservations themselves, only if the set is still the one read.
            others: builtins.list[Reservation] = []
            if index_kvs:
                names = [kv.key.removeprefix(index) for kv in index_kvs]
                got = self._txn(
                    [set_cmp],
                    [self._op_get(self._key("Reservation", n)) for n in names],
                    what=what,
                )
                if not got.succeeded:
                    continue
                for kvs in got.ranges:
                    for kv in kvs:
                        r = self._decode("Reservation", kv.value, kv.mod_revision)
                        assert isinstance(r, Reservation)
                        others.append(r)
            check(host, others)
            # 3. Write, if neither the host nor its reservation set changed since.
            stored = prepare_create(reservation, manager, _now())
            value = self._encode(stored)
            result = self._txn(
                [
                    self._cmp_mod(host_key, host_kvs[0].mod_revision),
                    set_cmp,
                    self._cmp_absent(res_key),
                ],
                [self._op_put(res_key, value), *self._reservation_ops(None, stored)],
                [self._op_get(res_key)],
                what=what,
            )
            if result.succeeded:
                self._remember(res_key, result.revision, value)
                out = self._with_version(stored, result.revision)
                assert isinstance(out, Reservation)
                return out
            current = result.ranges[0][0] if result.ranges and result.ranges[0] else None
            if current is not None:
                if result.ambiguous and current.value == value:
                    out = self._with_version(stored, current.mod_revision)
                    assert isinstance(out, Reservation)
                    return out
                raise AlreadyExists(f"Reservation {name!r} already exists")
            if time.monotonic() > deadline:
                raise Conflict(
                    f"{what}: the host or its reservations changed on each of {attempts} "
                    f"attempts in {CLAIM_DEADLINE_S:g}s; retry"
                )
            time.sleep(random.random() * min(0.002 * attempts, 0.05))

    # -- watch ---------------------------------------------------------------------------

    def watch(
        self,
        kind: str | None = None,
        since: int = 0,
        *,
        name: str | None = None,
        stop: threading.Event | None = None,
        timeout: float | None = None,
    ) -> Iterator[WatchEvent]:
        """Events with revision > since, resuming on another endpoint (from the
        last revision delivered) when a stream breaks. With a `timeout`, history
        up to the revision the watch was created at is delivered first: until it
        has been, the idle timer is at least CATCH_UP_GRACE_S, as etcd sends the
        history asynchronously."""
        if name is not None and not kind:
            raise InvalidInput("watch: a name needs a kind")
        start = self._kind_prefix(kind_of(kind) if kind else None)
        # One key is the range [key, key + NUL): etcd then watches just that key.
        end = _prefix_end(start) if name is None else self._key(kind_of(kind or ""), name) + "\0"
        if name is not None:
            start = self._key(kind_of(kind or ""), name)
        last = since
        idle_base = time.monotonic()
        created_at: int | None = None  # store revision when the current stream began
        down_since: float | None = None
        last_error = ""
        tried = 0

        def stopped() -> bool:
            return stop is not None and stop.is_set()

        def idle_deadline() -> float | None:
            if timeout is None:
                return None
            caught_up = created_at is not None and last >= created_at
            return idle_base + (timeout if caught_up else max(timeout, CATCH_UP_GRACE_S))

        def idle() -> bool:
            deadline = idle_deadline()
            return deadline is not None and time.monotonic() >= deadline

        while not stopped() and not idle():
            index = self._current
            endpoint = self.endpoints[index]
            try:
                stream = _WatchStream(endpoint, start, end, last + 1, self.request_timeout)
            except OSError as exc:
                stream = None
                last_error = f"{endpoint}: {exc}"
            if stream is not None:
                opened_at = time.monotonic()
                try:
                    for msg in stream.messages(stopped, idle_deadline):
                        if msg.get("created"):
                            created_at = int(msg.get("header", {}).get("revision", 0))
                            continue
                        if msg.get("canceled"):
                            compacted = int(msg.get("compact_revision", 0))
                            if compacted:
                                raise Gone(
                                    f"watch: revision {last} was compacted (history starts at "
                                    f"{compacted}); list again and watch from the list's revision"
                                )
                            last_error = f"{endpoint}: {msg.get('cancel_reason', 'watch canceled')}"
                            break
                        for ev in msg.get("events", []):
                            event = self._watch_event(ev)
                            if event.revision <= last:
                                continue  # already delivered before a reconnect
                            last = event.revision
                            idle_base = time.monotonic()
                            down_since, tried = None, 0
                            if kind is None and event.object.kind not in KINDS:
                                continue  # access tokens are not in the all-kinds feed
                            yield event
                    else:
                        if stream.error is None:
                            return  # stopped or idle timeout
                        last_error = f"{endpoint}: {stream.error}"
                finally:
                    stream.close()
            if stopped():
                return
            # The stream broke: another endpoint, from the last revision delivered.
            # A stream that was up for a while starts a new outage; one that breaks
            # right after it was created (e.g. "no leader") continues the old one.
            now = time.monotonic()
            if stream is not None and now - opened_at > self.unavailable_after:
                down_since, tried = None, 0
            if down_since is None:
                down_since = now
            elif timeout is None and time.monotonic() - down_since > self.unavailable_after:
                raise self._unavailable(f"watch from revision {last}", last_error)
            if self._current == index:
                self._current = (index + 1) % len(self.endpoints)
            tried += 1
            if tried % len(self.endpoints) == 0:
                pause = min(0.05 * 2 ** (tried // len(self.endpoints)), 1.0)
                if stop is not None:
                    stop.wait(pause)
                else:
                    time.sleep(pause)

    def _watch_event(self, ev: dict[str, Any]) -> WatchEvent:
        kv = KeyValue.from_json(ev["kv"])
        etype: EventType
        if ev.get("type") == "DELETE":
            etype = "DELETED"
            prev = KeyValue.from_json(ev["prev_kv"])
            obj = self._decode_kv(
                KeyValue(kv.key, prev.value, kv.mod_revision, prev.create_revision, 0)
            )
        else:
            etype = "ADDED" if kv.version == 1 else "MODIFIED"
            obj = self._decode_kv(kv)
        return WatchEvent(type=etype, object=obj, revision=kv.mod_revision)

    # -- agent liveness (etcd leases) ----------------------------------------------------

    def keepalive(self, name: str, ttl: int) -> None:
        self.refresh_lease(name, ttl)

    def refresh_lease(self, name: str, ttl: int) -> int:
        """Keep hypervisor `name`'s liveness lease alive: grant it (TTL `ttl` s) and
        attach `{prefix}/leases/{name}` on the first call or after it expired,
        refresh it otherwise. Returns the seconds the lease now has left. When
        the agent stops calling this, the key vanishes `ttl` s later and
        `agent_liveness()` reports the host as not live."""
        if ttl < 1:
            raise InvalidInput(f"keepalive {name}: ttl {ttl} must be at least 1 second")
        what = f"keepalive {name}"
        key = self._lease_key(name)
        lease_id = self._leases.get(name)
        if lease_id is not None:
            out, _ = self._post("lease/keepalive", {"ID": lease_id}, what)
            left = int(out.get("result", {}).get("TTL", -1))
            if left > 0:
                # Still ours? (Another store of the same agent may have taken the
                # key over and then released it.) Put it back if not.
                self._txn(
                    [{"key": _b64(key), "target": "LEASE", "result": "EQUAL", "lease": lease_id}],
                    [],
                    [self._op_put(key, self._lease_record(name, ttl), lease_id)],
                    what=what,
                )
                return left
        granted, _ = self._post("lease/grant", {"TTL": ttl, "ID": 0}, what)
        lease_id = int(granted["ID"])
        record = self._lease_record(name, ttl)
        # The lease key expires with the lease; the holder key stays, so readers
        # can tell "lease expired" (NotReady) from "never had a lease".
        self._txn(
            [],
            [self._op_put(key, record, lease_id), self._op_put(self._holder_key(name), record)],
            what=what,
        )
        self._leases[name] = lease_id
        return int(granted.get("TTL", ttl))

    @staticmethod
    def _lease_record(name: str, ttl: int) -> bytes:
        record = {"holder": name, "ttlSeconds": ttl, "acquireTime": _now().isoformat()}
        return json.dumps(record, separators=(",", ":")).encode()

    def release(self, name: str) -> None:
        """Revoke `name`'s lease now (a clean agent shutdown): it is not live anymore."""
        lease_id = self._leases.pop(name, None)
        if lease_id is not None:
            self._post("kv/lease/revoke", {"ID": lease_id}, f"release {name}")

    def live_leases(self) -> set[str]:
        """Names whose liveness lease has not expired."""
        return {name for name, live in self.agent_liveness().items() if live}

    def agent_liveness(self) -> dict[str, bool]:
        leases, holders = self._lease_key(""), self._holder_key("")
        snap = self._txn(
            [],
            [
                self._op_get(leases, _prefix_end(leases), keys_only=True),
                self._op_get(holders, _prefix_end(holders), keys_only=True),
            ],
            what="read agent leases",
        )
        live = {kv.key.removeprefix(leases) for kv in snap.ranges[0]}
        held = {kv.key.removeprefix(holders) for kv in snap.ranges[1]}
        return {name: name in live for name in sorted(held | live)}

    def close(self) -> None:
        self._closed = True
        with self._sessions_lock:
            for client in self._clients:
                with contextlib.suppress(Exception):
                    client.session.close()
            self._clients.clear()


class _WatchStream:
    """One etcd watch over the gateway's streaming HTTP, read by a thread.

    The reader thread turns each newline-delimited JSON message into a queue
    item, so the consumer can wait with a timeout and stop at any time; closing
    shuts the socket down, which ends the reader's blocking read."""

    def __init__(
        self, endpoint: str, key: str, range_end: str, start_revision: int, timeout: float
    ) -> None:
        host, _, port = endpoint.rpartition(":")
        self.error: str | None = None
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
        body = json.dumps(
            {
                "create_request": {
                    "key": _b64(key),
                    "range_end": _b64(range_end),
                    "start_revision": start_revision,
                    "prev_kv": True,
                }
            }
        )
        try:
            # "hasleader": etcd cancels the watch if this member loses its leader
            # (a partitioned member would otherwise go silent, not fail).
            self._conn.request(
                "POST",
                "/v3/watch",
                body=body,
                headers={"Content-Type": "application/json", "Grpc-Metadata-hasleader": "true"},
            )
            self._response = self._conn.getresponse()
            if self._response.status != 200:
                detail = self._response.read(2000).decode(errors="replace")
                with contextlib.suppress(ValueError, AttributeError):
                    body = json.loads(detail)
                    detail = str(body.get("message") or body.get("error") or detail)
                raise OSError(f"watch answered HTTP {self._response.status}: {detail.strip()[:200]}")
            sock = self._conn.sock
            if sock is not None:
                sock.settimeout(None)  # the reader blocks; close() unblocks it
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                if hasattr(socket, "TCP_KEEPIDLE"):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 5)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 2)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
        except (OSError, http.client.HTTPException) as exc:
            self._conn.close()
            raise OSError(str(exc) or type(exc).__name__) from None
        self._thread = threading.Thread(
            target=self._read, name=f"etcd-watch-{endpoint}", daemon=True
        )
        self._thread.start()

    def _read(self) -> None:
        try:
            while True:
                line = self._response.readline()
                if not line:
                    self.error = "watch stream closed"
                    break
                if not line.strip():
                    continue
                msg = json.loads(line)
                if "error" in msg:
                    err = msg["error"]
                    self.error = str(err.get("message", err) if isinstance(err, dict) else err)
                    break
                self._queue.put(msg.get("result", {}))
        except Exception as exc:  # close() from another thread can surface as any error here
            self.error = str(exc) or type(exc).__name__
        finally:
            self._queue.put(None)

    def messages(
        self, stopped: Callable[[], bool], deadline: Callable[[], float | None]
    ) -> Iterator[dict[str, Any]]:
        """Messages until the stream ends (then `error` says why), `stopped()` or the
        idle deadline passes (then `error` is None)."""
        while not stopped():
            wait = 0.1
            idle_deadline = deadline()
            if idle_deadline is not None:
                left = idle_deadline - time.monotonic()
                if left <= 0:
                    return
                wait = min(wait, left)
            try:
                msg = self._queue.get(timeout=wait)
            except queue.Empty:
                continue
            if msg is None:
                if self.error is None:
                    self.error = "watch stream closed"
                return
            yield msg

    def close(self) -> None:
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._conn.close()
        self._thread.join(timeout=2)

