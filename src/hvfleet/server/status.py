"""meta/v1 Status bodies: how every error (and a successful delete) is answered.

The HTTP code and the Status `reason` come from the error's CLASS, through
the server's one table (`hvfleet.server.errors`), never from its message.
Where Kubernetes clients print a fixed shape (`hypervisors.hvfleet.io "x" not
found`), the message is built from the request's resource and name, with the
core's message kept after it for the detail.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from hvfleet.model.errors import (
    AlreadyExists,
    BadRequest,
    Conflict,
    Gone,
    HvfleetError,
    InvalidInput,
    NotFound,
    TooLarge,
    UnsupportedMediaType,
)
from hvfleet.model.meta import API_GROUP
from hvfleet.scheduling.errors import DoesNotFit
from hvfleet.server.errors import http_status_of
from hvfleet.store.base import OwnershipConflict, StaleVersion
from hvfleet.store.undecodable import Undecodable

# The cause of a Status about a stored object that does not decode.
UNDECODABLE = "Undecodable"

# kube-apiserver's words (storage/etcd3) for a read at a compacted revision. The
# store's own message names the store (an etcd URL: endpoints, key prefix),
# which is for the server's log, not for any reader.
TOO_OLD = "The resourceVersion for the provided list is too old."


@dataclass(frozen=True)
class Target:
    """What a request was about, for Status details and kubectl-shaped messages."""

    plural: str = ""
    name: str = ""
    kind: str = ""

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{API_GROUP}" if self.plural else API_GROUP


@dataclass
class ApiError(Exception):
    """An error already shaped as a Status (for the few the core cannot know,
    e.g. an unknown URL)."""

    code: int
    reason: str
    message: str
    causes: list[dict[str, str]] = field(default_factory=list)
    retry_after: int | None = None  # details.retryAfterSeconds


def status(
    code: int,
    reason: str,
    message: str,
    target: Target | None = None,
    causes: list[dict[str, str]] | None = None,
    retry_after: int | None = None,
) -> dict[str, Any]:
    details: dict[str, Any] = {}
    if target is not None:
        if target.name:
            details["name"] = target.name
        details["group"] = API_GROUP
        # kube-apiserver names the resource ("hypervisors") in most details, and
        # the kind ("Hypervisor") in an Invalid one (errors.NewInvalid).
        if reason == "Invalid" and target.kind:
            details["kind"] = target.kind
        elif target.plural:
            details["kind"] = target.plural
    if causes:
        details["causes"] = causes
    if retry_after is not None:
        details["retryAfterSeconds"] = retry_after
    out: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        out["details"] = details
    return out


def success(target: Target, uid: str | None) -> dict[str, Any]:
    details: dict[str, Any] = {"name": target.name, "group": API_GROUP, "kind": target.plural}
    if uid:
        details["uid"] = uid
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": details}


def validation_causes(exc: ValidationError) -> list[dict[str, str]]:
    """One cause per pydantic error, with the field path as Kubernetes writes it."""
    causes = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"] if p != "[key]")
        unknown = err["type"] == "extra_forbidden"
        message = "unknown field" if unknown else err["msg"].removeprefix("Value error, ")
        causes.append({
            "reason": "FieldValueNotSupported" if unknown else "FieldValueInvalid",
            "message": message,
            "field": path,
        })
    return causes


def invalid_object(exc: ValidationError, target: Target, kind: str) -> ApiError:
    """422 Invalid with one cause per bad field (kube-apiserver's wording)."""
    causes = validation_causes(exc)
    text = "; ".join(f"{c['field']}: {c['message']}" if c["field"] else c["message"] for c in causes)
    return ApiError(422, "Invalid", f'{kind}.{API_GROUP} "{target.name}" is invalid: {text}', causes)


def unknown_fields(paths: list[str]) -> ApiError:
    """fieldValidation=Strict's answer, worded as kube-apiserver words it."""
    text = ", ".join(f'unknown field "{p}"' for p in paths)
    causes = [{"reason": "FieldValueNotSupported", "message": "unknown field", "field": p} for p in paths]
    return ApiError(400, "BadRequest", f"strict decoding error: {text}", causes)


def from_error(exc: Exception, target: Target) -> dict[str, Any]:
    """The Status for an exception raised while serving a request about `target`."""
    if isinstance(exc, ApiError):
        return status(exc.code, exc.reason, exc.message, target, exc.causes, exc.retry_after)
    if not isinstance(exc, HvfleetError):
        return status(500, "InternalError", f"internal error: {type(exc).__name__}", target)
    code, reason = http_status_of(exc)
    detail = str(exc)
    causes: list[dict[str, str]] = []
    q, name = target.qualified, target.name
    if isinstance(exc, NotFound) and name:
        message = f'{q} "{name}" not found'
    elif isinstance(exc, AlreadyExists) and name:
        message = f'{q} "{name}" already exists'
    elif isinstance(exc, OwnershipConflict):
        causes = [{"reason": "FieldManagerConflict", "message": f'conflict with "{owner}"',
                   "field": f".{path}"} for path, owner in exc.conflicts]
        n = len(causes)
        listed = "\n".join(f'- conflict with "{owner}": .{path}' for path, owner in exc.conflicts)
        message = f"Apply failed with {n} conflict{'s' if n != 1 else ''}: {detail}"
        if listed:
            message = f"Apply failed with {n} conflict{'s' if n != 1 else ''}:\n{listed}"
    elif isinstance(exc, DoesNotFit):
        causes = [{"reason": r.reason, "message": r.message, "field": f"spec.resources.{r.resource}"}
                  if r.resource is not None else {"reason": r.reason, "message": r.message}
                  for r in exc.rejections]
        message = f'{q} "{name}" does not fit: {detail}' if name else detail
    elif isinstance(exc, Gone):
        message = TOO_OLD
    elif isinstance(exc, Conflict) and name:
        message = f'Operation cannot be fulfilled on {q} "{name}": {detail}'
    elif isinstance(exc, InvalidInput) and not isinstance(exc, (TooLarge, UnsupportedMediaType,
                                                                  BadRequest)) and name:
        message = f'{target.kind or q} "{name}" is invalid: {detail}'
    else:
        message = detail
    if isinstance(exc, StaleVersion):
        # What tells a stale write from the other conflicts (a client retries only it).
        causes = [{"reason": "FieldValueInvalid", "message": detail,
                   "field": "metadata.resourceVersion"}]
    if isinstance(exc, Undecodable):
        # What the remote store reads back as Undecodable: the stored version and why.
        causes = [{"reason": UNDECODABLE, "message": f"{exc.revision}: {exc.reason}",
                   "field": "metadata.resourceVersion"}]
    if isinstance(exc, InvalidInput) and exc.field and not causes:
        # The core names the field it refused (hvfleet.model.errors): one cause.
        causes = [{"reason": "FieldValueInvalid", "message": exc.detail, "field": exc.field}]
    return status(code, reason, message, target, causes)
