"""Who may do what: bearer-token authentication and the role table.

`TokenAuthenticator` turns an `Authorization: Bearer hvf_…` header into an
`Identity` by looking the token up in the store (tokens live there so every
replica shares them) and caching the record for at most `max_age` seconds:
that bound is how long a revoke takes to reach every replica. `RoleAuthorizer`
answers from `ROLE_GRANTS`, the one table of what each role may do, which
docs/security.md renders (`role_matrix_markdown`). A grant is on every object,
on the caller's own hypervisor (`own`), or on the objects that select it
(`selecting`: the read is allowed and narrowed, `Selecting`, and the handler
serves only those objects, hvfleet.server.narrowing). Store-level rules stay where
the write is accepted (hvfleet.store.ownership): only `agent/<name>` writes a
hypervisor's status, agents never write spec, and an apply of a field another
manager owns needs force; this table decides who may even ask, who may force,
and that a role which may not force may not take another manager's fields by
update either.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from starlette.concurrency import run_in_threadpool

from hvfleet.model.errors import Forbidden, Unauthorized, Unavailable
from hvfleet.model.hypervisor import Resource
from hvfleet.model.meta import API_GROUP, ObjectMeta
from hvfleet.model.token import ROLES, AccessToken, Role, check_token, split_token
from hvfleet.server.identity import Action, Authenticator, Identity, Selecting, Verb
from hvfleet.store.base import Store
from hvfleet.store.ownership import taken_from_others
from hvfleet.store.tokens import find_token

# How long a token record is trusted before it is read again: the longest a
# revoked or deleted token keeps working on a replica that has seen it.
DEFAULT_MAX_AGE_S = 1.0
_CACHE_LIMIT = 50_000
# How long a token record read while the token watch runs is reused at most.
FOLLOWED_MAX_AGE_S = 30.0
TOKEN_KIND = "AccessToken"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Grant:
    """`verbs` on `resource` ("hypervisors", "hypervisors/status", "fit", ...);
    with `own`, only on the object named after the caller's hypervisor; with
    `selecting`, only on the objects whose selector selects the caller's
    hypervisor (reads only: the handler narrows what it serves); with `bare`,
    a create carries nothing of its own but the name (and a status the caller
    may write): metadata and spec stay as a new object has them."""

    resource: str
    verbs: frozenset[Verb]
    own: bool = False
    selecting: bool = False
    bare: bool = False


def _grant(
    resource: str, verbs: str, *, own: bool = False, selecting: bool = False, bare: bool = False
) -> Grant:
    return Grant(resource, frozenset(verbs.split()), own, selecting, bare)  # type: ignore[arg-type]


# Metadata the store sets on create, whatever a request says.
_STORE_SET_META = frozenset({"uid", "resource_version", "generation", "creation_timestamp", "managed_fields"})


def not_bare(obj: Resource) -> list[str]:
    """The fields `obj` sets that a new object of its kind does not have: its
    metadata beyond the name, and a spec other than the default."""
    given = obj.metadata.model_dump(exclude=set(_STORE_SET_META))
    fresh = ObjectMeta(name=obj.metadata.name).model_dump(exclude=set(_STORE_SET_META))
    fields = [name for name, value in given.items() if value != fresh.get(name)]
    out = [f"metadata.{ObjectMeta.model_fields[f].alias or f}" for f in sorted(fields)]
    if obj.spec != type(obj.spec)():
        out.append("spec")
    return out


_READ_FLEET = (
    _grant("hypervisors", "get list watch"),
    _grant("hypervisors/status", "get"),
    _grant("reservations", "get list watch"),
    _grant("reservations/status", "get"),
    _grant("leases", "get list watch"),
    _grant("overcommitpolicies", "get list watch"),
    _grant("overcommitpolicies/status", "get"),
    # Answers computed from what a reader can list anyway; they write nothing.
    _grant("placement", "create"),
    _grant("cpubaseline", "create"),
    _grant("guests", "create"),
)
_OPERATE = (
    _grant("hypervisors", "create update patch delete deletecollection"),
    # Fleet-wide ratios are the operator's, like each host's spec.overcommit.
    _grant("overcommitpolicies", "create update patch delete deletecollection"),
    _grant("reservations", "delete deletecollection"),
    _grant("fit", "create"),
)
_SCHEDULE = (
    _grant("fit", "create"),
    # Creating a reservation is a claim (Store.claim); release moves its phase.
    _grant("reservations", "create"),
    _grant("reservations/status", "update patch"),
    _grant("release", "create"),
    # The spec fields it sets (e.g. overcommit); the store refuses others' fields.
    _grant("hypervisors", "update patch"),
)
_AGENT = (
    # Its own Hypervisor only: least privilege, so an agent cannot map the fleet.
    # It creates it bare, as it registers itself (agent.status_writer): labels
    # choose OvercommitPolicies and scheduling selectors, and spec is an
    # operator's, so an agent whose Hypervisor was deleted cannot bring it back
    # with labels or spec of its choosing.
    _grant("hypervisors", "get list watch create", own=True, bare=True),
    _grant("hypervisors/status", "get update patch", own=True),
    _grant("leases", "get create update patch delete", own=True),
    # What decides its own effectiveCapacity, and nothing else: the policies that
    # select its hypervisor (by that host's labels when asked), never the fleet's.
    _grant("overcommitpolicies", "get list watch", selecting=True),
)
_TOKENS = (_grant("tokens", "get list watch create update patch delete"),)

# THE role table. Admin holds every fleet right but one: a hypervisor's status
# is the observation of that host's agent, so nobody else writes it.
ROLE_GRANTS: dict[Role, tuple[Grant, ...]] = {
    "viewer": _READ_FLEET,
    "operator": _READ_FLEET + _OPERATE,
    "scheduler": _READ_FLEET + _SCHEDULE,
    "agent": _AGENT,
    "admin": _READ_FLEET + _OPERATE + _SCHEDULE + _TOKENS,
}
# Who may take over spec fields other managers own (force / --force-conflicts).
FORCE_ROLES: frozenset[Role] = frozenset({"operator", "admin"})

_WHY: dict[Role, str] = {
    "viewer": "role viewer reads and watches only",
    "operator": "role operator writes hypervisors' spec and deletes reservations",
    "scheduler": "role scheduler fits, claims, releases and writes the spec fields it owns",
    "agent": "role agent touches only its own hypervisor",
}
# Why admin, who holds every other right, is refused a few: said per resource
# (a hypervisor's status and a Lease are their agent's: `_agent_only`).
_ADMIN_WHY: dict[str, str] = {
    "reservations": "a reservation holds what its claim checked: release it and claim anew "
                    "(its phase moves through reservations/status)",
}


def _why(who: Identity, action: Action) -> str:
    if who.role != "admin":
        return _WHY[who.role]
    key = _resource_key(action)
    reason = _ADMIN_WHY.get(key)
    return f"role admin may not {action.verb} {key}" + (f": {reason}" if reason else "")


_WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def _agent_only(who: Identity, action: Action, name: str | None) -> str | None:
    """The reason for refusing a write only a host's agent makes, said as the
    store says it (hvfleet.store.ownership), so a client sees the same words
    whether the API or the store refused it."""
    key = _resource_key(action)
    if name is None or action.verb not in _WRITES:
        return None
    if key == "hypervisors/status":
        return f"status is written only by 'agent/{name}'"
    if key == "leases":
        return f"Lease {name}: written only by 'agent/{name}'"
    if key == "hypervisors" and who.role == "agent" and action.verb in ("update", "patch"):
        return "agents do not write spec (an agent writes its hypervisor's status and Lease)"
    return None


def _target_name(action: Action, current: Resource | None, new: Resource | None) -> str | None:
    """The one object an action is about, or None for a whole collection. An
    action whose parts disagree about the name is about no single object."""
    names = {n for n in (
        action.name,
        None if current is None else current.metadata.name,
        None if new is None else new.metadata.name,
    ) if n is not None}
    return names.pop() if len(names) == 1 else None


def _resource_key(action: Action) -> str:
    return f"{action.resource}/{action.subresource}" if action.subresource else action.resource


def _denied(who: Identity, action: Action, name: str | None, why: str) -> Forbidden:
    # kube-apiserver's wording, so kubectl and client libraries show the familiar line.
    target = f'{action.resource}.{API_GROUP} "{name}"' if name else f"{action.resource}.{API_GROUP}"
    return Forbidden(
        f'{target} is forbidden: User "{who.subject}" cannot {action.verb} resource '
        f'"{_resource_key(action)}" in API group "{API_GROUP}": {why}'
    )


class RoleAuthorizer:
    """Authorizer over ROLE_GRANTS."""

    def __init__(self, grants: dict[Role, tuple[Grant, ...]] | None = None) -> None:
        self.grants = ROLE_GRANTS if grants is None else grants

    def authorize(
        self, who: Identity, action: Action, current: Resource | None, new: Resource | None
    ) -> Selecting | None:
        name = _target_name(action, current, new)
        # Token records are served only as tokens: a handler that mapped a request
        # to the wrong resource must not leak or accept one.
        holds_token = isinstance(current, AccessToken) or isinstance(new, AccessToken)
        has_object = current is not None or new is not None
        if has_object and holds_token != (action.resource == "tokens"):
            raise _denied(who, action, name, "access tokens are served only as tokens")
        key = _resource_key(action)
        allowed = False
        narrowed: Selecting | None = None
        for grant in self.grants.get(who.role, ()):
            if grant.resource != key or action.verb not in grant.verbs:
                continue
            if grant.selecting:
                if who.hypervisor is None or action.verb in _WRITES:
                    continue
                narrowed = Selecting(who.hypervisor)
            if grant.own and (who.hypervisor is None or name != who.hypervisor):
                what = "a list or watch narrowed to its own name" if name is None else "its own"
                only = _agent_only(who, action, name)
                raise _denied(
                    who, action, name,
                    f"role agent, bound to hypervisor {who.hypervisor}, may {action.verb} "
                    f"only {what} (metadata.name={who.hypervisor})" + (f"; {only}" if only else ""),
                )
            if grant.bare and action.verb == "create" and new is not None and (extra := not_bare(new)):
                raise _denied(
                    who, action, name,
                    f"role {who.role} creates only a bare object (name and status); "
                    f"{', '.join(extra)} are set by an operator",
                )
            allowed = True
            break
        if not allowed:
            raise _denied(who, action, name, _agent_only(who, action, name) or _why(who, action))
        if action.force and who.role not in FORCE_ROLES:
            raise _denied(
                who, action, name,
                f"role {who.role} may not force: fields other managers own stay theirs",
            )
        if (who.role not in FORCE_ROLES and action.verb in ("update", "patch") and not action.apply
                and action.subresource is None and current is not None and new is not None):
            # An update takes the fields it changes from their owners (only an
            # apply conflicts): a role that may not force may not take them.
            taken = taken_from_others(current, new, who.manager)
            if taken:
                field, owner = taken[0]
                raise _denied(
                    who, action, name,
                    f"role {who.role} may not take fields other managers own: "
                    f"{field} is owned by {owner!r}",
                )
        return narrowed


def not_selecting(who: Identity, action: Action, name: str | None, narrowed: Selecting) -> Forbidden:
    """The refusal of a narrowed read of an object outside what it is narrowed to
    (or of one that does not exist: the caller learns nothing of the others)."""
    return _denied(
        who, action, name,
        f"role {who.role}, bound to hypervisor {narrowed.hypervisor}, reads only the "
        f"{action.resource} whose selector selects hypervisor {narrowed.hypervisor}",
    )


VERBS: tuple[Verb, ...] = ("get", "list", "watch", "create", "update", "patch", "delete",
                          "deletecollection")


def table_resources() -> list[str]:
    """Every resource[/subresource] the table names, in a stable order."""
    seen: dict[str, None] = {}
    for role in ROLES:
        for grant in ROLE_GRANTS[role]:
            seen.setdefault(grant.resource, None)
    return list(seen)


def role_matrix_markdown() -> str:
    """ROLE_GRANTS as the Markdown table in docs/security.md."""
    lines = [
        "| resource | " + " | ".join(ROLES) + " |",
        "|---" * (len(ROLES) + 1) + "|",
    ]
    for key in table_resources():
        cells = []
        for role in ROLES:
            verbs = [g for g in ROLE_GRANTS[role] if g.resource == key]
            text = " ".join(v for v in VERBS if any(v in g.verbs for g in verbs))
            if text and any(g.own for g in verbs):
                text += " (own)"
            if text and any(g.selecting for g in verbs):
                text += " (selecting own)"
            if text and any(g.bare for g in verbs):
                text += " (create bare)"
            cells.append(text or "—")
        lines.append(f"| `{key}` | " + " | ".join(cells) + " |")
    lines.append("| force | " + " | ".join("yes" if r in FORCE_ROLES else "—" for r in ROLES) + " |")
    return "\n".join(lines) + "\n"


class TokenAuthenticator:
    """Authenticator over the tokens in `store`.

    A token record read from the store is reused for `max_age` seconds; with
    `follow`, a watch on the token records keeps the cache instead: a record
    read while the watch runs is reused up to `followed_max_age` seconds and
    dropped as soon as the watch shows it changed (revoked, deleted), on every
    replica within the watch's delay. That saves one store read per request
    (an agent calls every 10 s, past any short cache); the bound covers a
    watch that stalls without an error."""

    def __init__(
        self,
        store: Store,
        *,
        max_age: float = DEFAULT_MAX_AGE_S,
        clock: Callable[[], datetime] | None = None,
        follow: bool = False,
        followed_max_age: float = FOLLOWED_MAX_AGE_S,
    ) -> None:
        self.store = store
        self.max_age = max_age
        self.followed_max_age = followed_max_age
        self._clock = clock or (lambda: datetime.now(UTC))
        self._lock = threading.Lock()
        # token id -> (read at, record, reused for this long)
        self._cache: dict[str, tuple[float, AccessToken | None, float]] = {}
        self._changes = 0  # records dropped by the watch so far
        self._following = False
        self._stop = threading.Event()
        self._follower: threading.Thread | None = None
        if follow:
            self._follower = threading.Thread(target=self._follow, name="token-watch", daemon=True)
            self._follower.start()

    def _follow(self) -> None:
        pause = 1.0
        while not self._stop.is_set():
            try:
                since = self.store.revision()
                with self._lock:
                    self._following = True
                # A record that no longer decodes is dropped too: the cache must
                # not keep answering with what it was before.
                for event in self.store.watch(TOKEN_KIND, since=since, stop=self._stop,
                                              on_undecodable=lambda exc: self.forget([exc.name])):
                    self.forget([event.object.metadata.name])
            except Exception as exc:  # the store's own errors; the cache falls back to max_age
                log.warning("token watch failed, tokens are read again every %gs: %s",
                            self.max_age, exc)
                pause = min(pause * 2, 60.0)
            else:
                pause = 1.0
            finally:
                with self._lock:
                    self._following = False
                    # What was read under the watch is kept no longer than max_age.
                    self._cache = {k: (at, r, min(age, self.max_age))
                                   for k, (at, r, age) in self._cache.items()}
            self._stop.wait(pause)

    def close(self) -> None:
        """Stop following the token records, and wait for the watch to end:
        after this the store may be closed (a watch still reading it would
        log its failure at every server's stop)."""
        self._stop.set()
        follower = self._follower
        if follower is not None and follower is not threading.current_thread():
            follower.join(timeout=5)

    def _cached(self, token_id: str) -> tuple[bool, AccessToken | None]:
        """(True, the record or None for an unknown id) when the cache still holds
        the answer; (False, None) when the store must be asked."""
        with self._lock:
            hit = self._cache.get(token_id)
        if hit is not None and time.monotonic() - hit[0] < hit[2]:
            return True, hit[1]
        return False, None

    def _record(self, token_id: str) -> AccessToken | None:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(token_id)
            following, changes = self._following, self._changes
        if hit is not None and now - hit[0] < hit[2]:
            return hit[1]
        record = find_token(self.store, token_id)
        with self._lock:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()  # ids are random: a flood of unknown ones must not grow it
            # Long-lived only when the watch ran all along the read: any later
            # change of this record then reaches forget().
            kept = (self.followed_max_age if following and self._following
                    and changes == self._changes else self.max_age)
            self._cache[token_id] = (now, record, kept)
        return record

    def forget(self, token_ids: Iterable[str] | None = None) -> None:
        """Drop cached records (all, or these), e.g. right after a revoke here."""
        with self._lock:
            self._changes += 1
            if token_ids is None:
                self._cache.clear()
            else:
                for token_id in token_ids:
                    self._cache.pop(token_id, None)

    def authenticate(self, authorization: str | None) -> Identity:
        token_id, secret = _bearer(authorization)
        return self._identity(self._record(token_id), secret)

    def authenticate_cached(self, authorization: str | None) -> Identity | None:
        """`authenticate` when it needs no store read (the record is cached: a
        hash and a clock check, safe on the event loop); None when it does."""
        token_id, secret = _bearer(authorization)
        known, record = self._cached(token_id)
        return self._identity(record, secret) if known else None

    def _identity(self, record: AccessToken | None, secret: str) -> Identity:
        if record is None:
            raise Unauthorized("token: unknown or wrong token")
        check_token(record, secret, self._clock())
        spec = record.spec
        return Identity(subject=spec.subject, role=spec.role, hypervisor=spec.hypervisor,
                        token_id=record.name)


def _bearer(authorization: str | None) -> tuple[str, str]:
    """(token id, secret) of an Authorization header; Unauthorized when it has none."""
    if not authorization or not authorization.strip():
        raise Unauthorized("no credentials: send Authorization: Bearer <token>")
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        raise Unauthorized("credentials: expected a bearer token (Authorization: Bearer <token>)")
    return split_token(credentials)


async def authenticate_request(authenticator: Authenticator, authorization: str | None) -> Identity:
    """The caller, on the event loop when the token record is cached (every
    request of an agent after its first: one worker-thread hand-off less per
    write, docs/scaling.md), else in a worker thread, which may read the store."""
    if isinstance(authenticator, TokenAuthenticator):
        who = authenticator.authenticate_cached(authorization)
        if who is not None:
            return who
    return await run_in_threadpool(authenticator.authenticate, authorization)


async def no_longer_in_force(authenticator: Authenticator, authorization: str | None) -> str | None:
    """Why a long answer (a watch, a dashboard feed) must end because its
    caller's token is no longer in force (revoked, expired), or None while it
    is, or while the store cannot say: an outage of the store is not a
    revocation (nothing can be revoked while it is down either), so the
    answer goes on and the next check asks again, as kube-apiserver's watches
    outlive an etcd outage."""
    try:
        await run_in_threadpool(authenticator.authenticate, authorization)
    except Unauthorized as exc:
        return str(exc)
    except Unavailable as exc:
        log.info("token re-check put off, the store is unavailable: %s", exc)
    return None
