"""What form an answer takes, from the client's `Accept` (kube-apiserver's
output negotiation for custom resources).

The clauses of `Accept` are tried in order of their `q`, then as written; the
first the server can serve wins:

- the media type is JSON or YAML (`*/*` and `application/*` are JSON); a
  watch streams JSON only; protobuf is not served for these resources (as for
  a CRD), so a clause naming it is passed over;
- `as`, `g` and `v` ask for the answer turned into a meta.k8s.io kind:
  `Table` (what kubectl asks for), `PartialObjectMetadata` (one object, or
  each watch event) or `PartialObjectMetadataList` (a list), in meta.k8s.io
  v1 or v1beta1; a clause asking for anything else is passed over.

When no clause can be served the answer is 406 NotAcceptable, before anything
is read or written. A list asked for as `PartialObjectMetadata`, or one
object as `PartialObjectMetadataList`, is 406 too, as kube answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import yaml
from starlette.requests import Request
from starlette.responses import Response

from hvfleet.model.errors import BadRequest
from hvfleet.server.status import ApiError

JSON = "application/json"
YAML = "application/yaml"
SERVED = (JSON, YAML)
TABLE = "Table"
PARTIAL = "PartialObjectMetadata"
PARTIAL_LIST = "PartialObjectMetadataList"
META_GROUP = "meta.k8s.io"
META_VERSIONS = ("v1", "v1beta1")
_WILD = {"*/*": JSON, "application/*": JSON}

# A Table's `includeObject` (kube's IncludeObjectPolicy); "" is Metadata.
INCLUDE_OBJECT = ("Metadata", "None", "Object")


@dataclass(frozen=True)
class Form:
    """The answer's media type and the meta.k8s.io kind it is turned into
    ("" for the objects themselves)."""

    media: str = JSON
    kind: str = ""
    version: str = "v1"

    @property
    def table(self) -> bool:
        return self.kind == TABLE

    @property
    def meta_api_version(self) -> str:
        return f"{META_GROUP}/{self.version}"


OBJECT = Form()


def _clauses(accept: str) -> list[tuple[str, dict[str, str]]]:
    """The clauses as (media type, parameters), best `q` first, then as written;
    `q=0` clauses dropped."""
    found: list[tuple[float, int, str, dict[str, str]]] = []
    for n, part in enumerate(accept.split(",")):
        media, *raw = (p.strip() for p in part.split(";"))
        params = {k.strip().lower(): v.strip().strip('"') for k, _, v in
                  (p.partition("=") for p in raw if p)}
        try:
            q = float(params.pop("q", "1"))
        except ValueError:
            q = 1.0
        if media and q > 0:
            found.append((-q, n, media.lower(), params))
    found.sort(key=lambda c: (c[0], c[1]))
    return [(media, params) for _, _, media, params in found]


def _served(media: str, params: dict[str, str], stream: bool) -> Form | None:
    served = _WILD.get(media, media)
    if served not in SERVED or (stream and served != JSON):
        return None
    if params.get("stream") and (served != JSON or params["stream"] != "watch"):
        return None
    if not any(k in params for k in ("as", "g", "v")):
        return Form(served)
    kind, group, version = params.get("as", ""), params.get("g", ""), params.get("v", "")
    if kind not in (TABLE, PARTIAL, PARTIAL_LIST) or group != META_GROUP or version not in META_VERSIONS:
        return None
    return Form(served, kind, version)


def negotiate(accept: str | None, *, stream: bool = False) -> Form:
    """The form of the answer to a client that sent `accept`; 406 when the
    server can serve none of its clauses (`stream`: a watch)."""
    if not accept or not accept.strip():
        return OBJECT
    for media, params in _clauses(accept):
        form = _served(media, params, stream)
        if form is not None:
            return form
    offered = JSON if stream else ", ".join(SERVED)
    raise ApiError(406, "NotAcceptable", f"only the following media types are accepted: {offered}")


def form_of(request: Request, *, stream: bool = False) -> Form:
    """`negotiate` for this request, once: the handler asks before it reads
    or writes anything, the answer's renderer asks again."""
    form: Form | None = getattr(request.state, "answer_form", None)
    if form is None:
        form = negotiate(request.headers.get("accept"), stream=stream)
        request.state.answer_form = form
    return form


def include_object(request: Request) -> str:
    """A Table's `includeObject`, checked as kube checks its TableOptions."""
    value = request.query_params.get("includeObject", "")
    if value and value not in INCLUDE_OBJECT:
        raise BadRequest(f"Unable to convert to Table as requested: includeObject: Invalid value: "
                         f"{value!r}: must be 'Metadata', 'Object', 'None', or empty")
    return value or "Metadata"


def not_a_list(form: Form) -> None:
    """406 when a single object was asked for as a list of metadata."""
    if form.kind == PARTIAL_LIST:
        raise ApiError(406, "NotAcceptable", "you requested PartialObjectMetadataList, "
                                             "but the requested object is not a list")


def a_list(form: Form) -> None:
    """406 when a list was asked for as one object's metadata."""
    if form.kind == PARTIAL:
        raise ApiError(406, "NotAcceptable", "you requested PartialObjectMetadata, "
                                             "but the requested object is a list")


def partial_metadata(metadata: dict[str, Any], form: Form) -> dict[str, Any]:
    """An object's metadata alone, as meta.k8s.io's PartialObjectMetadata."""
    return {"kind": PARTIAL, "apiVersion": form.meta_api_version, "metadata": metadata}


def encoded(form: Form, body: dict[str, Any] | bytes, code: int = 200,
            headers: dict[str, str] | None = None) -> Response:
    """The answer in the negotiated media type (`body` as JSON bytes is sent
    as is when JSON was asked for)."""
    if form.media == YAML:
        doc = body if isinstance(body, dict) else json.loads(body)
        text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
        return Response(text.encode(), status_code=code, headers=headers, media_type=YAML)
    data = body if isinstance(body, bytes) else json.dumps(
        body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    return Response(data, status_code=code, headers=headers, media_type=JSON)
