"""Kubernetes-style object metadata shared by every hvfleet kind."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

API_VERSION: Final = "hvfleet.io/v1"
API_GROUP = "hvfleet.io"

# RFC 1123 subdomain, as Kubernetes requires of object names.
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_KEY_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


class Model(BaseModel):
    """Base for every hvfleet model: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
    )

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def validation_message(exc: ValidationError, what: str) -> str:
    """A pydantic error as the one line a user sees: `what: loc: message`."""
    errors = exc.errors()
    first = errors[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{what}: {loc}: {msg}{more}" if loc else f"{what}: {msg}{more}"


def validate_name(name: str, where: str = "metadata.name") -> str:
    if len(name) > 253 or not _NAME_RE.match(name):
        raise ValueError(
            f"{name!r} is not a valid name (lower-case letters, digits, '-' and '.', "
            "starting and ending with a letter or digit, at most 253 characters)"
        )
    return name


class ManagedFieldsEntry(Model):
    """Who set which fields, in the shape of Kubernetes server-side apply: one
    entry per (manager, operation, subresource), so a manager's applied fields
    stay apart from what it changed by update and from what it wrote to /status."""

    manager: str
    operation: Literal["Apply", "Update"] = "Update"
    api_version: str = API_VERSION
    time: datetime | None = None
    subresource: str | None = None
    fields_type: Literal["FieldsV1"] = "FieldsV1"
    fields_v1: dict[str, Any] = Field(default_factory=dict, alias="fieldsV1")


class ObjectMeta(Model):
    name: str
    uid: str | None = None
    resource_version: str | None = None
    generation: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    creation_timestamp: datetime | None = None
    managed_fields: list[ManagedFieldsEntry] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return validate_name(v)

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if len(key) > 316 or not _LABEL_KEY_RE.match(key):
                raise ValueError(f"label key {key!r} is not a valid qualified name")
            if not _LABEL_VALUE_RE.match(value):
                raise ValueError(f"label {key}: value {value!r} is not a valid label value")
        return v


class Condition(Model):
    """The Kubernetes condition shape (metav1.Condition)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None
    observed_generation: int | None = None


def set_condition(
    conditions: list[Condition], new: Condition, now: datetime
) -> list[Condition]:
    """Return `conditions` with `new` in place; lastTransitionTime moves only when
    the status changes, as Kubernetes' meta.SetStatusCondition does."""
    out: list[Condition] = []
    found = False
    for c in conditions:
        if c.type == new.type:
            found = True
            changed = c.status != new.status
            ltt = now if changed or c.last_transition_time is None else c.last_transition_time
            out.append(new.model_copy(update={"last_transition_time": ltt}))
        else:
            out.append(c)
    if not found:
        out.append(new.model_copy(update={"last_transition_time": now}))
    return out


def find_condition(conditions: list[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)
