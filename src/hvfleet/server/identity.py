"""Who is calling, and what they ask to do: the interface between the API's
authentication (tokens), its authorization (roles) and its handlers.

The handlers build an `Action` for every request and ask the `Authorizer`
before they touch the store; the field manager of every write is
`Identity.manager`, never a name the client chose.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

# The role names live with the stored token (hvfleet.model.token), re-exported here.
from hvfleet.model.token import ROLES, Role

if TYPE_CHECKING:
    from hvfleet.model.hypervisor import Resource

__all__ = ["ROLES", "Action", "Authenticator", "Authorizer", "Identity", "Role", "Selecting", "Verb"]

# Kubernetes verbs, plus the fleet's action endpoints (fit, release, ...), which
# are authorized as verb "create" on their own resource name ("fit", ...).
# "deletecollection" is a DELETE on a collection (each object it removes is
# authorized as "delete" too).
Verb = Literal["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]


@dataclass(frozen=True)
class Identity:
    """An authenticated caller. `subject` is `agent/<hypervisor>` for an agent
    token, else the token's name; it is also the field manager of its writes."""

    subject: str
    role: Role
    hypervisor: str | None = None
    token_id: str = ""

    @property
    def manager(self) -> str:
        return self.subject


@dataclass(frozen=True)
class Action:
    verb: Verb
    # Plural resource: "hypervisors", "reservations", "leases", "tokens", or an
    # action endpoint's name ("fit", "release", "placement", "cpubaseline", "guests").
    resource: str
    name: str | None = None
    subresource: str | None = None  # "status" or None
    force: bool = False  # server-side apply / update taking over others' fields
    # dryRun=All: authorized and checked as the write itself, and not written.
    dry_run: bool = False
    # A server-side apply (or an edit written as one): a field another manager
    # owns is the store's conflict (409), not taken, so no role is refused for it.
    apply: bool = False


@dataclass(frozen=True)
class Selecting:
    """An allowed read narrowed to the objects whose selector selects hypervisor
    `hypervisor` (by its labels when the handler reads them): an agent's view of
    the OvercommitPolicies that decide its own capacity, as Kubernetes' node
    authorizer lets a kubelet read only what the pods bound to its node use.
    The handler applies it (hvfleet.server.narrowing): a list or watch shows
    only those objects, a get of any other is Forbidden."""

    hypervisor: str


class Authenticator(Protocol):
    def authenticate(self, authorization: str | None) -> Identity:
        """The caller of a request with this Authorization header value; raises
        hvfleet.model.errors.Unauthorized when missing, unknown, expired or revoked."""
        ...


class Authorizer(Protocol):
    def authorize(
        self, who: Identity, action: Action, current: Resource | None, new: Resource | None
    ) -> Selecting | None:
        """Raise hvfleet.model.errors.Forbidden unless `who` may do `action`.
        `current` is the stored object (None on create or for collections), `new`
        the object the write would store (None for reads and deletes). A read
        allowed only on some objects returns what it is narrowed to."""
        ...
