"""/openapi/v2 in protobuf, the encoding kubectl up to 1.2x asks for.

kubectl 1.20 validates manifests and answers `explain` from the Swagger 2.0
document, and it accepts it only as protobuf (the gnostic `openapi.v2.Document`
message). This writes that message directly from the JSON document of
`hvfleet.server.openapi` — `swagger`, `info`, `definitions`, and of `paths`
the operations' parameters and extensions (kubectl 1.20 decides whether a kind
supports `--dry-run=server` from its PATCH operation's `dryRun` parameter),
which is what those clients read — so there is no generated code and no
protobuf dependency. Field numbers are those of gnostic's OpenAPIv2.proto.
"""

from __future__ import annotations

import functools
import struct
from typing import Any

import yaml

from hvfleet.server.openapi import openapi_v2

PROTOBUF_MEDIA = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
# What the answer says it is: '@' is no token character, so Go's mime parser (and
# with it client-go) refuses the asked-for name in a Content-Type header.
PROTOBUF_CONTENT_TYPE = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"

# openapi.v2.Schema field numbers.
_SCHEMA_STRINGS = {"$ref": 1, "format": 2, "title": 3, "description": 4, "pattern": 13}
_SCHEMA_DOUBLES = {"multipleOf": 6, "maximum": 7, "minimum": 9}
_SCHEMA_BOOLS = {"exclusiveMaximum": 8, "exclusiveMinimum": 10, "uniqueItems": 16, "readOnly": 27}
_SCHEMA_INTS = {"maxLength": 11, "minLength": 12, "maxItems": 14, "minItems": 15,
                "maxProperties": 17, "minProperties": 18}


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _bytes(field: int, data: bytes) -> bytes:
    return _key(field, 2) + _varint(len(data)) + data


def _string(field: int, text: str) -> bytes:
    return _bytes(field, text.encode())


def _bool(field: int, value: bool) -> bytes:
    return _key(field, 0) + _varint(1 if value else 0)


def _any(field: int, value: Any) -> bytes:
    """openapi.v2.Any with the value as YAML (its field 2)."""
    return _bytes(field, _string(2, yaml.safe_dump(value, default_flow_style=False)))


def _named_any(field: int, name: str, value: Any) -> bytes:
    return _bytes(field, _string(1, name) + _any(2, value))


def schema(node: dict[str, Any]) -> bytes:
    out = bytearray()
    for key, value in node.items():
        if key in _SCHEMA_STRINGS and isinstance(value, str):
            out += _string(_SCHEMA_STRINGS[key], value)
        elif key in _SCHEMA_DOUBLES and isinstance(value, (int, float)):
            out += _key(_SCHEMA_DOUBLES[key], 1) + struct.pack("<d", float(value))
        elif key in _SCHEMA_BOOLS and isinstance(value, bool):
            out += _bool(_SCHEMA_BOOLS[key], value)
        elif key in _SCHEMA_INTS and isinstance(value, int):
            out += _key(_SCHEMA_INTS[key], 0) + _varint(value)
        elif key == "default":
            out += _any(5, value)
        elif key == "required":
            for name in value:
                out += _string(19, name)
        elif key == "enum":
            for item in value:
                out += _any(20, item)
        elif key == "additionalProperties":
            item = _bytes(1, schema(value)) if isinstance(value, dict) else _bool(2, bool(value))
            out += _bytes(21, item)
        elif key == "type":
            types = value if isinstance(value, list) else [value]
            out += _bytes(22, b"".join(_string(1, t) for t in types))
        elif key == "items" and isinstance(value, dict):
            out += _bytes(23, _bytes(1, schema(value)))
        elif key == "allOf":
            for sub in value:
                out += _bytes(24, schema(sub))
        elif key == "properties":
            props = b"".join(_bytes(1, _string(1, name) + _bytes(2, schema(sub)))
                             for name, sub in value.items())
            out += _bytes(25, props)
        elif key.startswith("x-"):
            out += _named_any(31, key, value)
    return bytes(out)


# openapi.v2.PathItem's operations, and where a non-body parameter's sub-schema
# (NonBodyParameter field) keeps its `type`.
_PATH_OPERATIONS = {"get": 2, "put": 3, "post": 4, "delete": 5, "patch": 8}
_NON_BODY = {"header": (1, 5), "query": (3, 6), "path": (4, 5)}


def parameter(node: dict[str, Any]) -> bytes:
    """One openapi.v2.ParametersItem (a Parameter: body or non-body)."""
    where = node.get("in", "")
    if where == "body":
        body = (_string(1, node.get("description", "")) + _string(2, node.get("name", ""))
                + _string(3, where) + _bool(4, bool(node.get("required")))
                + _bytes(5, schema(node.get("schema", {}))))
        return _bytes(1, _bytes(1, body))
    sub, type_field = _NON_BODY.get(where, _NON_BODY["query"])
    fields = (_bool(1, bool(node.get("required"))) + _string(2, where)
              + _string(3, node.get("description", "")) + _string(4, node.get("name", ""))
              + _string(type_field, node.get("type", "string")))
    return _bytes(1, _bytes(2, _bytes(sub, fields)))


def operation(node: dict[str, Any]) -> bytes:
    """One openapi.v2.Operation: what kubectl reads of it is the parameters and
    the x-kubernetes-group-version-kind (a PATCH with a dryRun parameter is how
    kubectl 1.20 learns a kind supports --dry-run=server)."""
    out = bytearray()
    for tag in node.get("tags", []):
        out += _string(1, tag)
    out += _string(2, node.get("summary", "")) + _string(5, node.get("operationId", ""))
    for media in node.get("produces", []):
        out += _string(6, media)
    for media in node.get("consumes", []):
        out += _string(7, media)
    for p in node.get("parameters", []):
        out += _bytes(8, parameter(p))
    for key, value in node.items():
        if key.startswith("x-"):
            out += _named_any(13, key, value)
    return bytes(out)


def path_item(node: dict[str, Any]) -> bytes:
    out = bytearray()
    for method, field in _PATH_OPERATIONS.items():
        if method in node:
            out += _bytes(field, operation(node[method]))
    for p in node.get("parameters", []):
        out += _bytes(9, parameter(p))
    return bytes(out)


def document(doc: dict[str, Any]) -> bytes:
    info = doc.get("info", {})
    paths = b"".join(_bytes(2, _string(1, path) + _bytes(2, path_item(item)))
                     for path, item in doc.get("paths", {}).items())
    definitions = b"".join(_bytes(1, _string(1, name) + _bytes(2, schema(s)))
                           for name, s in doc.get("definitions", {}).items())
    return (_string(1, doc.get("swagger", "2.0"))
            + _bytes(2, _string(1, info.get("title", "")) + _string(2, info.get("version", "")))
            + _bytes(8, paths) + _bytes(9, definitions))


@functools.cache
def openapi_v2_protobuf() -> bytes:
    return document(openapi_v2())
