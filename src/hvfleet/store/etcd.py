"""The distributed store: the Store contract on etcd v3.

Every object is one key, `{prefix}/objects/{Kind}/{name}`, holding the stored
encoding (`hvfleet.store.encoding`): the resourceVersion *is* the key's etcd
mod_revision. Every write is one etcd transaction that compares the revision
it read (create: create_revision == 0, update/delete: mod_revision == the one
read) and, for a Reservation, also bumps its host's reservation-set key, which
is what lets `claim` check a host and all of its reservations and write a new
one in one transaction without a lock. Field ownership
(`prepare_create`/`prepare_update`) is computed on the object read at the
revision the transaction then compares, so the check and the write cannot be
split by another writer. The key layout is in docs/etcd.md.

The other jobs live beside it: endpoints, failover, errors and the lost-answer
recovery in `etcd_transport`, the watch stream in `etcd_watch`. Agent liveness
is the contract's Lease objects, stored like every other object.
"""

from __future__ import annotations

import builtins
import functools
import json
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hvfleet.model.errors import AlreadyExists, Conflict, Gone, InvalidInput, NotFound, Unavailable
from hvfleet.model.hypervisor import KINDS, Hypervisor, Reservation, Resource
from hvfleet.model.kinds import STRATEGIES, strategy_of
from hvfleet.model.selectors import Selector
from hvfleet.store.base import (
    ClaimCheck,
    ListResult,
    StaleVersion,
    Store,
    Stored,
    WatchEvent,
    Write,
    as_selector,
    check_batch,
    in_batch,
    kind_of,
)
from hvfleet.store.decoded import KEPT as DECODED_KEPT
from hvfleet.store.decoded import DecodedAt
from hvfleet.store.encoding import decode, encode, encode_and_read, vouched, with_version
from hvfleet.store.errors import RevisionNotReached
from hvfleet.store.etcd_transport import (
    FOLLOW_ALL,
    FOLLOW_CHOICES,
    EtcdTransport,
    KeyValue,
    TxnResult,
    cmp_absent,
    cmp_mod,
    landed,
    normalize_prefix,
    op_delete,
    op_get,
    op_put,
    parse_etcd_url,
    prefix_end,
)
from hvfleet.store.etcd_watch import Hurry, watch_range
from hvfleet.store.feed import Interest, SharedFeed
from hvfleet.store.ownership import prepare_create, prepare_update_over, unchanged
from hvfleet.store.undecodable import Undecodable, skipped

__all__ = ["DEFAULT_PREFIX", "EtcdStore", "parse_etcd_url"]

DEFAULT_PREFIX = "/hvfleet"
# Objects per range request when listing: keeps each response far below etcd's
# and the gateway's message limits even for large Hypervisor objects.
LIST_PAGE = 500
# Objects whose last-seen value is kept to save a read before an update.
SEEN_CACHE = 16384
# Watch events decoded lately: several watches of one process (the API's fan-out
# of a kind, the garbage collector's all-kinds watch) each receive every write.
WATCH_DECODED_KEPT = DECODED_KEPT
# The kinds whose followed writes (every replica's, through this process's feed)
# are kept as stored bytes, and how many bytes of them: an agent's next Lease
# renewal or status write names the version of its last one, which may have
# gone through another replica (a load balancer, a failover), so this one has
# that object at hand without a read (docs/scaling.md, "Renewals through any
# replica"). Bytes, not objects: decoded only for the write that names them.
# A budget per kind, so a burst of large status writes never pushes the Leases
# out: a stored Lease is about 420 bytes, so 64 MiB holds those of 150,000 hosts.
FOLLOWED_BYTES = {"Lease": 64 * 1024 * 1024, "Hypervisor": 64 * 1024 * 1024}
FOLLOWED_KINDS = tuple(FOLLOWED_BYTES)

# The feed reads its stream at most once per this many seconds while writes
# come faster (etcd_watch.chunked_lines `pace`): each read then takes every
# event that came meanwhile, and the process is woken once for all of them
# (the feed's thread, then the event loop for the watches), not once per
# event. A write after a quiet spell is followed at once, and a reader that
# waits for a revision cuts the pause short (`follow_now`). `hvfleet serve
# --follow-pace` sets it (docs/scaling.md).
FEED_PACE_S = 0.01
# How long a claim keeps retrying while its host or the host's reservations
# change under it before giving up with a Conflict.
CLAIM_DEADLINE_S = 30.0
# Reads of one host's reservations for a claim inside a batch, before the batch gives up.
CLAIM_ATTEMPTS_IN_BATCH = 20
# A claim reads its host's reservations this many per transaction: etcd refuses
# a transaction of more than --max-txn-ops operations (128 by default), and a
# host's ended reservations stay until `reservations gc`.
CLAIM_READS_PER_TXN = 100


def _once_per_key(ops: builtins.list[dict[str, Any]]) -> builtins.list[dict[str, Any]]:
    """`ops` with each put key once: etcd refuses a txn naming a key twice, and
    two Reservations of one host in a batch both bump that host's set key (the
    value, the last writer's name, only has to change)."""
    seen: set[str] = set()
    out: builtins.list[dict[str, Any]] = []
    for op in ops:
        put = op.get("request_put")
        if put is not None:
            if put["key"] in seen:
                continue
            seen.add(put["key"])
        out.append(op)
    return out


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


class FollowedValues:
    """The latest (mod_revision, value) of each key under `prefixes` that the
    feed followed, as stored, kept until `budget` bytes of values are held (the
    key written longest ago dropped first). Recorded on the feed's thread before
    any decode; read by a write that names a version (`EtcdStore._recall`):
    only a value at exactly that revision is answered, and the write's
    compare-and-swap on mod_revision still decides, so a value that is no
    longer the latest (the feed behind a newer write) can never win."""

    def __init__(self, prefixes: Sequence[str], budget: int) -> None:
        self.prefixes = tuple(prefixes)
        self.budget = budget
        self.held = 0  # bytes of the values kept
        self._values: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._values)

    def record(self, kv: KeyValue) -> None:
        """A followed event's key-value: kept if its key is of a followed kind;
        a delete (which the watch hands on with version 0 and the value before
        it) forgets the key."""
        if not kv.key.startswith(self.prefixes):
            return
        with self._lock:
            old = self._values.get(kv.key)
            if old is not None and old[0] > kv.mod_revision:
                return  # a feed started again from further back: what it holds is newer
            if old is not None:
                del self._values[kv.key]
                self.held -= len(old[1])
            if kv.version == 0 or len(kv.value) > self.budget:
                return
            self._values[kv.key] = (kv.mod_revision, kv.value)
            self.held += len(kv.value)
            while self.held > self.budget:
                _, (_, dropped) = self._values.popitem(last=False)
                self.held -= len(dropped)

    def value_at(self, key: str, revision: int) -> bytes | None:
        hit = self._values.get(key)  # one dict read: atomic, no lock needed
        return hit[1] if hit is not None and hit[0] == revision else None


@dataclass(frozen=True)
class _ClaimState:
    """A host and its reservations as one claim check saw them, with the
    compares that make the claim's write land only on that state."""

    host: Hypervisor
    others: builtins.list[Reservation]
    host_cmp: dict[str, Any]
    set_cmp: dict[str, Any]
    taken: bool


class EtcdStore(Store):
    def __init__(
        self,
        endpoints: Sequence[str],
        prefix: str = DEFAULT_PREFIX,
        *,
        request_timeout: float = 5.0,
        unavailable_after: float = 15.0,
        follow: str = FOLLOW_ALL,
    ) -> None:
        self.prefix = normalize_prefix(prefix)
        if follow not in FOLLOW_CHOICES:
            raise InvalidInput(f"store: follow={follow!r} is not one of {', '.join(FOLLOW_CHOICES)}")
        # The key range the watches of every object read (`_followed_range`).
        self.follow = follow
        url = "etcd://" + ",".join(endpoints)
        query = [f"prefix={self.prefix}"] if self.prefix != DEFAULT_PREFIX else []
        if follow != FOLLOW_ALL:
            query.append(f"follow={follow}")
        if query:
            url += "?" + "&".join(query)
        self.url = url
        self.transport = EtcdTransport(
            endpoints, url, request_timeout=request_timeout, unavailable_after=unavailable_after
        )
        # key -> (mod_revision, value) of objects this store read or wrote. A key's
        # value at a given mod_revision never changes, so an update naming that
        # revision can skip reading the old object again: one round trip, and a
        # shorter window for a concurrent writer.
        self._seen: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        self._seen_lock = threading.Lock()
        # (key, mod_revision) -> the object its watch event carried, decoded once
        # for every watch of this store (a value at a revision never changes).
        # Only watch events: they are shared read-only by their consumers already.
        self._watched = DecodedAt(WATCH_DECODED_KEPT)
        # The latest stored bytes of the often-written kinds' keys, from the feed.
        self._followed = tuple(FollowedValues([self._kind_prefix(kind)], budget)
                               for kind, budget in FOLLOWED_BYTES.items())
        # The one etcd stream of every object that this store's long-lived watches share.
        self._feed = SharedFeed(self._feed_stream, name="etcd-feed")
        self._shared = False  # share_watches()
        self._pace = FEED_PACE_S
        # Set by a reader waiting for a revision: the feed's pause ends at once.
        self._hurry = Hurry()

    @property
    def endpoints(self) -> builtins.list[str]:
        return self.transport.endpoints

    @property
    def endpoint(self) -> str:
        """The endpoint requests go to now (the next one is tried when it fails)."""
        return self.transport.endpoint

    @property
    def request_timeout(self) -> float:
        return self.transport.request_timeout

    @property
    def unavailable_after(self) -> float:
        return self.transport.unavailable_after

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
        return cls(endpoints, chosen, follow=options.get("follow", FOLLOW_ALL), **kwargs)

    # -- keys ----------------------------------------------------------------------------

    def _key(self, kind: str, name: str) -> str:
        return f"{self.prefix}/objects/{kind}/{name}"

    def _kind_prefix(self, kind: str | None) -> str:
        return f"{self.prefix}/objects/" + (f"{kind}/" if kind else "")

    def _reservation_set_key(self, host: str) -> str:
        return f"{self.prefix}/reservation-sets/{host}"

    def _reservation_index_prefix(self, host: str) -> str:
        return f"{self.prefix}/reservation-index/{host}/"

    def _server_secret_key(self, name: str) -> str:
        # Outside {prefix}/objects/: no list or watch of any kind reaches it.
        return f"{self.prefix}/server-secrets/{name}"

    def server_secret(self, name: str) -> tuple[bytes, int] | None:
        kvs, _, _ = self._range(self._server_secret_key(name), what=f"read server secret {name}")
        return (kvs[0].value, kvs[0].mod_revision) if kvs else None

    def put_server_secret(self, name: str, value: bytes, replaces: int | None) -> bool:
        key = self._server_secret_key(name)
        compare = [cmp_absent(key) if replaces is None else cmp_mod(key, replaces)]
        result = self.transport.txn(compare, [op_put(key, value)], what=f"write server secret {name}")
        if not result.succeeded and result.ambiguous:
            # An earlier attempt may have landed: it did if the value is ours.
            found = self.server_secret(name)
            return found is not None and found[0] == value
        return result.succeeded

    # -- objects seen --------------------------------------------------------------------

    def _remember(self, key: str, revision: int, value: bytes) -> None:
        with self._seen_lock:
            self._seen[key] = (revision, value)
            self._seen.move_to_end(key)
            while len(self._seen) > SEEN_CACHE:
                self._seen.popitem(last=False)

    def _recall(self, key: str, revision: int) -> bytes | None:
        """The value of `key` at `revision`, when this store read or wrote it
        there, or its feed followed it there (whichever replica wrote it)."""
        with self._seen_lock:
            hit = self._seen.get(key)
        if hit is not None and hit[0] == revision:
            return hit[1]
        for followed in self._followed:
            value = followed.value_at(key, revision)
            if value is not None:
                return value
        return None

    def _decode_kv(self, kv: KeyValue) -> Resource:
        kind, _, name = kv.key.removeprefix(self._kind_prefix(None)).partition("/")
        return decode(kind, kv.value, kv.mod_revision, name)

    def _watched_value(self, kv: KeyValue) -> Resource | Stored:
        """A watch event's object: left undecoded when its seal vouches for the
        stored bytes (`encoding.vouched`: the API's JSON of an object this model
        accepts), so a consumer that only forwards it (the API's watch fan-out)
        or looks at its key (the garbage collector) never decodes it; any other
        value decoded now, so that one that does not decode is skipped as
        before (Undecodable)."""
        kind, _, name = kv.key.removeprefix(self._kind_prefix(None)).partition("/")
        raw = vouched(kind, name, kv.value)
        known = self._watched.get((kv.key, kv.mod_revision))  # this store's own write
        if raw is None:
            return known if known is not None else self._decode_watched(kv)
        if known is None and all(f.value_at(kv.key, kv.mod_revision) is None for f in self._followed):
            # Not decoded, so not at hand for `at_hand` as a decoded event was;
            # its value is (a writer naming this version through this replica
            # decodes it then instead of reading it again). The feed's Leases
            # and Hypervisors are kept already (`FollowedValues`).
            self._remember(kv.key, kv.mod_revision, kv.value)
        return Stored(kind, name, raw, kv.mod_revision, lambda: self._decode_watched(kv), known)

    def _decode_watched(self, kv: KeyValue) -> Resource:
        """A watch event's object, decoded once however many watches of this
        store see it (the pydantic decode is most of what following costs).
        Undecodable is raised again to every watch."""
        return self._watched.decode((kv.key, kv.mod_revision), lambda: self._decode_kv(kv))

    def _watched_as(self, key: str, revision: int, obj: Resource) -> None:
        """What the watches of this store will decode at (key, revision); a
        write puts the object its encoding check read back, so a replica's
        watches never decode its own writes."""
        self._watched.put((key, revision), obj)

    def _reservation_ops(self, old: Resource | None, new: Resource | None) -> builtins.list[dict[str, Any]]:
        """Keep the per-host reservation index and set keys in step with a
        Reservation write: every write that touches a host's reservations bumps
        that host's set key, so a concurrent claim on that host fails its compare."""
        ops: builtins.list[dict[str, Any]] = []
        either = new if new is not None else old
        if either is None:
            return ops
        kind = strategy_of(either)
        old_host, new_host = kind.indexed_host(old), kind.indexed_host(new)
        name = either.metadata.name
        for host in sorted({h for h in (old_host, new_host) if h is not None}):
            ops.append(op_put(self._reservation_set_key(host), name.encode()))
        if old_host is not None and old_host != new_host:
            ops.append(op_delete(self._reservation_index_prefix(old_host) + name))
        if new_host is not None and new_host != old_host:
            ops.append(op_put(self._reservation_index_prefix(new_host) + name, b""))
        return ops

    def _undecodable_reservation_ops(self, kind: str, name: str, value: bytes,
                                     old: Resource | None) -> builtins.list[dict[str, Any]]:
        """The reservation index keys of a Reservation deleted although it does
        not decode, from its host as far as the stored JSON still names it."""
        strategy = STRATEGIES[kind]
        if not strategy.claimed or old is not None:
            return []
        try:
            host = strategy.host_in(json.loads(value))
        except ValueError:
            return []
        if host is None:
            return []
        return [op_put(self._reservation_set_key(host), name.encode()),
                op_delete(self._reservation_index_prefix(host) + name)]

    def _range(self, key: str, **kwargs: Any) -> tuple[builtins.list[KeyValue], int, bool]:
        return self.transport.range(key, **kwargs)

    # -- the contract --------------------------------------------------------------------

    def get(self, kind: str, name: str) -> Resource:
        kind = kind_of(kind)
        kvs, _, _ = self._range(self._key(kind, name), what=f"get {kind} {name}")
        if not kvs:
            raise NotFound(f"{kind} {name!r} not found")
        self._remember(kvs[0].key, kvs[0].mod_revision, kvs[0].value)
        return decode(kind, kvs[0].value, kvs[0].mod_revision, name)

    def get_for_write(self, kind: str, name: str, resource_version: str | None) -> Resource:
        kind = kind_of(kind)
        known = self.at_hand(kind, name, resource_version)
        return known if known is not None else self.get(kind, name)

    writes_on_loop = True

    def at_hand(self, kind: str, name: str, resource_version: str | None) -> Resource | None:
        if not resource_version or not resource_version.isdecimal():
            return None
        kind = kind_of(kind)
        key, revision = self._key(kind, name), int(resource_version)
        known = self._decoded(key, revision)
        if known is not None:
            return known
        value = self._recall(key, revision)
        return decode(kind, value, revision, name) if value is not None else None

    def _decoded(self, key: str, revision: int) -> Resource | None:
        """The object at (key, revision) when this store has it decoded already:
        one it wrote (an agent's next renewal names the version of its last),
        or one its watches saw. Shared read-only, as the watches share them."""
        return self._watched.get((key, revision))

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

    def list_at(self, kind: str, revision: int, selector: Selector | str | None = None) -> ListResult:
        """etcd reads any revision it has not compacted: one range at that
        revision (Gone once compacted), so any replica over this etcd can cut
        page N of a paged list at the revision page 1 was read at."""
        current = self.revision()
        if revision > current:
            raise RevisionNotReached(f"revision {revision} is newer than the store's {current}")
        return self._list_once(kind_of(kind), as_selector(selector), revision)

    def _list_once(self, kind: str, sel: Selector, revision: int | None = None) -> ListResult:
        start = self._kind_prefix(kind)
        end = prefix_end(start)
        items: builtins.list[Resource] = []
        bad: builtins.list[Undecodable] = []
        key = start
        while True:
            # Every page after the first is read at the first page's revision:
            # one consistent snapshot, and the revision a watch continues from.
            kvs, header_rev, more = self._range(
                key, range_end=end, limit=LIST_PAGE, revision=revision, what=f"list {kind}"
            )
            if revision is None:
                revision = header_rev
            for kv in kvs:
                try:
                    obj = decode(kind, kv.value, kv.mod_revision, kv.key.removeprefix(start))
                except Undecodable as exc:
                    if sel.matches(exc.labels):
                        skipped(exc, f"list {kind}")
                        bad.append(exc)
                    continue
                if sel.matches(obj.metadata.labels):
                    self._remember(kv.key, kv.mod_revision, kv.value)
                    items.append(obj)
            if not more or not kvs:
                return ListResult(items=items, revision=revision, undecodable=bad)
            key = kvs[-1].key + "\0"

    def _put(self, key: str, compare: dict[str, Any], old: Resource | None, stored: Resource,
             what: str) -> tuple[TxnResult, Resource | None]:
        """Write `stored` at `key` if `compare` holds, the reservation index
        moved on from `old`: the answer, and the stored object with its version
        once it is written (now, or by an earlier attempt whose answer was lost);
        None when the compare failed (the answer's range holds the key's value)."""
        value, read = encode_and_read(stored)
        result = self.transport.txn(
            [compare], [op_put(key, value), *self._reservation_ops(old, stored)], [op_get(key)], what=what,
        )
        return result, self._put_answer(key, result, value, read, stored)

    def _put_answer(self, key: str, result: TxnResult, value: bytes, read: Resource,
                    stored: Resource) -> Resource | None:
        if result.succeeded:
            self._remember(key, result.revision, value)
            written = with_version(read, result.revision)
            if strategy_of(stored).followed:  # not the large history series, never followed
                self._watched_as(key, result.revision, written)
            # What the model reads from the bytes written: what any reader gets.
            return written
        applied = landed(result, [value])
        return with_version(stored, applied) if applied is not None else None

    def create(self, obj: Resource, manager: str) -> Resource:
        key = self._key(obj.kind, obj.metadata.name)
        stored = prepare_create(obj, manager, _now())
        _, written = self._put(key, cmp_absent(key), None, stored, f"create {obj.kind} {obj.metadata.name}")
        if written is not None:
            return written
        raise AlreadyExists(f"{obj.kind} {obj.metadata.name!r} already exists")

    def update(self, obj: Resource, manager: str, *, force: bool = False) -> Resource:
        kind, name = obj.kind, obj.metadata.name
        key = self._key(kind, name)
        rv = obj.metadata.resource_version
        cached = self._recall(key, int(rv)) if rv is not None and rv.isdecimal() else None
        if cached is not None and rv is not None:
            old_revision, old_value = int(rv), cached
        else:
            kvs, _, _ = self._range(key, what=f"update {kind} {name}")
            if not kvs:
                raise NotFound(f"{kind} {name!r} not found")
            old_revision, old_value = kvs[0].mod_revision, kvs[0].value
        known = self._decoded(key, old_revision)
        old, stored = prepare_update_over(
            (lambda: known) if known is not None else functools.partial(decode, kind, old_value, old_revision,
                                                                        name),
            obj, manager, force=force, now=_now())
        if old is not None and unchanged(old, stored):
            return old
        result, written = self._put(key, cmp_mod(key, old_revision), old, stored, f"update {kind} {name}")
        return self._updated(key, obj, result, written)

    async def update_on_loop(self, current: Resource, obj: Resource, manager: str, *,
                             force: bool = False) -> Resource:
        """`update`, its one transaction awaited on the loop: `current` is the
        object at the version the transaction compares (`at_hand`)."""
        kind, name = obj.kind, obj.metadata.name
        key = self._key(kind, name)
        rv = current.metadata.resource_version
        if kind != current.kind or name != current.metadata.name or rv is None or not rv.isdecimal():
            raise InvalidInput(f"update {kind} {name}: not over the stored object")
        old, stored = prepare_update_over(lambda: current, obj, manager, force=force, now=_now())
        if old is not None and unchanged(old, stored):
            return old
        value, read = encode_and_read(stored)
        result = await self.transport.txn_async(
            [cmp_mod(key, int(rv))], [op_put(key, value), *self._reservation_ops(old, stored)], [op_get(key)],
            what=f"update {kind} {name}",
        )
        return self._updated(key, obj, result, self._put_answer(key, result, value, read, stored))

    def _updated(self, key: str, obj: Resource, result: TxnResult, written: Resource | None) -> Resource:
        """An update's answer: the object written, or why not."""
        if written is not None:
            return written
        kind, name = obj.kind, obj.metadata.name
        current = result.first()
        if current is None:
            raise NotFound(f"{kind} {name!r} not found")
        self._remember(key, current.mod_revision, current.value)
        raise StaleVersion(
            f"{kind} {name}: resourceVersion {obj.metadata.resource_version} is stale "
            f"(current is {current.mod_revision}); re-read and retry"
        )

    def write_all(
        self, writes: Sequence[Write], manager: str, *, force: bool = False
    ) -> builtins.list[Resource]:
        """One read transaction (every object at one revision), the ownership and
        version checks on what it read, then one write transaction that compares
        every key's revision as read (create_revision == 0 for a create): if any
        object changed in between, nothing is written and the first changed
        one's error is raised. etcd writes the whole batch at one revision."""
        check_batch(writes)
        if not writes:
            return []
        keys = [self._key(w.object.kind, w.object.metadata.name) for w in writes]
        what = f"write {len(writes)} objects"
        snap = self._recalled(writes, keys)
        if snap is None:
            snap = self.transport.txn([], [op_get(k) for k in keys], what=what)
        now = _now()
        compares: builtins.list[dict[str, Any]] = []
        ops: builtins.list[dict[str, Any]] = []
        stored: builtins.list[Resource] = []
        values: builtins.list[bytes | None] = []
        kept: set[int] = set()  # writes that change nothing
        for i, (w, key) in enumerate(zip(writes, keys, strict=True)):
            obj, kv = w.object, snap.first(i)
            old: Resource | None = None
            if w.action == "delete":
                if kv is None:
                    raise NotFound(f"{obj.kind} {obj.metadata.name!r} not found")
                rv = obj.metadata.resource_version
                if rv is not None and rv != str(kv.mod_revision):
                    raise StaleVersion(f"{obj.kind} {obj.metadata.name}: resourceVersion {rv} is stale "
                                       f"(current is {kv.mod_revision})")
                try:
                    old = decode(obj.kind, kv.value, kv.mod_revision, obj.metadata.name)
                except Undecodable:
                    old = None
                compares.append(cmp_mod(key, kv.mod_revision))
                ops += [op_delete(key), *self._reservation_ops(old, None),
                        *self._undecodable_reservation_ops(obj.kind, obj.metadata.name, kv.value, old)]
                stored.append(obj)
                values.append(None)
                continue
            if w.action == "create":
                if kv is not None:
                    raise AlreadyExists(f"{obj.kind} {obj.metadata.name!r} already exists")
                new = prepare_create(obj, manager, now, w.applied)
                compares.append(cmp_absent(key))
                if w.check is not None and isinstance(obj, Reservation):
                    compares += self._batch_claim(obj, w.check, writes, i, what)
            else:
                if kv is None:
                    raise NotFound(f"{obj.kind} {obj.metadata.name!r} not found")
                read = functools.partial(decode, obj.kind, kv.value, kv.mod_revision, obj.metadata.name)
                old, new = prepare_update_over(read, obj, manager, force=force, now=now, applied=w.applied)
                compares.append(cmp_mod(key, kv.mod_revision))
                if old is not None and unchanged(old, new):
                    # Nothing to write; still compared, so the batch lands on the
                    # state every check saw.
                    stored.append(old)
                    values.append(kv.value)
                    kept.add(i)
                    continue
            value = encode(new)
            ops += [op_put(key, value), *self._reservation_ops(old, new)]
            stored.append(new)
            values.append(value)
        if not ops:
            return stored  # every write was a no-op on the snapshot just read
        result = self.transport.txn(compares, _once_per_key(ops), [op_get(k) for k in keys], what=what)
        revision = result.revision if result.succeeded else landed(result, values)
        if revision is not None:
            for i, (key, written) in enumerate(zip(keys, values, strict=True)):
                if i not in kept and written is not None:
                    self._remember(key, revision, written)
            return [obj if i in kept or w.action == "delete" else with_version(obj, revision)
                    for i, (obj, w) in enumerate(zip(stored, writes, strict=True))]
        # Changed since the read: name the first object that did.
        for i, w in enumerate(writes):
            before, now_kv = snap.first(i), result.first(i)
            if (before.mod_revision if before else 0) == (now_kv.mod_revision if now_kv else 0):
                continue
            obj = w.object
            if now_kv is None:
                raise NotFound(f"{obj.kind} {obj.metadata.name!r} not found (deleted concurrently)")
            if w.action == "create":
                raise AlreadyExists(f"{obj.kind} {obj.metadata.name!r} already exists")
            raise StaleVersion(
                f"{obj.kind} {obj.metadata.name}: resourceVersion {obj.metadata.resource_version} "
                f"is stale (current is {now_kv.mod_revision}); re-read and retry"
            )
        raise StaleVersion(f"{what}: the objects changed while they were written; re-read and retry")

    def _recalled(self, writes: Sequence[Write], keys: Sequence[str]) -> TxnResult | None:
        """The batch's objects as this store last read or wrote them, when each
        write is a create or names a version this store holds (a writer that
        keeps writing the same records, as a server's allocation writes do): the
        batch then needs no read before its write, whose compares refuse it if
        any object moved on since (`get_for_write`'s rule). None otherwise, and
        for a batch with a claim."""
        ranges: builtins.list[builtins.list[KeyValue]] = []
        for w, key in zip(writes, keys, strict=True):
            if w.check is not None:
                return None  # a claim: "already exists" comes before its check, as in `claim`
            if w.action == "create":
                ranges.append([])
                continue
            rv = w.object.metadata.resource_version
            value = self._recall(key, int(rv)) if rv is not None and rv.isdecimal() else None
            if rv is None or value is None:
                return None
            ranges.append([KeyValue(key, value, int(rv), 0, 0)])
        return TxnResult(succeeded=True, revision=0, ranges=ranges, ambiguous=False)

    def _batch_claim(self, reservation: Reservation, check: ClaimCheck, writes: Sequence[Write],
                     at: int, what: str) -> builtins.list[dict[str, Any]]:
        """The claim check of a batch's Reservation create, as `claim` runs it:
        the host, its reservation set key and its reservations read at one
        revision (the batch's earlier writes applied over them), `check` run;
        returns the compares that make the batch land only on that state."""
        host_name = reservation.spec.hypervisor
        for _ in range(CLAIM_ATTEMPTS_IN_BATCH):
            state = self._claim_state(host_name, what)
            if state is None:
                continue  # the host's reservations moved under the read: read again
            check(state.host, in_batch(state.others, host_name, writes, at))
            return [state.host_cmp, state.set_cmp]
        raise Conflict(f"{what}: the reservations of {host_name} changed on each read")

    def _claim_state(self, host_name: str, what: str,
                     taken_key: str | None = None) -> _ClaimState | None:
        """What a claim on `host_name` is checked against, read at one revision:
        the host, its reservation set key, the reservations in the set (read only
        if the set is still the one read; None when it moved, to read again) and,
        given `taken_key`, whether that key exists."""
        host_key = self._key("Hypervisor", host_name)
        set_key = self._reservation_set_key(host_name)
        index = self._reservation_index_prefix(host_name)
        reads = [op_get(host_key), op_get(set_key), op_get(index, prefix_end(index), keys_only=True)]
        if taken_key is not None:
            reads.append(op_get(taken_key, keys_only=True))
        snap = self.transport.txn([], reads, what=what)
        host_kvs, set_kvs, index_kvs = snap.ranges[:3]
        if not host_kvs:
            raise NotFound(f"Hypervisor {host_name!r} not found")
        host = decode("Hypervisor", host_kvs[0].value, host_kvs[0].mod_revision, host_name)
        assert isinstance(host, Hypervisor)
        set_cmp = cmp_mod(set_key, set_kvs[0].mod_revision) if set_kvs else cmp_absent(set_key)
        others: builtins.list[Reservation] = []
        names = [kv.key.removeprefix(index) for kv in index_kvs]
        # One transaction while they fit in one (the common case), else several,
        # each guarded by the same set compare. Together they are still the set
        # as the snapshot above saw it: every write of a Reservation bumps the set
        # key of its host(s) in its own transaction, so while `set_cmp` holds no
        # reservation of this host was created, changed, moved or deleted since
        # the snapshot, and each chunk reads exactly the values it had there. A
        # chunk whose compare fails means the set moved: read it all again. (The
        # claim's write compares the host and the set key once more.)
        for start in range(0, len(names), CLAIM_READS_PER_TXN):
            chunk = names[start:start + CLAIM_READS_PER_TXN]
            got = self.transport.txn(
                [set_cmp], [op_get(self._key("Reservation", n)) for n in chunk], what=what)
            if not got.succeeded:
                return None
            for kvs in got.ranges:
                for kv in kvs:
                    r = decode("Reservation", kv.value, kv.mod_revision)
                    assert isinstance(r, Reservation)
                    others.append(r)
        return _ClaimState(host, others, cmp_mod(host_key, host_kvs[0].mod_revision), set_cmp,
                           taken=taken_key is not None and bool(snap.ranges[3]))

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
            try:
                old: Resource | None = decode(kind, kvs[0].value, kvs[0].mod_revision, name)
            except Undecodable:
                # Deleted all the same; a Reservation's host (for its index keys)
                # is read from what can still be read of it.
                old = None
            result = self.transport.txn(
                [cmp_mod(key, kvs[0].mod_revision)],
                [op_delete(key), *self._reservation_ops(old, None),
                 *self._undecodable_reservation_ops(kind, name, kvs[0].value, old)],
                [op_get(key)],
                what=f"delete {kind} {name}",
            )
            if result.succeeded or landed(result, [None]) is not None:
                return  # deleted, by this attempt or by an earlier one whose answer was lost
            now_there = result.first()
            if now_there is None:
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
        self.transport.post("kv/compaction", {"revision": revision, "physical": True}, "compact")

    def claim(self, reservation: Reservation, manager: str, check: ClaimCheck) -> Reservation:
        host_name = reservation.spec.hypervisor
        name = reservation.metadata.name
        res_key = self._key("Reservation", name)
        what = f"claim Reservation {name} on {host_name}"
        deadline = time.monotonic() + CLAIM_DEADLINE_S
        attempts = 0
        while True:
            attempts += 1
            # 1.-2. The host, its reservation set and its reservations at one
            #       revision, and whether the name is taken.
            state = self._claim_state(host_name, what, taken_key=res_key)
            if state is None:
                continue
            if state.taken:
                raise AlreadyExists(f"Reservation {name!r} already exists")
            check(state.host, state.others)
            # 3. Write, if neither the host nor its reservation set changed since.
            stored = prepare_create(reservation, manager, _now())
            value = encode(stored)
            result = self.transport.txn(
                [state.host_cmp, state.set_cmp, cmp_absent(res_key)],
                [op_put(res_key, value), *self._reservation_ops(None, stored)],
                [op_get(res_key)],
                what=what,
            )
            if result.succeeded:
                self._remember(res_key, result.revision, value)
                out = with_version(stored, result.revision)
                assert isinstance(out, Reservation)
                return out
            applied = landed(result, [value])
            if applied is not None:
                out = with_version(stored, applied)
                assert isinstance(out, Reservation)
                return out
            if result.first() is not None:
                raise AlreadyExists(f"Reservation {name!r} already exists")
            if time.monotonic() > deadline:
                raise Conflict(
                    f"{what}: the host or its reservations changed on each of {attempts} "
                    f"attempts in {CLAIM_DEADLINE_S:g}s; retry"
                )
            time.sleep(random.random() * min(0.002 * attempts, 0.05))

    # -- watch ---------------------------------------------------------------------------

    def _watch(self, kind: str | None, since: int, name: str | None, stop: threading.Event | None,
               timeout: float | None,
               on_undecodable: Callable[[Undecodable], None] | None,
               on_progress: Callable[[int], None] | None = None) -> Iterator[WatchEvent]:
        """Events with revision > since, resuming on another endpoint (from the
        last revision delivered) when a stream breaks (see `etcd_watch`)."""
        if timeout is None and self._shared:
            # A long-lived watch: served from the process's one stream of every object.
            return self._feed.watch(Interest(kind, name, progress=on_progress is not None), since, stop,
                                    on_undecodable,
                                    lambda at: self._own_watch(kind, at, name, stop, None, on_undecodable),
                                    on_progress)
        return self._own_watch(kind, since, name, stop, timeout, on_undecodable, on_progress)

    def share_watches(self, pace: float | None = None) -> None:
        self._shared = True
        if pace is not None:
            self._pace = pace

    def follow_now(self) -> None:
        self._hurry.set()

    def _own_watch(self, kind: str | None, since: int, name: str | None, stop: threading.Event | None,
                   timeout: float | None,
                   on_undecodable: Callable[[Undecodable], None] | None,
                   on_progress: Callable[[int], None] | None = None) -> Iterator[WatchEvent]:
        """A watch on an etcd stream of its own. One of every public kind with
        `on_progress` (the fleet index catching up) reads every key of the
        store, as the feed does: a revision with no event for it (a server
        secret's write, an access token's) goes to `on_progress`."""
        within: str | None = None
        if name is not None:
            # One key is the range [key, key + NUL): etcd then watches just that key.
            start = self._key(kind or "", name)
            end = start + "\0"
        elif kind is None and on_progress is not None:
            (start, end), within = self._followed_range(), self._kind_prefix(None)
        else:
            start = self._kind_prefix(kind)
            end = prefix_end(start)
        events = watch_range(
            self.transport, start, end, since, self._watched_value, stop=stop, timeout=timeout,
            on_undecodable=on_undecodable, within=within, on_progress=on_progress if within else None,
        )
        if kind is not None:
            yield from events
            return
        # Access tokens live under the same prefix but are not in the all-kinds feed.
        for e in events:
            if e.kind in KINDS:
                yield e
            elif on_progress is not None and e.last_of_revision:
                on_progress(e.revision)

    def _followed_range(self) -> tuple[str, str]:
        """The keys a watch of every object reads, [start, end): with `follow`
        all, every key of the etcd ("\\0" to "\\0" is etcd's every key), so a
        revision another application (or another fleet's prefix) wrote reaches
        the watch as progress, and a reader waiting for the store's revision
        (which counts every writer's writes) is not left waiting for a
        revision that no key of this prefix carries; with `follow` prefix, the
        store's own keys only (those writes then cost such a reader its
        0.5 s bound, docs/etcd.md "Sharing an etcd")."""
        if self.follow == FOLLOW_ALL:
            return "\0", "\0"
        start = self.prefix + "/"
        return start, prefix_end(start)

    def _feed_stream(self, since: int, stop: threading.Event,
                     on_undecodable: Callable[[Undecodable], None],
                     inline: Callable[[Callable[[], None]], None],
                     on_progress: Callable[[int], None]) -> Iterator[WatchEvent]:
        # Every key of the store, not only its objects: hvfleet's own writes beside
        # them (server secrets, the history sampler's turn) then reach the feed as
        # progress, dropped by their key before any decode, so a reader waiting for
        # the store's revision (the Placement snapshot) is not left waiting for them.
        start, end = self._followed_range()
        return watch_range(self.transport, start, end, since, self._followed_value,
                           stop=stop, on_undecodable=on_undecodable, log_skipped=False, inline=inline,
                           within=self._kind_prefix(None), on_progress=on_progress,
                           pace=self._pace, hurry=self._hurry)

    def _followed_value(self, kv: KeyValue) -> Resource | Stored:
        """The feed's event object (`_watched_value`), the stored bytes of the
        often-written kinds kept first (`FollowedValues`)."""
        for followed in self._followed:
            followed.record(kv)
        return self._watched_value(kv)

    def watch_into(self, kind: str | None, since: int,
                   sink: Callable[[builtins.list[WatchEvent]], None], stop: threading.Event,
                   *, stored: bool = False) -> None:
        if not self._shared:
            super().watch_into(kind, since, sink, stop, stored=stored)
            return
        kind = kind_of(kind) if kind else None
        if stored and kind is None:  # every followed kind: the feed's stream of every object
            self._feed.watch_into(Interest(None, stored=True), since, sink, stop, None,
                                  lambda at: self._objects_stream(at, stop, None, None))
            return
        self._feed.watch_into(Interest(kind), since, sink, stop, None,
                              lambda at: self._own_watch(kind, at, None, stop, None, None))

    def _objects_stream(self, at: int, stop: threading.Event | None, timeout: float | None,
                        on_progress: Callable[[int], None] | None) -> Iterator[WatchEvent]:
        """The store's every key, its objects' events yielded (see _feed_stream)."""
        start, end = self._followed_range()
        return watch_range(self.transport, start, end, at, self._watched_value,
                           stop=stop, timeout=timeout, within=self._kind_prefix(None),
                           on_progress=on_progress)

    def watch_objects(self, since: int, *, stop: threading.Event | None = None,
                      timeout: float | None = None,
                      on_progress: Callable[[int], None] | None = None) -> Iterator[WatchEvent]:
        def own(at: int) -> Iterator[WatchEvent]:
            return self._objects_stream(at, stop, timeout, on_progress)

        if timeout is None and self._shared:
            # The Placement snapshot's follower: the process's one stream, not one more.
            return self._feed.watch(Interest(None, stored=True, progress=on_progress is not None),
                                    since, stop, None, own, on_progress)
        return own(since)

    def close(self) -> None:
        self._feed.close()
        self._hurry.close()
        self.transport.close()
