"""Request bodies: the size limit, content types, strict decoding, merge patch.

Nothing here writes: a body is read (at most `max_body` bytes, else 413),
decoded (JSON, or YAML for server-side apply, both through
hvfleet.model.documents: no YAML aliases, at most MAX_DEPTH levels; bodies
above `OFF_LOOP_BYTES` are decoded in a worker thread, so one large body never
holds the event loop; a merge or JSON patch is
applied here, RFC 7386 / RFC 6902), checked against the kind's
model with unknown fields refused by path (`fieldValidation=Strict`, the
default) or dropped (`Ignore`, `Warn` with a Warning header), and only then
handed to a handler.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from hvfleet.model.documents import DocumentError, load_json, load_yaml, without_nulls
from hvfleet.model.errors import BadRequest, InvalidInput, TooLarge, UnsupportedMediaType
from hvfleet.model.hypervisor import KINDS, Resource
from hvfleet.model.meta import API_VERSION
from hvfleet.server.status import ApiError, Target, invalid_object, unknown_fields

MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
PATCH_TYPES = (MERGE_PATCH, APPLY_PATCH, JSON_PATCH)
YAML = "application/yaml"
# What an object's create or replacement (POST, PUT) may be sent as, as for a
# custom resource in kube-apiserver: JSON, or YAML (the same safe reader as apply).
OBJECT_TYPES = ("application/json", "*/*", YAML)
# Bodies larger than this are decoded in a worker thread, not on the event loop.
OFF_LOOP_BYTES = 64 * 1024
# The longest integer a query parameter may spell (int64 has 19 digits): a
# longer one is refused before Python's int() is asked (which refuses 4,300
# digits and more with a ValueError, and takes time before that).
QUERY_INT_DIGITS = 18


def dry_run(request: Request) -> bool:
    """Whether a write asks for a dry run (`dryRun=All`, the only value
    Kubernetes defines); any other value is refused."""
    values = request.query_params.getlist("dryRun")
    for value in values:
        if value != "All":
            raise BadRequest(f'dryRun: unsupported value "{value}" (supported: "All")')
    return bool(values)


def no_dry_run(request: Request, what: str) -> None:
    """Refuse a dry run where the write has none: answering as if it were one
    and writing anyway would be the worst of both."""
    if dry_run(request):
        raise BadRequest(f"dryRun: not supported for {what}")
FIELD_VALIDATION = ("Strict", "Warn", "Ignore")


async def read_body(request: Request, max_body: int) -> bytes:
    """The whole body, refusing (413) as soon as it passes `max_body` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdecimal() and int(declared) > max_body:
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


def query_int(request: Request, name: str, *, low: int = 0,
              high: int = 10**QUERY_INT_DIGITS - 1) -> int | None:
    """The query parameter `name` as a whole number from `low` to `high` (None
    when absent or empty): the one parser of integers in query strings, so an
    over-long or non-ASCII one is a 400 naming the parameter, never a 500."""
    text = request.query_params.get(name, "")
    if not text:
        return None
    value = whole_number(text, low, high)
    if value is None:
        shown = text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"
        raise BadRequest(f"{shown!r} is not a whole number from {low} to {high}", field=name)
    return value


def whole_number(text: str, low: int = 0, high: int = 10**QUERY_INT_DIGITS - 1) -> int | None:
    """`text` as a whole number from `low` to `high`, or None: ASCII digits
    only (`str.isdigit` takes '²' and '٣', which `int` then refuses or reads),
    at most QUERY_INT_DIGITS of them. The one reading of an integer a query
    string or a dashboard form gives."""
    if not (text.isascii() and text.isdigit()) or len(text) > QUERY_INT_DIGITS:
        return None
    value = int(text)
    return value if low <= value <= high else None


def _decode(body: bytes, media: str, duplicates: list[str] | None = None) -> Any:
    if not body.strip():
        raise BadRequest("request body is empty")
    language = "YAML" if media in (APPLY_PATCH, YAML) else "JSON"
    try:
        if media in (APPLY_PATCH, YAML):
            doc = load_yaml(body, duplicates)
        elif media in ("application/json", MERGE_PATCH, JSON_PATCH, "*/*", ""):
            doc = load_json(body, duplicates)
        else:
            raise UnsupportedMediaType(f"the body's media type {media!r} is not supported here")
    except DocumentError as exc:
        raise BadRequest(f"the body is not accepted: {exc}") from None
    except ValueError as exc:
        raise BadRequest(f"the body is not valid {language}: "
                         f"{str(exc).splitlines()[0]}") from None
    try:
        # JSON may spell lone surrogates (\ud800), which are no text: refuse them
        # here rather than fail deep in validation or storage.
        json.dumps(doc, ensure_ascii=False, default=str).encode()
    except (UnicodeEncodeError, ValueError):
        raise BadRequest("the body holds a string that is not valid Unicode text") from None
    return doc


def decode_document(body: bytes, media: str) -> dict[str, Any]:
    """A JSON object (for apply YAML, of which JSON is a subset)."""
    return decode_object_body(body, media, "Ignore")[0]


def decode_object_body(body: bytes, media: str, validation: str) -> tuple[dict[str, Any], list[str]]:
    """An object's body (a create, a replacement, a merge patch or an apply)
    as a JSON object, and the warnings for keys it gives twice, judged as
    kube-apiserver's fieldValidation judges them: Strict refuses them (400),
    Warn says so, Ignore takes the last one silently."""
    duplicates: list[str] = []
    doc = _decode(body, media, duplicates if validation != "Ignore" else None)
    if not isinstance(doc, dict):
        raise BadRequest("the body must be an object")
    said = [f'duplicate field "{k}"' for k in dict.fromkeys(duplicates)]
    if said and validation == "Strict":
        raise BadRequest(f"strict decoding error: {', '.join(said)}")
    return doc, said


def decode_patch_operations(body: bytes) -> list[Any]:
    """The operations of a JSON patch (RFC 6902): a JSON list."""
    doc = _decode(body, JSON_PATCH)
    if not isinstance(doc, list):
        raise BadRequest("json patch: the body must be a list of operations")
    return doc


async def parse_document(body: bytes, media: str) -> dict[str, Any]:
    """`decode_document`, in a worker thread when the body is large."""
    if len(body) > OFF_LOOP_BYTES:
        return await run_in_threadpool(decode_document, body, media)
    return decode_document(body, media)


async def parse_object_body(body: bytes, media: str, validation: str) -> tuple[dict[str, Any], list[str]]:
    """`decode_object_body`, in a worker thread when the body is large."""
    if len(body) > OFF_LOOP_BYTES:
        return await run_in_threadpool(decode_object_body, body, media, validation)
    return decode_object_body(body, media, validation)


async def parse_patch_operations(body: bytes) -> list[Any]:
    """`decode_patch_operations`, in a worker thread when the body is large."""
    if len(body) > OFF_LOOP_BYTES:
        return await run_in_threadpool(decode_patch_operations, body)
    return decode_patch_operations(body)


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
    obj, warnings, _ = to_object_dropping(doc, kind, target, validation)
    return obj, warnings


def to_object_dropping(doc: dict[str, Any], kind: str, target: Target, validation: str = "Strict",
                       ) -> tuple[Resource, list[str], list[tuple[str, ...]]]:
    """`to_object`, and the paths of the unknown fields it dropped (under
    fieldValidation Warn or Ignore): a server-side apply leaves them out of
    its field set, as kube-apiserver's does."""
    dropped: list[tuple[str, ...]] = []
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != kind:
        raise BadRequest(f"the body must be a {kind} of apiVersion {API_VERSION} "
                         f"(got kind {doc.get('kind')!r}, apiVersion {doc.get('apiVersion')!r})")
    model = KINDS[kind]
    warnings: list[str] = []
    doc = without_nulls(doc)
    meta = doc.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        # The store records who owns what from each writer's identity; what a
        # request says of it is not read (not even kube's `[{}]` that clears it).
        doc = {**doc, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    for _ in range(2):
        try:
            return model.model_validate(doc), warnings, dropped
        except ValidationError as exc:
            unknown = [e["loc"] for e in exc.errors() if e["type"] == "extra_forbidden"]
            if not unknown:
                raise invalid_object(exc, target, kind) from None
            paths = [".".join(str(p) for p in loc) for loc in unknown]
            if validation == "Strict":
                raise unknown_fields(paths) from None
            for loc in unknown:
                _drop(doc, tuple(loc))
                dropped.append(tuple(str(p) for p in loc))
            if validation == "Warn":
                warnings += [f'unknown field "{p}"' for p in paths]
    raise ApiError(400, "BadRequest", "the body could not be decoded")


def _unapplied(message: str) -> InvalidInput:
    """A JSON patch that does not apply to the stored object (422). The field is
    `patch`, as kube-apiserver names its patch errors, so the Status carries
    the reason as a cause, which kubectl prints ("... is invalid: patch: test
    of '/spec/x' failed")."""
    return InvalidInput(message, field="patch")


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise BadRequest(f"json patch: path {path!r} is not a JSON pointer")
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for part in parts[:-1]:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise _unapplied(f"path {path!r} does not exist") from None
    return node


def _index(node: list[Any], part: str, path: str, adding: bool) -> int:
    if adding and part == "-":
        return len(node)
    if not part.isdecimal() or int(part) > len(node) - (0 if adding else 1):
        raise _unapplied(f"index {part!r} of {path!r} is out of range")
    return int(part)


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    node = _parent(doc, parts, path)
    try:
        if isinstance(node, list):
            return node[_index(node, parts[-1], path, False)]
        return node[parts[-1]]
    except (KeyError, TypeError):
        raise _unapplied(f"path {path!r} does not exist") from None


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        raise _unapplied("cannot remove the whole document")
    node = _parent(doc, parts, path)
    if isinstance(node, list):
        return node.pop(_index(node, parts[-1], path, False))
    if not isinstance(node, dict) or parts[-1] not in node:
        raise _unapplied(f"path {path!r} does not exist")
    return node.pop(parts[-1])


def _add(doc: Any, path: str, value: Any, replace: bool = False) -> Any:
    parts = _pointer(path)
    if not parts:
        return copy.deepcopy(value)
    node = _parent(doc, parts, path)
    if isinstance(node, list):
        i = _index(node, parts[-1], path, not replace)
        if replace:
            node[i] = copy.deepcopy(value)
        else:
            node.insert(i, copy.deepcopy(value))
    elif isinstance(node, dict):
        if replace and parts[-1] not in node:
            raise _unapplied(f"path {path!r} does not exist")
        node[parts[-1]] = copy.deepcopy(value)
    else:
        raise _unapplied(f"path {path!r} does not exist")
    return doc


def json_patch(doc: dict[str, Any], ops: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test) on a copy."""
    if not isinstance(ops, list):
        raise BadRequest("json patch: the body must be a list of operations")
    out: Any = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise BadRequest(f"json patch: {op!r} is not an operation with op and path")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise BadRequest(f"json patch: {kind} {path!r} needs a value")
        if kind == "add":
            out = _add(out, path, op["value"])
        elif kind == "replace":
            out = _add(out, path, op["value"], replace=True)
        elif kind == "remove":
            _remove(out, path)
        elif kind in ("move", "copy"):
            source = str(op.get("from", ""))
            value = _remove(out, source) if kind == "move" else copy.deepcopy(_get(out, source))
            out = _add(out, path, value)
        elif kind == "test":
            if _get(out, path) != op["value"]:
                raise _unapplied(f"test of {path!r} failed")
        else:
            raise BadRequest(f"json patch: unknown op {kind!r}")
    return out


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
