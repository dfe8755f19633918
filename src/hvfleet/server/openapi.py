"""OpenAPI documents (/openapi/v2, /openapi/v3, /openapi/v3/apis/hvfleet.io/v1).

Generated from the same structural schemas as `hvfleet crd` (via discovery's
RESOURCES), as kube-apiserver publishes a CRD's schema: the v3 document keeps
the schema as written; the v2 one drops what Swagger 2.0 cannot say (anyOf,
nullable), as the apiserver does. Every PATCH operation lists the
`fieldValidation` parameter and names its group/version/kind: that is how
kubectl finds out that the server validates fields itself. Every kind's
`metadata` refers to the one ObjectMeta schema (as kube-apiserver publishes
it for a CRD), and every field has a description (hvfleet.model.field_docs),
so `kubectl explain hypervisor.spec.overcommit` explains it.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from typing import Any

from hvfleet import __version__
from hvfleet.model.crd import plain_schema
from hvfleet.model.field_docs import FIELD_DOCS, OBJECT_META_DOCS, describe
from hvfleet.model.meta import API_GROUP, ObjectMeta
from hvfleet.server.discovery import RESOURCES, ResourceInfo

GV_PATH = f"apis/{API_GROUP}/v1"
_REVERSED_GROUP = ".".join(reversed(API_GROUP.split(".")))


def definition_name(kind: str) -> str:
    return f"{_REVERSED_GROUP}.v1.{kind}"


def _gvk(kind: str) -> list[dict[str, str]]:
    return [{"group": API_GROUP, "version": "v1", "kind": kind}]


def _query(name: str, description: str, type_: str = "string") -> dict[str, Any]:
    return {"name": name, "in": "query", "description": description, "type": type_}


_LIST_PARAMS = [
    _query("labelSelector", "Only objects whose labels match."),
    _query("fieldSelector", "Only metadata.name=NAME is supported."),
    _query("limit", "At most this many items; see continue.", "integer"),
    _query("continue", "The token a previous page returned."),
    _query("resourceVersion", "List: read at least this fresh; watch: events after it."),
    _query("watch", "Stream events (newline-delimited JSON).", "boolean"),
    _query("allowWatchBookmarks", "Send BOOKMARK events.", "boolean"),
    _query("timeoutSeconds", "End the list/watch call after this long.", "integer"),
]
_WRITE_PARAMS = [
    _query("dryRun", "All: run every check of the write (authorization included) and "
           "answer as it would, writing nothing. The only value."),
    _query("fieldManager", "Accepted for compatibility: the field manager is the caller's identity."),
    _query("fieldValidation", "Warn (default: drop them, with a Warning header), Strict or "
           "Ignore: what to do with unknown fields."),
]
_PATCH_PARAMS = [*_WRITE_PARAMS, _query("force", "Server-side apply: take over conflicting fields.",
                                        "boolean")]
_PATCH_TYPES = ["application/merge-patch+json", "application/apply-patch+yaml"]


def _ref2(kind: str) -> dict[str, str]:
    return {"$ref": f"#/definitions/{definition_name(kind)}"}


def _op2(r: ResourceInfo, action: str, verb: str, summary: str, params: list[dict[str, Any]],
         body: bool, response_kind: str, sub: str = "") -> dict[str, Any]:
    op_id = f"{verb}{r.kind}{sub.capitalize()}"
    op: dict[str, Any] = {
        "operationId": op_id, "summary": summary, "consumes": ["application/json"],
        "produces": ["application/json", "application/yaml"],
        "parameters": list(params), "tags": [f"{API_GROUP}_v1"],
        "responses": {"200": {"description": "OK", "schema": _ref2(response_kind)},
                      "401": {"description": "Unauthorized"}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(r.kind)[0],
    }
    if body:
        op["parameters"].append({"name": "body", "in": "body", "required": True,
                                 "schema": {"type": "object"} if verb == "patch" else _ref2(r.kind)})
    if verb == "patch":
        op["consumes"] = _PATCH_TYPES
    return op


def _paths2(r: ResourceInfo) -> dict[str, Any]:
    base = f"/{GV_PATH}/{r.plural}"
    name_param = [{"name": "name", "in": "path", "required": True, "type": "string",
                   "description": f"name of the {r.kind}"}]
    item = {
        "get": _op2(r, "get", "read", f"read the {r.kind}", [], False, r.kind),
        "put": _op2(r, "put", "replace", f"replace the {r.kind}", _WRITE_PARAMS, True, r.kind),
        "patch": _op2(r, "patch", "patch", f"patch the {r.kind}", _PATCH_PARAMS, True, r.kind),
        "delete": _op2(r, "delete", "delete", f"delete the {r.kind}", [], False, r.kind),
        "parameters": name_param,
    }
    status: dict[str, Any] = {
        "get": _op2(r, "get", "read", f"read status of the {r.kind}", [], False, r.kind, "status"),
        "put": _op2(r, "put", "replace", f"replace status of the {r.kind}", _WRITE_PARAMS, True,
                    r.kind, "status"),
        "patch": _op2(r, "patch", "patch", f"patch status of the {r.kind}", _PATCH_PARAMS, True,
                      r.kind, "status"),
        "parameters": name_param,
    }
    paths: dict[str, Any] = {
        base: {
            "get": _op2(r, "list", "list", f"list or watch {r.kind}s", _LIST_PARAMS, False,
                        f"{r.kind}List"),
            "post": _op2(r, "post", "create", f"create a {r.kind}", _WRITE_PARAMS, True, r.kind),
        },
        f"{base}/{{name}}": item,
    }
    if r.has_status:
        paths[f"{base}/{{name}}/status"] = status
    return paths


def _to_v2(node: Any) -> Any:
    """A structural v3 schema in Swagger 2.0 terms, as kube-apiserver converts it."""
    if isinstance(node, list):
        return [_to_v2(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("anyOf", "oneOf", "not", "nullable"):
            continue
        out[key] = _to_v2(value)
    return out


OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


@functools.cache
def object_meta_schema() -> dict[str, Any]:
    """ObjectMeta as hvfleet stores it, every field described."""
    return describe(plain_schema(ObjectMeta), OBJECT_META_DOCS)


def _with_gvk(schema: dict[str, Any], kind: str, meta_ref: dict[str, Any] | None = None) -> dict[str, Any]:
    out = copy.deepcopy(schema)
    out["x-kubernetes-group-version-kind"] = _gvk(kind)
    if meta_ref is not None:
        # What a CRD's schema leaves to the server, the server publishes.
        out.setdefault("properties", {})["metadata"] = {
            **meta_ref, "description": FIELD_DOCS[kind]["metadata"]}
    return out


def _list_schema(r: ResourceInfo, ref: dict[str, str]) -> dict[str, Any]:
    return {
        "type": "object", "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"},
            "metadata": {"type": "object"}, "items": {"type": "array", "items": ref},
        },
        "x-kubernetes-group-version-kind": _gvk(f"{r.kind}List"),
    }


@functools.cache
def openapi_v2() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    definitions: dict[str, Any] = {}
    for r in RESOURCES.values():
        paths.update(_paths2(r))
        definitions[definition_name(r.kind)] = _with_gvk(
            _to_v2(r.schema), r.kind, {"$ref": f"#/definitions/{OBJECT_META}"})
        definitions[definition_name(f"{r.kind}List")] = _list_schema(r, _ref2(r.kind))
    definitions[OBJECT_META] = _to_v2(object_meta_schema())
    return {"swagger": "2.0", "info": {"title": "hvfleet", "version": __version__},
            "paths": paths, "definitions": definitions}


def _to_v3_op(op2: dict[str, Any]) -> dict[str, Any]:
    op: dict[str, Any] = {k: v for k, v in op2.items()
                          if k not in ("consumes", "produces", "parameters", "responses")}
    params = []
    for p in op2.get("parameters", []):
        if p["in"] == "body":
            types = op2["consumes"]
            schema = p["schema"]
            if "$ref" in schema:
                schema = {"$ref": schema["$ref"].replace("#/definitions/", "#/components/schemas/")}
            op["requestBody"] = {"required": True,
                                 "content": {t: {"schema": schema} for t in types}}
            continue
        params.append({"name": p["name"], "in": p["in"], "description": p.get("description", ""),
                       "required": p.get("required", False),
                       "schema": {"type": p.get("type", "string"), "uniqueItems": True}})
    if params:
        op["parameters"] = params
    ref = op2["responses"]["200"]["schema"]["$ref"].replace("#/definitions/", "#/components/schemas/")
    op["responses"] = {
        "200": {"description": "OK", "content": {t: {"schema": {"$ref": ref}}
                                                 for t in op2["produces"]}},
        "401": {"description": "Unauthorized"},
    }
    return op


@functools.cache
def openapi_v3_group() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for r in RESOURCES.values():
        for path, item in _paths2(r).items():
            out: dict[str, Any] = {}
            for method, op in item.items():
                if method == "parameters":
                    out["parameters"] = [
                        {"name": p["name"], "in": p["in"], "required": True,
                         "description": p["description"], "schema": {"type": "string"}}
                        for p in op
                    ]
                else:
                    out[method] = _to_v3_op(op)
            paths[path] = out
        ref = {"$ref": f"#/components/schemas/{definition_name(r.kind)}"}
        schemas[definition_name(r.kind)] = _with_gvk(
            r.schema, r.kind, {"allOf": [{"$ref": f"#/components/schemas/{OBJECT_META}"}]})
        schemas[definition_name(f"{r.kind}List")] = _list_schema(r, ref)
    schemas[OBJECT_META] = object_meta_schema()
    return {"openapi": "3.0.0", "info": {"title": "hvfleet", "version": __version__},
            "paths": paths, "components": {"schemas": schemas}}


@functools.cache
def openapi_v3_root() -> dict[str, Any]:
    digest = hashlib.sha512(json.dumps(openapi_v3_group(), sort_keys=True).encode()).hexdigest()
    return {"paths": {GV_PATH: {"serverRelativeURL": f"/openapi/v3/{GV_PATH}?hash={digest[:64]}"}}}
