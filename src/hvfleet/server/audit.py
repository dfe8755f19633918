"""The audit log: one JSON line per write the API was asked to do.

Handlers call, once per write request (create, update, patch, delete, and the
action endpoints that write, such as release), after it was answered, allowed or
not::

    from hvfleet.server.audit import audit_write
    audit_write(who, action, rv_before, rv_after, code, reason)

`who` is the caller's Identity (None when authentication failed), `action` the
Action that was authorized, `rv_before`/`rv_after` the object's
resourceVersion before and after (None where there was none: before a create,
after a delete or a refused write), `code` the HTTP status sent and `reason`
the Status reason ("Created", "Forbidden", "Conflict", ...). The line goes to the
`logging` logger "hvfleet.audit"; `configure_audit_log` (called by `hvfleet
serve`) sends it to stderr or a file as JSON. The shape follows Kubernetes'
audit events (user, verb, objectRef) so the same tools can read it:

    {"ts": "2026-12-01T09:00:00.123Z", "user": {"subject": "agent/hv1",
     "role": "agent", "tokenId": "0123456789abcdef", "hypervisor": "hv1"},
     "verb": "patch", "objectRef": {"apiGroup": "hvfleet.io",
     "resource": "hypervisors", "subresource": "status", "name": "hv1"},
     "force": false, "resourceVersion": {"before": "41", "after": "42"},
     "code": 200, "reason": "OK"}

A dry run (`dryRun=All`: checked and answered, nothing written) adds
`"dryRun": true`.

Secrets never reach it: only the token's id is logged.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, ParamSpec

from hvfleet.model.meta import API_GROUP
from hvfleet.server.identity import Action, Identity

AUDIT_LOGGER = "hvfleet.audit"
_REASON_MAX = 1024

log = logging.getLogger(AUDIT_LOGGER)
P = ParamSpec("P")


def audit_event(
    who: Identity | None,
    action: Action,
    rv_before: str | None,
    rv_after: str | None,
    code: int,
    reason: str,
    *,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The audit record of one write, as a JSON-ready dict."""
    ts = (now or datetime.now(UTC)).astimezone(UTC)
    user: dict[str, Any] | None = None
    if who is not None:
        user = {"subject": who.subject, "role": who.role, "tokenId": who.token_id}
        if who.hypervisor:
            user["hypervisor"] = who.hypervisor
    ref: dict[str, Any] = {"apiGroup": API_GROUP, "resource": action.resource}
    if action.subresource:
        ref["subresource"] = action.subresource
    if action.name:
        ref["name"] = action.name
    event = {
        "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "user": user,
        "verb": action.verb,
        "objectRef": ref,
        "force": action.force,
        "resourceVersion": {"before": rv_before, "after": rv_after},
        "code": code,
        "reason": reason[:_REASON_MAX],
    }
    if action.dry_run:
        # Checked and answered, not written: "after" is what the write would keep.
        event["dryRun"] = True
    return event


def _logged(event_of: Callable[P, dict[str, Any]]) -> Callable[P, None]:
    """A function that logs the event `event_of` makes of its arguments, and
    makes none while the audit logger is off."""

    def write(*args: P.args, **kwargs: P.kwargs) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        event = event_of(*args, **kwargs)
        handler = _configured
        if handler is not None and log.handlers == [handler] and not log.filters and not handler.filters:
            # Only the handler configure_audit_log installed: the line it would
            # format, written as it would write it, without a LogRecord (the
            # logging machinery was about half of an audit line's CPU, on every write).
            try:
                with handler.lock or contextlib.nullcontext():
                    handler.stream.write(_dumps(event) + handler.terminator)
                    handler.stream.flush()
                return
            except Exception:  # logging's own path below reports it as it would
                pass
        log.info("%s", _JsonLine(event), extra={"audit": event})

    return write


# Log one write (see the module docstring): audit_event's record of it.
audit_write = _logged(audit_event)


def _dumps(event: dict[str, Any]) -> str:
    # One line whatever the content: json escapes newlines in names and reasons.
    return json.dumps(event, separators=(",", ":"), sort_keys=False, ensure_ascii=True)


class _JsonLine:
    """The record's message, serialised only if a handler asks for it (the
    JSON formatter writes the event itself: one encoding per write, not two)."""

    def __init__(self, event: dict[str, Any]) -> None:
        self.event = event

    def __str__(self) -> str:
        return _dumps(self.event)


class JsonFormatter(logging.Formatter):
    """An audit record as its JSON line; any other record as a small JSON object."""

    def format(self, record: logging.LogRecord) -> str:
        event = getattr(record, "audit", None)
        if isinstance(event, dict):
            return _dumps(event)
        ts = datetime.fromtimestamp(record.created, UTC)
        return _dumps({
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        })


def configure_audit_log(path: str | None = None) -> logging.Handler:
    """Send audit lines to `path` (appended, 0600) or to stderr, as JSON,
    and only there (not also to the root logger)."""
    handler: logging.Handler
    if path is None:
        handler = logging.StreamHandler(sys.stderr)
    else:
        # Owner-only: the log names every caller and object. An existing log
        # (perhaps made by an older version, 0644) is tightened too.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_mode & 0o077:
                os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
        handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.setFormatter(JsonFormatter())
    for old in list(log.handlers):
        log.removeHandler(old)
        old.close()
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    global _configured
    _configured = handler
    return handler


# The handler configure_audit_log installed last; audit_write writes to it
# directly while it is the audit logger's only one.
_configured: logging.StreamHandler[Any] | None = None


class JsonAuditLog:
    """The API app's AuditLog (hvfleet.server.context) over `audit_write`."""

    def record(self, who: Identity | None, action: Action, *, before: str | None,
               after: str | None, code: int, reason: str) -> None:
        if not reason:
            try:
                reason = HTTPStatus(code).phrase
            except ValueError:
                reason = str(code)
        audit_write(who, action, before, after, code, reason)
