"""Acting as someone else, and asking who one is: Kubernetes impersonation
(`Impersonate-User`, kubectl `--as`) and the SelfSubjectReview (`kubectl auth
whoami`).

Only an admin token may impersonate. The impersonated user is then the field
manager of every write; `agent/<name>` is that host's agent (role agent, bound
to <name>), any other name keeps the admin's role. That is how one admin token
writes as many managers (the remote store's contract suite, a tool migrating
a fleet), while the token id stays the admin's, so the watch limits and the
audit log's token still name the real caller. Every other role sending the
header gets 403, as kube-apiserver answers.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hvfleet.model.errors import BadRequest, Forbidden
from hvfleet.server.identity import Identity

IMPERSONATE_USER = "impersonate-user"
WHOAMI_PATH = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
# Headers of impersonation this server does not offer: refused, never ignored
# (ignoring them would act with more rights than the client asked for).
_UNSUPPORTED = ("impersonate-group", "impersonate-uid")
_EXTRA_PREFIX = "impersonate-extra-"
AGENT_PREFIX = "agent/"
HYPERVISOR_EXTRA = "hvfleet.io/hypervisor"


def impersonate(who: Identity, user: str) -> Identity:
    """`who` acting as `user`; Forbidden unless `who` is an admin."""
    if who.role != "admin":
        raise Forbidden(
            f'users "{user}" is forbidden: User "{who.subject}" cannot impersonate resource '
            f'"users" in API group "" at the cluster scope: only role admin may impersonate'
        )
    user = user.strip()
    if not user or len(user) > 128 or not user.isprintable():
        raise BadRequest("Impersonate-User: must be a printable name of 1 to 128 characters")
    if user.startswith(AGENT_PREFIX):
        host = user.removeprefix(AGENT_PREFIX)
        if not host:
            raise BadRequest("Impersonate-User: agent/ needs a hypervisor name (agent/<name>)")
        return Identity(subject=user, role="agent", hypervisor=host, token_id=who.token_id)
    return Identity(subject=user, role="admin", token_id=who.token_id)


def acting_identity(who: Identity, request: Request) -> Identity:
    """The identity a request acts as: the token's, or the one it impersonates."""
    headers = request.headers
    asked = [h for h in headers if h in _UNSUPPORTED or h.startswith(_EXTRA_PREFIX)]
    if asked:
        raise BadRequest(f"{asked[0]}: impersonating groups, uids or extra fields is not "
                         "supported (only Impersonate-User)")
    user = headers.get(IMPERSONATE_USER)
    return who if user is None else impersonate(who, user)


def self_subject_review(who: Identity) -> dict[str, object]:
    """What `kubectl auth whoami` shows: the user, the role as a group, and the
    bound hypervisor of an agent (what the remote store narrows its reads to)."""
    extra = {HYPERVISOR_EXTRA: [who.hypervisor]} if who.hypervisor else {}
    user: dict[str, object] = {
        "username": who.subject,
        "groups": [f"hvfleet:{who.role}", "system:authenticated"],
    }
    if extra:
        user["extra"] = extra
    return {"kind": "SelfSubjectReview", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None}, "status": {"userInfo": user}}


async def whoami(request: Request) -> Response:
    from hvfleet.server.guard import authenticate  # the guard builds on acting_identity

    who = await authenticate(request.app.state.ctx, request)
    return JSONResponse(self_subject_review(who), status_code=201)
