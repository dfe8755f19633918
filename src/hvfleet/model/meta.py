"""Kubernetes-style object metadata shared by every hvfleet kind."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from hvfleet.model.bounds import (
    MAX_ANNOTATIONS_BYTES,
    MAX_LABELS,
    MAX_MANAGER,
    MAX_NAME,
    MAX_TEXT,
    Count,
    Reason,
    Timestamp,
)

API_VERSION: Final = "hvfleet.io/v1"
API_GROUP = "hvfleet.io"

# RFC 1123 subdomain, as Kubernetes requires of object names.
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Kubernetes' qualified name (label and annotation keys, condition types): an
# optional DNS-subdomain prefix of at most 253 characters and '/', then a name
# of at most 63; and a label value: at most 63, empty allowed.
_QUALIFIED_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def qualified_name_error(key: str) -> str | None:
    """Why `key` is not a Kubernetes qualified name (`prefix/name` or `name`), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > MAX_NAME or not _NAME_RE.match(prefix)):
        return (f"{key[:80]!r}: the prefix must be a DNS subdomain (lower-case letters, digits, "
                "'-' and '.') of at most 253 characters")
    if not _QUALIFIED_NAME_RE.match(name):
        return (f"{key[:80]!r}: the name must be 1 to 63 letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit")
    return None


def label_value_error(value: str) -> str | None:
    """Why `value` is not a label value (at most 63 characters), or None."""
    if not _LABEL_VALUE_RE.match(value):
        return (f"{value[:80]!r} is not a valid label value (at most 63 letters, digits, '-', "
                "'_' or '.', starting and ending with a letter or digit)")
    return None


V = TypeVar("V", bound=Sequence[str] | None)


def valid_each(values: V, error_of: Callable[[str], str | None],
               message: Callable[[str, str], str] = lambda _value, why: why) -> V:
    """`values` as they are, or a ValueError about the first one `error_of`
    refuses, worded by `message(value, why)`."""
    for value in () if values is None else values:
        why = error_of(value)
        if why is not None:
            raise ValueError(message(value, why))
    return values


def valid_labels(labels: dict[str, str], bad_key: str, bad_value: str) -> dict[str, str]:
    """`labels` as they are, or a ValueError about the first entry the
    Kubernetes label grammar refuses, each caller wording its message: `bad_key`
    and `bad_value` are templates of `{key}` and `{why}`."""
    for key, value in labels.items():
        why = qualified_name_error(key)
        if why is not None:
            raise ValueError(bad_key.format(key=key, why=why))
        why = label_value_error(value)
        if why is not None:
            raise ValueError(bad_value.format(key=key, why=why))
    return labels


class Model(BaseModel):
    """Base for every hvfleet model: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
        # Every string field (and map key) of every kind; fields with their own
        # grammar are tighter (hvfleet.model.bounds).
        str_max_length=MAX_TEXT,
    )

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def to_json(self) -> bytes:
        """`to_dict` as compact JSON, built by pydantic's serializer in one step
        (the API's answers and watch events: no dict built and walked again)."""
        return self.model_dump_json(by_alias=True, exclude_none=True).encode()


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

    manager: str = Field(max_length=MAX_MANAGER)
    operation: Literal["Apply", "Update"] = "Update"
    api_version: str = Field(default=API_VERSION, max_length=MAX_NAME)
    time: Timestamp | None = None
    subresource: str | None = Field(default=None, max_length=MAX_NAME)
    fields_type: Literal["FieldsV1"] = "FieldsV1"
    fields_v1: dict[str, Any] = Field(default_factory=dict, alias="fieldsV1")


# Random characters a generated name ends with (kube's utilrand alphabet: no
# vowels, no look-alikes), and how long the prefix may be before them.
GENERATED_SUFFIX_LENGTH = 5
MAX_GENERATE_NAME_PREFIX = 58


class OwnerReference(Model):
    """An object this one belongs to: when every owner is gone, it is deleted
    too (hvfleet.store.lifecycle's garbage collector). `uid` tells the owner
    from a later object of the same name."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return validate_name(v)

    @field_validator("api_version", "kind", "uid")
    @classmethod
    def _required(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v


class ObjectMeta(Model):
    # Annotation values may be long (kubectl's last-applied-configuration); their
    # total is bounded below.
    model_config = ConfigDict(str_max_length=MAX_ANNOTATIONS_BYTES)

    # Empty only in a create that asks for a generated one (generateName).
    name: str = ""
    generate_name: str | None = Field(default=None, max_length=253)
    uid: str | None = Field(default=None, max_length=128)
    resource_version: str | None = Field(default=None, max_length=64)
    generation: Count = 0
    labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_LABELS)
    annotations: dict[str, str] = Field(default_factory=dict)
    creation_timestamp: Timestamp | None = None
    # Set by a DELETE of an object that still has finalizers; it is removed
    # when the last finalizer is (hvfleet.store.lifecycle).
    deletion_timestamp: Timestamp | None = None
    deletion_grace_period_seconds: Count | None = None
    # None rather than empty, so objects without them read (and store) as before.
    finalizers: list[str] | None = Field(default=None, max_length=MAX_LABELS)
    owner_references: list[OwnerReference] | None = Field(default=None, max_length=MAX_LABELS)
    managed_fields: list[ManagedFieldsEntry] = Field(default_factory=list, max_length=MAX_LABELS)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return v if v == "" else validate_name(v)

    @field_validator("generate_name")
    @classmethod
    def _generate_name(cls, v: str | None) -> str | None:
        if v:
            # Whatever the suffix, the generated name must be a valid one.
            try:
                validate_name(v[:MAX_GENERATE_NAME_PREFIX] + "x" * GENERATED_SUFFIX_LENGTH)
            except ValueError:
                raise ValueError(f"{v!r} is not a valid prefix for a name (lower-case letters, "
                                 "digits, '-' and '.', starting with a letter or digit)") from None
        return v

    @field_validator("finalizers")
    @classmethod
    def _finalizers(cls, v: list[str] | None) -> list[str] | None:
        return valid_each(v, qualified_name_error, lambda f, why: f"finalizer {f[:64]!r}: {why}")

    @field_validator("owner_references")
    @classmethod
    def _one_controller(cls, v: list[OwnerReference] | None) -> list[OwnerReference] | None:
        if sum(1 for r in v or [] if r.controller) > 1:
            raise ValueError("only one reference can have controller set to true")
        return v

    @model_validator(mode="after")
    def _named(self) -> ObjectMeta:
        if not self.name and not self.generate_name:
            raise ValueError("name or generateName is required")
        return self

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        return valid_labels(v, "label key {why}", "label {key}: value {why}")

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, v: dict[str, str]) -> dict[str, str]:
        total = 0
        for key, value in v.items():
            why = qualified_name_error(key)
            if why is not None:
                raise ValueError(f"annotation key {why}")
            total += len(key.encode()) + len(value.encode())
        if total > MAX_ANNOTATIONS_BYTES:
            raise ValueError(f"annotations hold {total} bytes, more than {MAX_ANNOTATIONS_BYTES}")
        return v


class Condition(Model):
    """The Kubernetes condition shape (metav1.Condition)."""

    type: str = Field(max_length=316)
    status: Literal["True", "False", "Unknown"]
    reason: Reason = ""
    message: str = ""
    last_transition_time: Timestamp | None = None
    observed_generation: Count | None = None


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


class NoStatus(Model):
    """The status of a kind that keeps everything in its spec."""


class StoredObject(Model):
    """What every stored kind starts with, in its order on the wire: its
    apiVersion, its kind and its metadata (and `name`). Each kind narrows
    `kind` to its own name (the field keeps its place) and declares `spec` and
    `status` after them."""

    api_version: Literal["hvfleet.io/v1"] = API_VERSION
    kind: str
    metadata: ObjectMeta

    @property
    def name(self) -> str:
        return self.metadata.name
