"""What a list or a watch asks to read, checked as kube-apiserver checks its
ListOptions (apimachinery's ValidateListOptions), so a Kubernetes client gets
the same answers here as from a cluster: `resourceVersion`,
`resourceVersionMatch` and `sendInitialEvents` (the watch-list of client-go's
reflector and kubectl `wait`).

A refused combination is 422 Invalid naming the field, as kube words it
(a `continue` with a resourceVersion other than "0": 400, as kube); a
version past the newest the store has is 504 "Too large resource version"
(reason Timeout, cause ResourceVersionTooLarge, retry after 1 s), which is how
kube-apiserver tells a client that this server has not caught up yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hvfleet.model.errors import BadRequest
from hvfleet.server.status import ApiError

NOT_OLDER_THAN = "NotOlderThan"
EXACT = "Exact"
# The annotation on the BOOKMARK that ends a watch-list's initial events.
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


@dataclass(frozen=True)
class ReadOptions:
    """`resource_version` is "" (the newest, read consistently), "0" (any) or a
    revision; `send_initial_events` is None when the client did not say."""

    resource_version: str = ""
    match: str = ""
    send_initial_events: bool | None = None

    @property
    def revision(self) -> int | None:
        """The revision the client named, if it named one (not "" or "0")."""
        return int(self.resource_version) if self.resource_version not in ("", "0") else None

    def exact(self, limited: bool) -> int | None:
        """The revision a list is read exactly at, if any: with `Exact`, and, by
        kube's legacy rule, with no match but a `limit` (`limited`); else None
        (the current state)."""
        return self.revision if self.match == EXACT or (limited and not self.match) else None


def _bool(query: Mapping[str, str], name: str) -> bool | None:
    if name not in query:
        return None
    value = query[name].lower()
    if value not in ("true", "false", "1", "0"):
        shown = query[name][:40]
        raise BadRequest(f"{shown!r} is not a boolean", field=name)
    return value in ("true", "1")


def _invalid(causes: list[tuple[str, str, str]]) -> ApiError:
    """422 on ListOptions, one (field, reason, message) cause each, kube's wording."""
    text = ", ".join(f"{field}: {message}" for field, _, message in causes)
    body = [{"reason": reason, "message": message, "field": field} for field, reason, message in causes]
    if len(causes) > 1:
        text = f"[{text}]"
    return ApiError(422, "Invalid", f'ListOptions.meta.k8s.io "" is invalid: {text}', body)


def read_options(query: Mapping[str, str], *, watch: bool) -> ReadOptions:
    """The read a list (`watch=False`) or a watch asks for, or the Status that
    refuses it."""
    rv = query.get("resourceVersion", "")
    if rv and (not (rv.isascii() and rv.isdigit()) or len(rv) > 20):
        shown = rv if len(rv) <= 40 else f"{rv[:20]}... ({len(rv)} characters)"
        raise BadRequest(f"{shown!r} is not a resource version", field="resourceVersion")
    rv = str(int(rv)) if rv else ""  # "007" is 7, "00" is "0"
    match = query.get("resourceVersionMatch", "")
    send = _bool(query, "sendInitialEvents")
    bookmarks = _bool(query, "allowWatchBookmarks")
    errors: list[tuple[str, str, str]] = []
    forbidden = "FieldValueForbidden"
    if watch:
        if send is not None:
            if match != NOT_OLDER_THAN:
                errors.append(("resourceVersionMatch", forbidden, "Forbidden: sendInitialEvents "
                               f"requires setting resourceVersionMatch to {NOT_OLDER_THAN}"))
            if send and not bookmarks:
                errors.append(("allowWatchBookmarks", forbidden, "Forbidden: sendInitialEvents "
                               "requires setting allowWatchBookmarks to true"))
        if match:
            if send is None:
                errors.append(("resourceVersionMatch", forbidden, "Forbidden: resourceVersionMatch "
                               "is forbidden for watch unless sendInitialEvents is provided"))
            if match != NOT_OLDER_THAN:
                errors.append(("resourceVersionMatch", "FieldValueNotSupported",
                               f'Unsupported value: "{match}": supported values: "{NOT_OLDER_THAN}"'))
            if query.get("continue"):
                errors.append(("resourceVersionMatch", forbidden, "Forbidden: resourceVersionMatch "
                               "is forbidden when continue is provided"))
    else:
        if match:
            if not rv:
                errors.append(("resourceVersionMatch", forbidden, "Forbidden: resourceVersionMatch "
                               "is forbidden unless resourceVersion is provided"))
            if query.get("continue"):
                errors.append(("resourceVersionMatch", forbidden, "Forbidden: resourceVersionMatch "
                               "is forbidden when continue is provided"))
            if match not in (EXACT, NOT_OLDER_THAN):
                errors.append(("resourceVersionMatch", "FieldValueNotSupported",
                               f'Unsupported value: "{match}": supported values: '
                               f'"{EXACT}", "{NOT_OLDER_THAN}", ""'))
            if match == EXACT and rv == "0":
                errors.append(("resourceVersionMatch", forbidden, 'Forbidden: resourceVersionMatch '
                               '"exact" is forbidden for resourceVersion "0"'))
        if send is not None:
            errors.append(("sendInitialEvents", forbidden,
                           "Forbidden: sendInitialEvents is forbidden for list"))
    if errors:
        raise _invalid(errors)
    if not watch and query.get("continue") and rv not in ("", "0"):
        # A later page is read at its token's revision (kube's storage.ValidateListOptions).
        raise BadRequest("specifying resource version is not allowed when using continue",
                         field="resourceVersion")
    return ReadOptions(rv, match, send)


def too_large(requested: int, current: int) -> ApiError:
    """kube-apiserver's answer to a version this server has not reached."""
    return ApiError(504, "Timeout",
                    f"Timeout: Too large resource version: {requested}, current: {current}",
                    [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                    retry_after=1)


def check_not_newer(options: ReadOptions, current: int) -> None:
    """Refuse a version past the newest the store has (504, retry after 1 s)."""
    wanted = options.revision
    if wanted is not None and wanted > current:
        raise too_large(wanted, current)
