"""The JSON bodies and query strings Placement 16.0 accepts, as its JSON
schemas (placement/schemas/*.py, kept as data), and the small subset of JSON
Schema they use, checked here with jsonschema's messages, so a bad body gets
the 400 `JSON does not validate: ...` Placement gives, word for word where
clients and Placement's own tests read it."""

from __future__ import annotations

import copy
import re
import uuid as uuidlib
from collections.abc import Mapping
from typing import Any

from hvfleet.placement.errors import PlacementBadRequest

MAX_INT = 2147483647
SQL_SP_FLOAT_MAX = 3.40282e38

UUID_PATTERN = "^[0-9a-fA-F-]{36}$"
RC_PATTERN = "^[A-Z0-9_]+$"
CUSTOM_PATTERN = "^CUSTOM_[A-Z0-9_]+$"
CONSUMER_TYPE_GET_PATTERN = RC_PATTERN + "|^all|^unknown$"
GROUP_PAT_1_33 = r"[a-zA-Z0-9_-]{1,64}"

Schema = dict[str, Any]


def is_uuid_like(value: object) -> bool:
    """oslo.utils' is_uuid_like: a uuid with or without dashes, any case."""
    if not isinstance(value, str):
        return False
    try:
        return str(uuidlib.UUID(value)).replace("-", "") == value.replace("-", "").lower()
    except (TypeError, ValueError, AttributeError):
        return False


def _py(value: Any) -> str:
    return repr(value)


_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool))
    or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
}


Found = tuple[str, str, tuple[str, ...]]  # (message, keyword, schema path)


def errors_of(value: Any, schema: Schema) -> list[str]:
    """jsonschema's messages for `value` against `schema` (the subset Placement uses)."""
    return [message for message, _, _ in _errors(value, schema, ())]


def _errors(value: Any, schema: Schema, at: tuple[str, ...]) -> list[Found]:
    out: list[Found] = []
    t = schema.get("type")
    if t is not None:
        types = t if isinstance(t, list) else [t]
        if not any(_TYPES[x](value) for x in types):
            shown = ", ".join(repr(x) for x in types) if isinstance(t, list) else repr(t)
            return [(f"{_py(value)} is not of type {shown}", "type", at)]
    if "anyOf" in schema and all(errors_of(value, s) for s in schema["anyOf"]):
        out.append((f"{_py(value)} is not valid under any of the given schemas", "anyOf", at))
    if "enum" in schema and value not in schema["enum"]:
        out.append((f"{_py(value)} is not one of {schema['enum']!r}", "enum", at))
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            out.append((f"{_py(value)} is too short", "minLength", at))
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            out.append((f"{_py(value)} is too long", "maxLength", at))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append((f"{_py(value)} does not match {schema['pattern']!r}", "pattern", at))
        if schema.get("format") == "uuid" and not is_uuid_like(value):
            out.append((f"{_py(value)} is not a 'uuid'", "format", at))
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            out.append((f"{_py(value)} is less than the minimum of {schema['minimum']}", "minimum", at))
        if "maximum" in schema and value > schema["maximum"]:
            out.append((f"{_py(value)} is greater than the maximum of {schema['maximum']}", "maximum", at))
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            out.append((f"{_py(value)} is too short", "minItems", at))
        if schema.get("uniqueItems") and len({repr(v) for v in value}) != len(value):
            out.append((f"{_py(value)} has non-unique elements", "uniqueItems", at))
        if "items" in schema:
            for item in value:
                out.extend(_errors(item, schema["items"], (*at, "items")))
    if isinstance(value, dict):
        if "minProperties" in schema and len(value) < schema["minProperties"]:
            out.append((f"{_py(value)} does not have enough properties", "minProperties", at))
        for name in schema.get("required", []):
            if name not in value:
                out.append((f"{name!r} is a required property", "required", at))
        props: Mapping[str, Schema] = schema.get("properties", {})
        patterns: Mapping[str, Schema] = schema.get("patternProperties", {})
        extra: list[str] = []
        for key, item in value.items():
            matched = False
            if key in props:
                matched = True
                out.extend(_errors(item, props[key], (*at, "properties", key)))
            for pattern, sub in patterns.items():
                if re.search(pattern, key):
                    matched = True
                    out.extend(_errors(item, sub, (*at, "patternProperties", pattern)))
            if not matched:
                extra.append(key)
        if extra and schema.get("additionalProperties") is False:
            if patterns:
                regexes = ", ".join(repr(p) for p in sorted(patterns))
                verb = "does" if len(extra) == 1 else "do"
                out.append((f"{', '.join(repr(e) for e in sorted(extra))} {verb} not match any "
                            f"of the regexes: {regexes}", "additionalProperties", at))
            else:
                verb = "was" if len(extra) == 1 else "were"
                out.append(("Additional properties are not allowed "
                            f"({', '.join(repr(e) for e in extra)} {verb} unexpected)",
                            "additionalProperties", at))
    return out


def _explained(found: Found) -> str:
    """What str(jsonschema.ValidationError) says: the message, then the keyword
    and where in the schema it failed (clients and Placement's tests read both)."""
    message, keyword, at = found
    path = "".join(f"[{p!r}]" for p in at)
    return f"{message}\n\nFailed validating {keyword!r} in schema{path}"


def validate(value: Any, schema: Schema) -> None:
    """PlacementBadRequest `JSON does not validate: ...` unless `value` matches."""
    errors = _errors(value, schema, ())
    if errors:
        raise PlacementBadRequest(f"JSON does not validate: {_explained(errors[0])}")


def validate_query(params: Mapping[str, Any], schema: Schema) -> None:
    """A query string (first value of each key) against its schema, with the
    message Placement's validate_query_params gives."""
    errors = _errors(dict(params), schema, ())
    if errors:
        raise PlacementBadRequest(f"Invalid query string parameters: {_explained(errors[0])}")


# -- the schemas ---------------------------------------------------------------------

_STR = {"type": "string"}
_UUID = {"type": "string", "format": "uuid"}

POST_RP: Schema = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 200}, "uuid": _UUID},
    "required": ["name"],
    "additionalProperties": False,
}
PUT_RP: Schema = copy.deepcopy(POST_RP)
del PUT_RP["properties"]["uuid"]
POST_RP_1_14: Schema = copy.deepcopy(POST_RP)
POST_RP_1_14["properties"]["parent_provider_uuid"] = {
    "anyOf": [{"type": "string", "format": "uuid"}, {"type": "null"}]}
PUT_RP_1_14: Schema = copy.deepcopy(POST_RP_1_14)
del PUT_RP_1_14["properties"]["uuid"]

GET_RPS_1_0: Schema = {"type": "object", "properties": {"name": _STR, "uuid": _UUID},
                       "additionalProperties": False}
GET_RPS_1_3: Schema = copy.deepcopy(GET_RPS_1_0)
GET_RPS_1_3["properties"]["member_of"] = _STR
GET_RPS_1_4: Schema = copy.deepcopy(GET_RPS_1_3)
GET_RPS_1_4["properties"]["resources"] = _STR
GET_RPS_1_14: Schema = copy.deepcopy(GET_RPS_1_4)
GET_RPS_1_14["properties"]["in_tree"] = _UUID
GET_RPS_1_18: Schema = copy.deepcopy(GET_RPS_1_14)
GET_RPS_1_18["properties"]["required"] = _STR


def _int(minimum: int) -> Schema:
    return {"type": "integer", "maximum": MAX_INT, "minimum": minimum}


BASE_INVENTORY: Schema = {
    "type": "object",
    "properties": {
        "resource_provider_generation": {"type": "integer"},
        "total": _int(1), "reserved": _int(0), "min_unit": _int(1), "max_unit": _int(1),
        "step_size": _int(1),
        "allocation_ratio": {"type": "number", "maximum": SQL_SP_FLOAT_MAX},
    },
    "required": ["total", "resource_provider_generation"],
    "additionalProperties": False,
}
POST_INVENTORY: Schema = copy.deepcopy(BASE_INVENTORY)
POST_INVENTORY["properties"]["resource_class"] = {"type": "string", "pattern": RC_PATTERN}
POST_INVENTORY["required"] = ["total", "resource_class"]
PUT_INVENTORY_RECORD: Schema = copy.deepcopy(BASE_INVENTORY)
PUT_INVENTORY_RECORD["required"] = ["total"]
PUT_INVENTORY: Schema = {
    "type": "object",
    "properties": {
        "resource_provider_generation": {"type": "integer"},
        "inventories": {"type": "object", "patternProperties": {RC_PATTERN: PUT_INVENTORY_RECORD}},
    },
    "required": ["resource_provider_generation", "inventories"],
    "additionalProperties": False,
}

TRAIT: Schema = {"type": "string", "minLength": 1, "maxLength": 255}
SET_TRAITS_FOR_RP: Schema = {
    "type": "object",
    "properties": {"traits": {"type": "array", "items": TRAIT},
                   "resource_provider_generation": {"type": "integer"}},
    "required": ["traits", "resource_provider_generation"],
    "additionalProperties": False,
}
LIST_TRAIT: Schema = {"type": "object", "properties": {"name": _STR, "associated": _STR},
                      "additionalProperties": False}

_AGGREGATES: Schema = {"type": "array", "items": _UUID, "uniqueItems": True}
PUT_AGGREGATES_1_1: Schema = copy.deepcopy(_AGGREGATES)
PUT_AGGREGATES_1_19: Schema = {
    "type": "object",
    "properties": {"aggregates": copy.deepcopy(_AGGREGATES),
                   "resource_provider_generation": {"type": "integer"}},
    "required": ["aggregates", "resource_provider_generation"],
    "additionalProperties": False,
}

POST_RC: Schema = {
    "type": "object",
    "properties": {"name": {"type": "string", "pattern": CUSTOM_PATTERN, "maxLength": 255}},
    "required": ["name"],
    "additionalProperties": False,
}

GET_USAGES_1_9: Schema = {
    "type": "object",
    "properties": {"project_id": {"type": "string", "minLength": 1, "maxLength": 255},
                   "user_id": {"type": "string", "minLength": 1, "maxLength": 255}},
    "required": ["project_id"],
    "additionalProperties": False,
}
GET_USAGES_1_38: Schema = copy.deepcopy(GET_USAGES_1_9)
GET_USAGES_1_38["properties"]["consumer_type"] = {
    "type": "string", "pattern": CONSUMER_TYPE_GET_PATTERN, "minLength": 1, "maxLength": 255}

_RESOURCES: Schema = {
    "type": "object",
    "minProperties": 1,
    "patternProperties": {RC_PATTERN: {"type": "integer", "minimum": 1}},
    "additionalProperties": False,
}
_ID: Schema = {"type": "string", "minLength": 1, "maxLength": 255}
ALLOCATION_1_0: Schema = {
    "type": "object",
    "properties": {
        "allocations": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "resource_provider": {"type": "object", "properties": {"uuid": _UUID},
                                          "additionalProperties": False, "required": ["uuid"]},
                    "resources": _RESOURCES,
                },
                "required": ["resource_provider", "resources"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["allocations"],
    "additionalProperties": False,
}
ALLOCATION_1_8: Schema = copy.deepcopy(ALLOCATION_1_0)
ALLOCATION_1_8["properties"]["project_id"] = _ID
ALLOCATION_1_8["properties"]["user_id"] = _ID
ALLOCATION_1_8["required"] += ["project_id", "user_id"]
ALLOCATION_1_12: Schema = {
    "type": "object",
    "properties": {
        "allocations": {
            "type": "object",
            "minProperties": 1,
            "patternProperties": {
                UUID_PATTERN: {
                    "type": "object",
                    "properties": {"generation": {"type": "integer"}, "resources": _RESOURCES},
                    "required": ["resources"],
                    "additionalProperties": False,
                }
            },
            "additionalProperties": False,
        },
        "project_id": _ID,
        "user_id": _ID,
    },
    "additionalProperties": False,
    "required": ["allocations", "project_id", "user_id"],
}
DELETABLE_ALLOCATIONS: Schema = copy.deepcopy(ALLOCATION_1_12)
DELETABLE_ALLOCATIONS["properties"]["allocations"]["minProperties"] = 0
POST_ALLOCATIONS_1_13: Schema = {
    "type": "object",
    "minProperties": 1,
    "additionalProperties": False,
    "patternProperties": {UUID_PATTERN: DELETABLE_ALLOCATIONS},
}
ALLOCATION_1_28: Schema = copy.deepcopy(DELETABLE_ALLOCATIONS)
ALLOCATION_1_28["properties"]["consumer_generation"] = {"type": ["integer", "null"]}
ALLOCATION_1_28["required"].append("consumer_generation")
POST_ALLOCATIONS_1_28: Schema = copy.deepcopy(POST_ALLOCATIONS_1_13)
POST_ALLOCATIONS_1_28["patternProperties"] = {UUID_PATTERN: ALLOCATION_1_28}
MAPPINGS: Schema = {
    "type": "object",
    "minProperties": 1,
    "patternProperties": {GROUP_PAT_1_33: {"type": "array", "minItems": 1, "items": _UUID}},
}
ALLOCATION_1_34: Schema = copy.deepcopy(ALLOCATION_1_28)
ALLOCATION_1_34["properties"]["mappings"] = MAPPINGS
POST_ALLOCATIONS_1_34: Schema = copy.deepcopy(POST_ALLOCATIONS_1_28)
POST_ALLOCATIONS_1_34["patternProperties"] = {UUID_PATTERN: ALLOCATION_1_34}
ALLOCATION_1_38: Schema = copy.deepcopy(ALLOCATION_1_34)
ALLOCATION_1_38["properties"]["consumer_type"] = {
    "type": "string", "pattern": RC_PATTERN, "minLength": 1, "maxLength": 255}
ALLOCATION_1_38["required"].append("consumer_type")
POST_ALLOCATIONS_1_38: Schema = copy.deepcopy(POST_ALLOCATIONS_1_34)
POST_ALLOCATIONS_1_38["patternProperties"] = {UUID_PATTERN: ALLOCATION_1_38}


def reshaper(allocations: Schema) -> Schema:
    """POST /reshaper (1.30): inventories by provider, allocations by consumer."""
    return {
        "type": "object",
        "properties": {
            "inventories": {"type": "object", "patternProperties": {UUID_PATTERN: PUT_INVENTORY},
                            "additionalProperties": False},
            "allocations": {**allocations, "minProperties": 0},
        },
        "required": ["inventories", "allocations"],
        "additionalProperties": False,
    }
