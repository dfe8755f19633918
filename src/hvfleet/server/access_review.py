"""SelfSubjectAccessReview and SelfSubjectRulesReview (authorization.k8s.io/v1):
what `kubectl auth can-i VERB RESOURCE` and `kubectl auth can-i --list` ask.

Both are answered by asking the server's own Authorizer — the guard every
request passes — about the caller, never from a copy of the role table: a
review says yes exactly when the request itself would be let through (the
store's own rules, such as who writes a hypervisor's status, still apply to
the write). A rules review lists, per resource of the role table, the verbs
the caller may use on the whole collection, and for a caller bound to one
hypervisor (an agent) those it may use on that name only.
"""

from __future__ import annotations

from typing import Any, get_args

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hvfleet.model.errors import BadRequest, Forbidden, UnsupportedMediaType
from hvfleet.model.meta import API_GROUP
from hvfleet.server import bodies
from hvfleet.server.auth import table_resources
from hvfleet.server.context import ApiContext
from hvfleet.server.discovery import AUTHORIZATION_GROUP
from hvfleet.server.guard import about, authenticate
from hvfleet.server.identity import Action, Identity, Verb
from hvfleet.server.status import Target

GROUP = AUTHORIZATION_GROUP
GV = f"{GROUP}/v1"
PREFIX = f"/apis/{GV}"
ACCESS_REVIEWS = "selfsubjectaccessreviews"
RULES_REVIEWS = "selfsubjectrulesreviews"
REVIEWS = (ACCESS_REVIEWS, RULES_REVIEWS)
SERVED_VERBS: tuple[Verb, ...] = get_args(Verb)
# Resources authorized under another name than their URL's (hvfleet.server.token_api).
AUTHORIZED_AS = {"accesstokens": "tokens"}
# What any authenticated caller may GET outside the resources (app.routes).
NON_RESOURCE_URLS = ("/api", "/api/*", "/apis", "/apis/*", "/openapi", "/openapi/*", "/version",
                     "/healthz", "/livez", "/readyz")


def api_resource_list() -> dict[str, Any]:
    def entry(plural: str, kind: str) -> dict[str, Any]:
        return {"name": plural, "singularName": "", "namespaced": False, "kind": kind,
                "verbs": ["create"]}

    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GV,
            "resources": [entry(ACCESS_REVIEWS, "SelfSubjectAccessReview"),
                          entry(RULES_REVIEWS, "SelfSubjectRulesReview")]}


def api_group() -> dict[str, Any]:
    gv = {"groupVersion": GV, "version": "v1"}
    return {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": [gv],
            "preferredVersion": gv}


def _allowed(ctx: ApiContext, who: Identity, verb: Verb, resource: str, subresource: str | None,
             name: str | None) -> tuple[bool, str]:
    try:
        narrowed = ctx.authorizer.authorize(
            who, Action(verb, resource, name=name or None, subresource=subresource or None), None, None)
    except Forbidden as exc:
        return False, str(exc)
    if narrowed is not None:
        # A narrowed read is allowed; it serves only what selects the caller's host.
        return True, (f"allowed to role {who.role}, narrowed to the {resource} that select "
                      f"hypervisor {narrowed.hypervisor}")
    return True, f"allowed to role {who.role}"


def decide(ctx: ApiContext, who: Identity, attributes: dict[str, Any]) -> tuple[bool, str]:
    """Whether `who` may do what a review's resourceAttributes describe, and why
    (the guard's own refusal when not). "*" for the verb or the resource means
    every one of them, as in RBAC."""
    verb = str(attributes.get("verb") or "")
    group = str(attributes.get("group") or "")
    resource = str(attributes.get("resource") or "")
    sub = str(attributes.get("subresource") or "") or None
    name = str(attributes.get("name") or "") or None
    if not verb or not resource:
        return False, "resourceAttributes: verb and resource are required"
    if group == GROUP and resource in REVIEWS:
        return verb == "create", "" if verb == "create" else f"{resource} are only created"
    # This server has no core group: "" is what kubectl sends for a name its
    # discovery does not list (the action endpoints, accesstokens), meaning ours.
    if group not in (API_GROUP, "*", ""):
        return False, f'no resource "{resource}" in API group "{group}" on this server'
    verbs = SERVED_VERBS if verb == "*" else (verb,)
    if any(v not in SERVED_VERBS for v in verbs):
        return False, f'verb "{verb}" is not served here'
    resource = AUTHORIZED_AS.get(resource, resource)
    resources = [(r.partition("/")[0], r.partition("/")[2] or None) for r in table_resources()
                 ] if resource == "*" else [(resource, sub)]
    why = ""
    for v in verbs:
        for res, subres in resources:
            ok, why = _allowed(ctx, who, v, res, subres, name)  # type: ignore[arg-type]
            if not ok:
                return False, why
    return True, why


def rules(ctx: ApiContext, who: Identity) -> list[dict[str, Any]]:
    """ResourceRules for `who`: per resource of the role table, the verbs it may
    use on the collection; for a caller bound to a hypervisor, the verbs it may
    use on that name only, with resourceNames."""
    out: list[dict[str, Any]] = []
    for key in table_resources():
        resource, _, sub = key.partition("/")
        anywhere = [v for v in SERVED_VERBS if _allowed(ctx, who, v, resource, sub, None)[0]]
        # Named as on the URL, as a client would ask about it.
        shown = next((url for url, name in AUTHORIZED_AS.items() if name == key), key)
        if anywhere:
            out.append({"verbs": anywhere, "apiGroups": [API_GROUP], "resources": [shown]})
        if who.hypervisor is not None:
            own = [v for v in SERVED_VERBS if v not in anywhere
                   and _allowed(ctx, who, v, resource, sub, who.hypervisor)[0]]
            if own:
                out.append({"verbs": own, "apiGroups": [API_GROUP], "resources": [shown],
                            "resourceNames": [who.hypervisor]})
    out.append({"verbs": ["create"], "apiGroups": [GROUP], "resources": list(REVIEWS)})
    return out


# -- the protobuf a current kubectl sends for these built-in kinds ---------------------

PROTOBUF = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"
# Field numbers of k8s.io/api/authorization/v1 generated.proto, as JSON names.
_RESOURCE_ATTRIBUTES = {1: "namespace", 2: "verb", 3: "group", 4: "version", 5: "resource",
                        6: "subresource", 7: "name"}
_NON_RESOURCE_ATTRIBUTES = {1: "path", 2: "verb"}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = 0
    for shift in range(0, 70, 7):
        if pos >= len(data):
            break
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
    raise BadRequest("protobuf: truncated or over-long varint")


def _fields(data: bytes) -> dict[int, bytes]:
    """The length-delimited fields of one message (the last of each number wins,
    as protobuf merges); other wire types are skipped."""
    out: dict[int, bytes] = {}
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 2:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise BadRequest("protobuf: a field runs past the end of the body")
            out[number] = data[pos:pos + size]
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise BadRequest(f"protobuf: unsupported wire type {wire}")
    return out


def _strings(data: bytes, names: dict[int, str]) -> dict[str, str]:
    try:
        return {names[n]: v.decode() for n, v in _fields(data).items() if n in names}
    except UnicodeDecodeError:
        raise BadRequest("protobuf: a string is not UTF-8") from None


def decode_protobuf_review(body: bytes, kind: str) -> dict[str, Any]:
    """A SelfSubject*Review in Kubernetes' protobuf envelope (runtime.Unknown:
    typeMeta, raw) as the JSON document it stands for."""
    if not body.startswith(_MAGIC):
        raise BadRequest("protobuf: the body does not start with the Kubernetes magic number")
    envelope = _fields(body[len(_MAGIC):])
    type_meta = _strings(envelope.get(1, b""), {1: "apiVersion", 2: "kind"})
    spec_bytes = _fields(envelope.get(2, b"")).get(2, b"")
    spec: dict[str, Any] = {}
    if kind == "SelfSubjectAccessReview":
        parts = _fields(spec_bytes)
        if 1 in parts:
            spec["resourceAttributes"] = _strings(parts[1], _RESOURCE_ATTRIBUTES)
        if 2 in parts:
            spec["nonResourceAttributes"] = _strings(parts[2], _NON_RESOURCE_ATTRIBUTES)
    else:
        spec = _strings(spec_bytes, {1: "namespace"})
    return {**type_meta, "spec": spec}


async def _review(request: Request, kind: str) -> tuple[ApiContext, Identity, dict[str, Any]]:
    ctx: ApiContext = request.app.state.ctx
    who = await authenticate(ctx, request)
    media = bodies.media_type(request)
    body = await bodies.read_body(request, ctx.limits.max_body)
    if media == PROTOBUF:
        # The answer is JSON, which client-go reads whatever it sent.
        doc = decode_protobuf_review(body, kind)
    elif media in ("application/json", "*/*"):
        doc = await bodies.parse_document(body, media)
    else:
        raise UnsupportedMediaType(f"{kind}: the body must be application/json or {PROTOBUF}, "
                                   f"not {media!r}")
    if doc.get("kind", kind) != kind or doc.get("apiVersion", GV) != GV:
        raise BadRequest(f"the body must be a {GV} {kind}, not {doc.get('apiVersion')} {doc.get('kind')}")
    spec = doc.get("spec") or {}
    if not isinstance(spec, dict):
        raise BadRequest(f"{kind}.spec: must be an object")
    return ctx, who, spec


async def self_subject_access_review(request: Request) -> Response:
    about(request, Target(ACCESS_REVIEWS))
    ctx, who, spec = await _review(request, "SelfSubjectAccessReview")
    attributes = spec.get("resourceAttributes")
    non_resource = spec.get("nonResourceAttributes")
    if isinstance(attributes, dict):
        allowed, reason = decide(ctx, who, attributes)
    elif isinstance(non_resource, dict):
        path = str(non_resource.get("path") or "")
        allowed = non_resource.get("verb") == "get" and any(
            path == u or (u.endswith("/*") and path.startswith(u[:-1])) for u in NON_RESOURCE_URLS)
        reason = "" if allowed else "only GET of discovery, OpenAPI, version and health paths"
    else:
        raise BadRequest("spec: one of resourceAttributes or nonResourceAttributes is required")
    status: dict[str, Any] = {"allowed": allowed}
    if reason:
        status["reason"] = reason
    return JSONResponse({"kind": "SelfSubjectAccessReview", "apiVersion": GV,
                         "metadata": {"creationTimestamp": None}, "spec": spec,
                         "status": status}, status_code=201)


async def self_subject_rules_review(request: Request) -> Response:
    about(request, Target(RULES_REVIEWS))
    ctx, who, spec = await _review(request, "SelfSubjectRulesReview")
    status = {
        "resourceRules": rules(ctx, who),
        "nonResourceRules": [{"verbs": ["get"], "nonResourceURLs": list(NON_RESOURCE_URLS)}],
        "incomplete": False,
    }
    return JSONResponse({"kind": "SelfSubjectRulesReview", "apiVersion": GV,
                         "metadata": {"creationTimestamp": None}, "spec": spec,
                         "status": status}, status_code=201)
