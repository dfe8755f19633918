"""The remote Store backend: the Store contract spoken to `hvfleet serve` over its
Kubernetes-shaped HTTPS API (`--store https://HOST:PORT`), as docs/store.md maps it.

It is a thin client: every method is one or two requests, and the server calls
the same method on its own store, so the contract's rules (compare-and-swap,
field ownership, who writes status, atomic batches) are the server store's.
The field manager is the caller's identity, which the server takes from the
bearer token; the `manager` argument is sent only when the store is opened with
`?impersonate=true`, as Kubernetes impersonation (`Impersonate-User`), which
only an admin token may do (the contract suite writes as many managers).
Differences from the embedded backends, all documented in docs/store.md:
`claim` runs the server's scheduling check (the client's `check` cannot run
there), and a create of a Reservation is such a claim.

Transport: the standard library's `http.client`, one keep-alive connection per
thread, TLS verified against the CA of `--ca`/$HVFLEET_CA or of the kubeconfig
($KUBECONFIG, else ~/.kube/config) whose server is this URL, else the system's.
Several replicas may be named (`https://a:8443,https://b:8443`): requests go
to one until it cannot be reached, then to the next. A request that never left
(no connection) is sent to the next one whatever it is; one that may have
reached a replica that then failed is sent again only when that is safe (a
GET; a PUT or DELETE that names the resourceVersion it replaces, so a second
application is a Conflict, never a second write; never a POST). A watch
resumes on the next replica from the last revision it delivered.
Errors map from the answer's meta/v1 Status (reason, code, causes), never from
its message; a server that cannot be reached is Unavailable, naming the URL.
"""

from __future__ import annotations

import builtins
import contextlib
import http.client
import ipaddress
import json
import os
import queue
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from hvfleet.model.errors import (
    AlreadyExists,
    Conflict,
    Forbidden,
    HvfleetError,
    InvalidInput,
    NotFound,
    Unavailable,
)
from hvfleet.model.hypervisor import KINDS, STORED_KINDS, Reservation, Resource
from hvfleet.model.kinds import STRATEGIES, strategy_of
from hvfleet.model.selectors import Selector
from hvfleet.store.base import (
    ClaimCheck,
    ClaimRefused,
    ListResult,
    OwnershipConflict,
    StaleVersion,
    Store,
    WatchEvent,
    Write,
    as_selector,
    changed_parts,
    check_batch,
    gc_paused,
    kind_of,
)
from hvfleet.store.errors import RevisionNotReached
from hvfleet.store.ownership import AGENT_PREFIX
from hvfleet.store.statuses import ERROR_OF_CODE, ERROR_OF_REASON
from hvfleet.store.undecodable import Undecodable

GV = "/apis/hvfleet.io/v1"
BATCH_PATH = f"{GV}/batch"
WHOAMI_PATH = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
DEFAULT_TIMEOUT = 30.0
# A pooled connection idle this long is replaced before use: servers close idle
# keep-alive connections (uvicorn after 5 s by default, `hvfleet serve` after 30 s),
# and a request sent on one they just closed would fail.
_IDLE_REUSE_S = 4.0
# Objects remembered (the last one returned per kind/name) so `update` knows what
# changed without a GET; cleared when it grows past this.
_CACHE_LIMIT = 10_000
# An all-kinds watch merges one stream per kind: an event is held this long for
# earlier events of other kinds still on their way before it is delivered.
MERGE_SETTLE_S = 0.15
# The events of one atomic batch share a revision and arrive together: the last
# event seen is held this long for a next one of the same revision (for
# WatchEvent.last_of_revision).
BATCH_SETTLE_S = 0.02
_POLL_S = 0.05  # how often a waiting watch looks at its `stop` event
_WATCH_SERVER_TIMEOUT_S = 1800  # a watch call's length; the client reconnects after it


def plural_of(kind: str) -> str:
    """The API's plural of a kind (as its CRD names it: policy → policies)."""
    return STRATEGIES[kind].plural


# Where each kind is served: the fleet kinds under their plurals, access tokens
# at the admins' token endpoints (hvfleet.server.token_api), which speak the same
# object mapping (a record whose hash the client made: the secret never travels).
def _collection(kind: str) -> str:
    return f"{GV}/{plural_of(kind)}"


def _bool_param(url: str, query: dict[str, list[str]], key: str) -> bool:
    values = query.pop(key, None)
    if not values:
        return False
    value = values[-1].lower()
    if value not in ("true", "false", "1", "0"):
        raise InvalidInput(f"store: {url!r}: {key}={value!r} is not true or false")
    return value in ("true", "1")


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, (parts.hostname or "").lower(), port


def split_servers(text: str) -> builtins.list[str]:
    """`https://a:8443,https://b:8443` (or `https://a:8443,b:8443`: a bare
    HOST:PORT takes the first one's scheme) as one URL per replica."""
    parts = [p.strip() for p in text.split(",")]
    if not parts[0] or any(not p for p in parts):
        raise InvalidInput(f"store: {text!r}: an empty server in the list")
    scheme = urlsplit(parts[0]).scheme
    return [p if "://" in p else f"{scheme}://{p}" for p in parts]


@dataclass(frozen=True)
class Credentials:
    token: str | None
    ca_pem: bytes | None


def _kubeconfig_paths() -> list[Path]:
    listed = os.environ.get("KUBECONFIG")
    if listed:
        return [Path(p) for p in listed.split(os.pathsep) if p]
    return [Path.home() / ".kube" / "config"]


def find_credentials(server: str | Sequence[str]) -> Credentials:
    """The token and CA for `server` (or for any of several replicas of one
    service): $HVFLEET_TOKEN (`--token`) and $HVFLEET_CA (`--ca`) first; what is
    missing comes from a kubeconfig's context whose cluster is one of these
    servers (never another's, so a token is not sent elsewhere)."""
    token = os.environ.get("HVFLEET_TOKEN") or None
    ca_file = os.environ.get("HVFLEET_CA") or None
    ca_pem: bytes | None = None
    if ca_file is not None:
        try:
            ca_pem = Path(ca_file).read_bytes()
        except OSError as exc:
            raise InvalidInput(f"ca: {ca_file}: cannot read: {exc.strerror}") from None
    if token is not None and ca_pem is not None:
        return Credentials(token, ca_pem)
    from hvfleet.store.kubeconfig import load_kubeconfig

    want = {_origin(s) for s in ([server] if isinstance(server, str) else server)}
    for path in _kubeconfig_paths():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        target = load_kubeconfig(text, str(path))
        if _origin(target.server) not in want:
            continue
        return Credentials(token or target.token, ca_pem or target.ca_pem)
    return Credentials(token, ca_pem)


class _Pooled:
    """One thread's keep-alive connection, to replica `endpoint`."""

    def __init__(self, conn: http.client.HTTPConnection, endpoint: int) -> None:
        self.conn = conn
        self.endpoint = endpoint
        self.used_at: float | None = None


class _Lost(Unavailable):
    """A replica could not be reached, or went away mid-answer (the next may do)."""


def resendable(method: str, body: Any) -> bool:
    """Whether a request that may have reached a replica can be sent again to
    another: a read, or a write that names the version it replaces (a second
    application finds the version moved on: Conflict, not a second write)."""
    if method == "GET":
        return True
    if not isinstance(body, dict):
        return False
    if method == "PUT":
        return bool((body.get("metadata") or {}).get("resourceVersion"))
    if method == "DELETE":
        return bool((body.get("preconditions") or {}).get("resourceVersion"))
    return False


def _status_doc(payload: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(payload)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def error_from_status(code: int, doc: dict[str, Any], what: str,
                      claim_host: str | None = None) -> HvfleetError:
    """The hvfleet error for a meta/v1 Status answer (`doc`, HTTP `code`), by its
    reason and causes. `what` names the request for answers without a message."""
    reason = str(doc.get("reason") or "")
    message = str(doc.get("message") or f"{what}: HTTP {code}")
    details = doc.get("details") if isinstance(doc.get("details"), dict) else {}
    assert isinstance(details, dict)
    raw = details.get("causes") if isinstance(details.get("causes"), list) else []
    causes = [c for c in raw or [] if isinstance(c, dict)]
    unreadable = next((c for c in causes if c.get("reason") == "Undecodable"), None)
    if unreadable is not None:
        plural = str(details.get("kind") or "")
        revision, _, why = str(unreadable.get("message", "")).partition(": ")
        return Undecodable(
            next((k for k, s in STRATEGIES.items() if s.plural == plural), plural),
            str(details.get("name") or ""), int(revision) if revision.isdecimal() else 0, why,
        )
    if reason == "NotFound" or (not reason and code == 404):
        return NotFound(message)
    if reason == "AlreadyExists":
        return AlreadyExists(message)
    if reason == "Conflict" or (not reason and code == 409):
        owned = [c for c in causes if c.get("reason") == "FieldManagerConflict"]
        if owned:
            conflicts = [(str(c.get("field", "")).lstrip("."), _owner(str(c.get("message", ""))))
                         for c in owned]
            plural = str(details.get("kind") or "")
            kind = next((k for k, s in STRATEGIES.items() if s.public and s.plural == plural), None)
            if kind is None:  # not about one object (a batch): the server's words
                return OwnershipConflict(message, conflicts)
            return OwnershipConflict.of(kind, str(details.get("name") or ""), conflicts)
        if any(c.get("field") == "metadata.resourceVersion" for c in causes):
            return StaleVersion(message)
        if claim_host is not None and causes:
            rejections = [(str(c.get("reason", "")), str(c.get("message", "")),
                           _rejected_resource(c.get("field"))) for c in causes]
            return ClaimRefused(message, claim_host, rejections)
        return Conflict(message)
    if reason == "Invalid" or (not reason and code == 422):
        fields = [c for c in causes if c.get("field")]
        if len(fields) == 1 and len(causes) == 1:
            return InvalidInput(str(fields[0].get("message", message)), field=str(fields[0]["field"]))
        return InvalidInput(message)
    if any(c.get("reason") == "ResourceVersionTooLarge" for c in causes):
        # kube-apiserver's 504 for a version it has not reached (hvfleet serve's too).
        return RevisionNotReached(message)
    # NotFound, AlreadyExists, Conflict and Invalid were read above, with their details.
    if reason in ERROR_OF_REASON:
        return ERROR_OF_REASON[reason](message)
    if code in ERROR_OF_CODE:
        return ERROR_OF_CODE[code](message)
    return Unavailable(f"{what}: the server answered {code} {reason or ''}: {message}".replace("  ", " "))


def _owner(cause_message: str) -> str:
    # Kubernetes' fixed shape of a FieldManagerConflict cause: `conflict with "<manager>"`.
    head, _, rest = cause_message.partition('"')
    return rest.rsplit('"', 1)[0] if head.strip() == "conflict with" and rest else cause_message


def _rejected_resource(field: object) -> str | None:
    text = str(field) if field else ""
    return text.removeprefix("spec.resources.") if text.startswith("spec.resources.") else None


class RemoteStore(Store):
    """The Store contract over `hvfleet serve` (see the module docstring)."""

    # The server's DELETE honours finalizers itself (hvfleet.store.lifecycle there).
    finalizes_on_delete = True

    def __init__(self, server: str | Sequence[str], token: str | None, ca_pem: bytes | None = None,
                 *, impersonate: bool = False, timeout: float = DEFAULT_TIMEOUT) -> None:
        servers = split_servers(server) if isinstance(server, str) else builtins.list(server)
        self._endpoints: builtins.list[tuple[str, int]] = []
        urls: builtins.list[str] = []
        for one in servers:
            scheme, host, port = _origin(one)
            if scheme not in ("https", "http") or not host:
                raise InvalidInput(f"store: {one!r} is not https://HOST:PORT")
            if scheme != _origin(servers[0])[0]:
                raise InvalidInput(f"store: {one!r}: every server of one store speaks the same scheme")
            self._endpoints.append((host, port))
            urls.append(f"{scheme}://{urlsplit(one).netloc}")
        self.url = ",".join(urls)
        self._scheme = scheme
        self._current = 0  # the replica requests go to until it cannot be reached
        self._token = token
        self._impersonate = impersonate
        self._timeout = timeout
        self._ssl: ssl.SSLContext | None = None
        if scheme == "https":
            self._ssl = ssl.create_default_context(
                cadata=None if ca_pem is None else ca_pem.decode("ascii", "replace"))
        self._local = threading.local()
        self._lock = threading.Lock()
        self._pooled: list[_Pooled] = []
        self._cache: dict[tuple[str, str], Resource] = {}
        # revision(): the collection this caller may list (an agent only its own name).
        self._revision_path: str | None = None

    @classmethod
    def from_url(cls, url: str) -> RemoteStore:
        """`https://HOST:PORT[,https://HOST:PORT...][?impersonate=true]`,
        credentials by find_credentials."""
        parts = urlsplit(url)
        query = parse_qs(parts.query, keep_blank_values=True)
        impersonate = _bool_param(url, query, "impersonate")
        if query:
            raise InvalidInput(f"store: {url!r}: unknown parameter {sorted(query)[0]!r} "
                               "(only impersonate=true)")
        servers = split_servers(url.split("?", 1)[0])
        for server in servers:
            one = urlsplit(server)
            if one.path not in ("", "/") or one.fragment or one.query:
                raise InvalidInput(f"store: {url!r} must be https://HOST:PORT only")
            if one.scheme == "http" and not is_loopback(one.hostname or ""):
                raise InvalidInput(f"store: {url!r}: plain http only to a loopback address "
                                   "(use https)")
        servers = [f"{urlsplit(s).scheme}://{urlsplit(s).netloc}" for s in servers]
        creds = find_credentials(servers)
        return cls(servers, creds.token, creds.ca_pem, impersonate=impersonate)

    @property
    def endpoints(self) -> builtins.list[str]:
        return self.url.split(",")

    def _fail_over(self, failed: int) -> None:
        """Requests go to the next replica from now on (unless another thread
        already moved them)."""
        with self._lock:
            if self._current == failed:
                self._current = (failed + 1) % len(self._endpoints)

    # -- transport ----------------------------------------------------------------------

    def _connection(self) -> tuple[_Pooled, bool]:
        pooled: _Pooled | None = getattr(self._local, "pooled", None)
        now = time.monotonic()
        if pooled is not None and (pooled.endpoint != self._current or (
                pooled.used_at is not None and now - pooled.used_at > _IDLE_REUSE_S)):
            self._drop(pooled)
            pooled = None
        if pooled is None:
            endpoint = self._current
            pooled = _Pooled(self._new_connection(self._timeout, endpoint), endpoint)
            self._local.pooled = pooled
            with self._lock:
                self._pooled.append(pooled)
            return pooled, False
        return pooled, True

    def _new_connection(self, timeout: float | None,
                        endpoint: int | None = None) -> http.client.HTTPConnection:
        host, port = self._endpoints[self._current if endpoint is None else endpoint]
        if self._ssl is not None:
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=self._ssl)
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def _drop(self, pooled: _Pooled) -> None:
        pooled.conn.close()
        if getattr(self._local, "pooled", None) is pooled:
            self._local.pooled = None
        with self._lock:
            if pooled in self._pooled:
                self._pooled.remove(pooled)

    def _headers(self, manager: str | None, has_body: bool) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "hvfleet-remote-store"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        if has_body:
            headers["Content-Type"] = "application/json"
        if self._impersonate and manager is not None:
            headers["Impersonate-User"] = manager
        return headers

    def unavailable(self, exc: BaseException, endpoint: int | None = None) -> Unavailable:
        text = str(exc).strip() or type(exc).__name__
        where = self.url if endpoint is None else self.endpoints[endpoint]
        return _Lost(f"store {where}: cannot reach the server: {text}")

    def _request(self, method: str, path: str, body: Any = None, *,
                 manager: str | None = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        headers = self._headers(manager, data is not None)
        resend = resendable(method, body)
        failed: builtins.list[str] = []  # one line per replica that could not be reached
        stale_retried = False
        while True:
            pooled, reused = self._connection()
            sent = False
            try:
                if pooled.conn.sock is None:
                    pooled.conn.connect()  # apart, so a failure here is known not sent
                sent = True
                pooled.conn.request(method, path, body=data, headers=headers)
                resp = pooled.conn.getresponse()
                payload = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                self._drop(pooled)
                # A reused keep-alive connection the server closed while idle: the
                # request never reached it, so sending it again is safe.
                if (reused and not stale_retried and isinstance(
                        exc, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError))):
                    stale_retried = True
                    continue
                lost = self.unavailable(exc, pooled.endpoint)
                if sent and not resend:
                    raise lost from None  # it may have been applied: the caller decides
                failed.append(str(lost))
                if len(failed) >= len(self._endpoints):
                    if len(failed) == 1:
                        raise lost from None
                    raise Unavailable(f"store {self.url}: no server could be reached: "
                                      + "; ".join(failed)) from None
                self._fail_over(pooled.endpoint)
                continue
            if resp.will_close:
                self._drop(pooled)
            else:
                pooled.used_at = time.monotonic()
            return resp.status, payload

    def _call(self, method: str, path: str, body: Any = None, *, manager: str | None = None,
              claim_host: str | None = None) -> bytes:
        code, payload = self._request(method, path, body, manager=manager)
        if code >= 400:
            raise error_from_status(code, _status_doc(payload), f"{method} {path}", claim_host)
        return payload

    # -- objects ------------------------------------------------------------------------

    def _path(self, kind: str, name: str | None = None, sub: str | None = None) -> str:
        path = _collection(kind)
        if name is not None:
            path += "/" + quote(name, safe="")
        return f"{path}/{sub}" if sub else path

    def _remember(self, obj: Resource) -> Resource:
        with self._lock:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[(obj.kind, obj.metadata.name)] = obj
        return obj

    def _remembered(self, kind: str, name: str, rv: str | None) -> Resource | None:
        with self._lock:
            obj = self._cache.get((kind, name))
        return obj if obj is not None and rv is not None and obj.metadata.resource_version == rv else None

    def _decode(self, kind: str, payload: bytes) -> Resource:
        return self._remember(STORED_KINDS[kind].model_validate_json(payload))

    def get(self, kind: str, name: str) -> Resource:
        k = kind_of(kind)
        return self._decode(k, self._call("GET", self._path(k, name)))

    def list(self, kind: str, selector: Selector | str | None = None) -> ListResult:
        k = kind_of(kind)
        sel = str(as_selector(selector))
        path = self._path(k) + (f"?{urlencode({'labelSelector': sel})}" if sel else "")
        doc = json.loads(self._call("GET", path))
        model = STORED_KINDS[k]
        with gc_paused():
            items = [self._remember(model.model_validate(item)) for item in doc.get("items") or []]
        rv = (doc.get("metadata") or {}).get("resourceVersion")
        # The token list carries no version (tokens are not watched): the store's, read after.
        return ListResult(items=items, revision=int(rv) if rv else self.revision())

    def list_at(self, kind: str, revision: int, selector: Selector | str | None = None) -> ListResult:
        """The server's own read at that revision (resourceVersionMatch=Exact)."""
        k = kind_of(kind)
        query = {"resourceVersion": str(revision), "resourceVersionMatch": "Exact"}
        sel = str(as_selector(selector))
        if sel:
            query["labelSelector"] = sel
        doc = json.loads(self._call("GET", f"{self._path(k)}?{urlencode(query)}"))
        model = STORED_KINDS[k]
        with gc_paused():
            items = [model.model_validate(item) for item in doc.get("items") or []]
        return ListResult(items=items, revision=revision)

    def create(self, obj: Resource, manager: str) -> Resource:
        """POST; a Reservation's create is a claim on the server (its check)."""
        host = strategy_of(obj).indexed_host(obj)
        payload = self._call("POST", self._path(obj.kind), obj.to_dict(), manager=manager,
                             claim_host=host)
        return self._decode(obj.kind, payload)

    def update(self, obj: Resource, manager: str, *, force: bool = False) -> Resource:
        """PUT of the main resource, or of /status when only the status changed,
        or one atomic batch when both did; what changed is judged against the
        object last returned at that resourceVersion (else one GET)."""
        kind, name = obj.kind, obj.metadata.name
        base = self._remembered(kind, name, obj.metadata.resource_version)
        if base is None:
            try:
                base = self.get(kind, name)
            except Undecodable:
                base = None
        if base is None:
            # Over an object that does not decode: the writer's own part (an
            # agent writes status, anyone else the rest), which overwrites it.
            status_changed = manager.startswith(AGENT_PREFIX) and strategy_of(obj).has_status
            rest_changed = not status_changed
        else:
            status_changed, rest_changed = changed_parts(base, obj)
        if not strategy_of(obj).public:  # an access token: one object, no /status
            status_changed, rest_changed = False, True
        if status_changed and rest_changed:
            out = self.write_all([Write("update", obj)], manager, force=force)
            return out[0]
        sub = "status" if status_changed else None
        path = self._path(kind, name, sub) + ("?force=true" if force else "")
        return self._decode(kind, self._call("PUT", path, obj.to_dict(), manager=manager))

    def delete(self, kind: str, name: str, resource_version: str | None = None) -> None:
        k = kind_of(kind)
        body = None
        if resource_version is not None:
            body = {"kind": "DeleteOptions", "apiVersion": "v1",
                    "preconditions": {"resourceVersion": resource_version}}
        self._call("DELETE", self._path(k, name), body)
        with self._lock:
            self._cache.pop((k, name), None)

    def write_all(self, writes: Sequence[Write], manager: str, *,
                  force: bool = False) -> builtins.list[Resource]:
        check_batch(writes)
        if not writes:
            return []
        if any(w.action == "delete" or w.check is not None for w in writes):
            # The API's batch takes creates and updates; a claim's check runs on the server.
            raise InvalidInput("store https: a batch of deletes or claims is not sent to a server")
        body = {"writes": [_batch_item(w) for w in writes]}
        doc = json.loads(self._call("POST", BATCH_PATH + ("?force=true" if force else ""), body,
                                    manager=manager))
        return [self._remember(STORED_KINDS[w.object.kind].model_validate(item))
                for w, item in zip(writes, doc["items"], strict=True)]

    def claim(self, reservation: Reservation, manager: str, check: ClaimCheck) -> Reservation:
        """POST of the Reservation: the server runs its own claim check (the one
        `hvfleet reserve` runs, with the server's staleness); `check` cannot run
        there and is not used. A refusal is ClaimRefused with its rejections."""
        try:
            out = self.create(reservation, manager)
        except InvalidInput as exc:
            # The API answers 422 about spec.hypervisor for a host that does not
            # exist (a 404 would read as "no such reservation"); the contract says NotFound.
            if exc.field == "spec.hypervisor":
                raise NotFound(exc.detail) from None
            raise
        assert isinstance(out, Reservation)
        return out

    def pause_after_conflict(self, attempt: int) -> None:
        """A short jittered pause (as on etcd): clients of one server retrying a
        stale write at once collide again, each round trip apart."""
        time.sleep(random.random() * min(0.002 * 2**attempt, 0.2))

    def revision(self) -> int:
        """The store revision, from a list of one object of a collection the caller
        may list (an agent may list only its own Hypervisor's name)."""
        if self._revision_path is None:
            try:
                return self._list_revision(f"{GV}/hypervisors?limit=1")
            except Forbidden:
                self._revision_path = self._own_revision_path()
        return self._list_revision(self._revision_path or f"{GV}/hypervisors?limit=1")

    def _list_revision(self, path: str) -> int:
        doc = json.loads(self._call("GET", path))
        return int(doc["metadata"]["resourceVersion"])

    def _own_revision_path(self) -> str:
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        doc = json.loads(self._call("POST", WHOAMI_PATH, review))
        user = doc.get("status", {}).get("userInfo", {})
        hosts = (user.get("extra") or {}).get("hvfleet.io/hypervisor") or []
        if not hosts:
            raise Forbidden(f"store {self.url}: this token may list no collection to read the "
                            "store revision from")
        return f"{GV}/hypervisors?" + urlencode({"limit": "1",
                                                 "fieldSelector": f"metadata.name={hosts[0]}"})

    def close(self) -> None:
        with self._lock:
            pooled, self._pooled = self._pooled, []
        for p in pooled:
            p.conn.close()

    # -- watch --------------------------------------------------------------------------

    def _watch(self, kind: str | None, since: int, name: str | None, stop: threading.Event | None,
               timeout: float | None,
               on_undecodable: Callable[[Undecodable], None] | None,
               on_progress: Callable[[int], None] | None = None) -> Iterator[WatchEvent]:
        kinds = [kind] if kind else builtins.list(KINDS)
        return self._follow(kinds, since, name, stop, timeout)

    def _follow(self, kinds: builtins.list[str], since: int, name: str | None,
               stop: threading.Event | None, timeout: float | None) -> Iterator[WatchEvent]:
        events: _Feed = queue.Queue()
        ended = threading.Event()
        readers = [_WatchReader(self, i, k, since, name, events, ended) for i, k in enumerate(kinds)]
        for r in readers:
            r.start()
        n = len(kinds)
        held: builtins.list[tuple[float, int, WatchEvent]] = []  # (arrived, stream, event), by revision
        newest = [since] * n  # per stream: the revision it has reached (events, bookmarks)
        idle_since = time.monotonic()
        try:
            while stop is None or not stop.is_set():
                now = time.monotonic()
                while held:
                    at, stream, ev = held[0]
                    # No other stream can still bring an earlier event.
                    if not (now - at >= MERGE_SETTLE_S
                            or all(newest[i] >= ev.revision for i in range(n) if i != stream)):
                        break
                    # The last event of its revision (one batch may share one revision).
                    if len(held) > 1:
                        last = held[1][2].revision != ev.revision
                    elif now - at >= BATCH_SETTLE_S or any(v > ev.revision for v in newest):
                        last = True
                    else:
                        break
                    held.pop(0)
                    idle_since = now
                    yield ev if last else ev.with_last(False)
                    if stop is not None and stop.is_set():
                        return
                if timeout is not None and not held and now - idle_since >= timeout:
                    return
                wait: float | None = BATCH_SETTLE_S / 2 if held else (_POLL_S if stop else None)
                if timeout is not None and not held:
                    left = max(0.0, timeout - (now - idle_since))
                    wait = left if wait is None else min(wait, left)
                try:
                    stream, item = events.get(timeout=wait)
                except queue.Empty:
                    continue
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, int):  # a bookmark: progress only
                    newest[stream] = max(newest[stream], item)
                    continue
                newest[stream] = max(newest[stream], item.revision)
                held.append((time.monotonic(), stream, item))
                held.sort(key=lambda h: h[2].revision)
        finally:
            ended.set()
            for r in readers:
                r.close()


_Feed = queue.Queue[tuple[int, "WatchEvent | BaseException | int"]]


class _WatchReader(threading.Thread):
    """Follows one kind's watch stream on its own connection and feeds `events`;
    reconnects from the last revision when the server ends a call normally."""

    def __init__(self, store: RemoteStore, stream: int, kind: str, since: int, name: str | None,
                 events: _Feed,
                 ended: threading.Event) -> None:
        super().__init__(name=f"hvfleet-watch-{kind}", daemon=True)
        self.store = store
        self.stream = stream
        self.kind = kind
        self.position = since
        self.name_filter = name
        self.events = events
        self.ended = ended
        self._conn: http.client.HTTPConnection | None = None
        self._conn_lock = threading.Lock()

    def _path(self) -> str:
        params = {"watch": "true", "resourceVersion": str(self.position),
                  "allowWatchBookmarks": "true", "timeoutSeconds": str(_WATCH_SERVER_TIMEOUT_S)}
        if self.name_filter is not None:
            params["fieldSelector"] = f"metadata.name={self.name_filter}"
        return f"{GV}/{plural_of(self.kind)}?{urlencode(params)}"

    def run(self) -> None:
        failures = 0  # replicas in a row that could not be reached
        try:
            while not self.ended.is_set():
                endpoint = self.store._current
                try:
                    self._one_call(endpoint)
                    failures = 0
                except _Lost:
                    if self.ended.is_set():
                        return
                    failures += 1
                    if failures >= len(self.store._endpoints):
                        raise
                    # Resumed on the next replica from the last revision delivered.
                    self.store._fail_over(endpoint)
        except BaseException as exc:  # handed to the consumer, which raises it
            if not self.ended.is_set():
                self.events.put((self.stream, exc))

    def _one_call(self, endpoint: int) -> None:
        # No read timeout: an idle watch is silent until the server's bookmark.
        conn = self.store._new_connection(None, endpoint)
        with self._conn_lock:
            if self.ended.is_set():
                conn.close()
                return
            self._conn = conn
        try:
            try:
                conn.request("GET", self._path(), headers=self.store._headers(None, False))
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                raise self.store.unavailable(exc, endpoint) from None
            if resp.status >= 400:
                raise error_from_status(resp.status, _status_doc(resp.read()),
                                        f"watch {self.kind}")
            model = STORED_KINDS[self.kind]
            while not self.ended.is_set():
                try:
                    line = resp.readline()
                except (OSError, http.client.HTTPException, ValueError) as exc:
                    if self.ended.is_set():
                        return
                    raise self.store.unavailable(exc, endpoint) from None
                if not line:
                    return  # the server ended this call (timeoutSeconds): reconnect
                if not line.strip():
                    continue
                self._event(json.loads(line), model)
        finally:
            with self._conn_lock:
                self._conn = None
            conn.close()

    def _event(self, doc: dict[str, Any], model: type[Resource]) -> None:
        etype = doc.get("type")
        obj = doc.get("object") or {}
        if etype == "ERROR":
            code = int(obj.get("code") or 500)
            raise error_from_status(code, obj, f"watch {self.kind}")
        rv = int((obj.get("metadata") or {}).get("resourceVersion") or self.position)
        if etype == "BOOKMARK":
            self.position = max(self.position, rv)  # progress only, nothing to deliver
            self.events.put((self.stream, rv))
            return
        if etype not in ("ADDED", "MODIFIED", "DELETED"):
            return
        self.position = max(self.position, rv)
        self.events.put((self.stream, WatchEvent(type=etype, object=model.model_validate(obj),
                                                 revision=rv)))

    def close(self) -> None:
        with self._conn_lock:
            conn = self._conn
        if conn is not None and conn.sock is not None:
            # Unblocks the reader's readline; the thread then sees `ended` and stops.
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) is this machine: plain http is
    allowed only there, by this client and by `hvfleet serve`."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _batch_item(write: Write) -> dict[str, Any]:
    """One write of a batch body; an apply carries its field set as FieldsV1."""
    from hvfleet.store.ownership import to_fields_v1

    item: dict[str, Any] = {"action": write.action, "object": write.object.to_dict()}
    if write.applied is not None:
        item["applied"] = to_fields_v1(write.applied)
    return item
