"""Request bodies: the size limit, content types, strict decoding, merge patch.

Nothing here writes: a body is read (at most `max_body` bytes, else 413),
decoded (JSON, or YAML for server-side apply), checked against the kind's
model with unknown fields refused by path (`fieldValidation=Strict`, the
default) or dropped (`Ignore`, `Warn` with a Warning header), and only then
handed to a handler.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from pydantic import ValidationError
from starlette.requests import Request

from hvfleet.model.errors import BadRequest, TooLarge, UnsupportedMediaType
from hvfleet.model.hypervisor import KINDS, Resource
from hvfleet.model.meta import API_VERSION
from hvfleet.server.status import ApiError, Target, invalid_object, unknown_fields

MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
FIELD_VALIDATION = ("Strict", "Warn", "Ignore")


async def read_body(request: Request, max_body: int) -> bytes:
    """The whole body, refusing (413) as soon as it passes `max_body` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body:
        raise TooLarge(f"request body of {declared} bytes is larger than the limit of {max_body} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body:
            raise TooLarge(f"request body is larger than the limit of {max_body} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "application/json").split(";")[0].strip().lower()


def decode_document(body: bytes, media: str) -> dict[str, Any]:
    """A JSON object (or, for apply, YAML, which JSON is a subset of)."""
    if not body.strip():
        raise BadRequest("request body is empty; expected an object")
    try:
        if media == APPLY_PATCH:
            doc = yaml.safe_load(body)
        elif media in ("application/json", MERGE_PATCH, JSON_PATCH, "*/*", ""):
            doc = json.loads(body)
        else:
            raise UnsupportedMediaType(f"the body's media type {media!r} is not supported here")
    except (ValueError, yaml.YAMLError) as exc:
        raise BadRequest(f"the body is not valid {'YAML' if media == APPLY_PATCH else 'JSON'}: "
                         f"{str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise BadRequest("the body must be an object")
    return doc


def field_validation(value: str | None) -> str:
    value = value or "Strict"
    if value not in FIELD_VALIDATION:
        raise BadRequest(f"fieldValidation: {value!r} is not one of Strict, Warn, Ignore")
    return value


def _drop(doc: Any, path: tuple[Any, ...]) -> None:
    node = doc
    for part in path[:-1]:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return
    if isinstance(node, dict):
        node.pop(path[-1], None)


def to_object(doc: dict[str, Any], kind: str, target: Target,
              validation: str = "Strict") -> tuple[Resource, list[str]]:
    """The document as a `kind` object, and the warnings for dropped unknown fields.

    Unknown fields are found by the model itself (every model forbids extras), so
    their paths are exact; any other error is a 422 with one cause per field."""
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != kind:
        raise BadRequest(f"the body must be a {kind} of apiVersion {API_VERSION} "
                         f"(got kind {doc.get('kind')!r}, apiVersion {doc.get('apiVersion')!r})")
    model = KINDS[kind]
    warnings: list[str] = []
    for _ in range(2):
        try:
            return model.model_validate(doc), warnings
        except ValidationError as exc:
            unknown = [e["loc"] for e in exc.errors() if e["type"] == "extra_forbidden"]
            if not unknown:
                raise invalid_object(exc, target, kind) from None
            paths = [".".join(str(p) for p in loc) for loc in unknown]
            if validation == "Strict":
                raise unknown_fields(paths) from None
            for loc in unknown:
                _drop(doc, tuple(loc))
            if validation == "Warn":
                warnings += [f'unknown field "{p}"' for p in paths]
    raise ApiError(400, "BadRequest", "the body could not be decoded")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out
