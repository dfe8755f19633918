"""A fixed token table and an allow-all authorizer, named as test stand-ins.

They implement the `Authenticator` / `Authorizer` protocols of
hvfleet.server.identity so the handler tests need no token store; the real
ones (hvfleet.server.auth) are tested on their own and against the app.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvfleet.model.errors import Forbidden, Unauthorized
from hvfleet.model.hypervisor import Resource
from hvfleet.server.identity import Action, Identity


class StaticTokens:
    """Bearer token → Identity, from a dict given by the test."""

    def __init__(self, tokens: dict[str, Identity]) -> None:
        self.tokens = tokens

    def authenticate(self, authorization: str | None) -> Identity:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or token not in self.tokens:
            raise Unauthorized("Unauthorized")
        return self.tokens[token]


class AllowAll:
    """Every authenticated caller may do everything (the store's own ownership
    rules still apply). Records what it was asked, for tests that check it."""

    def __init__(self) -> None:
        self.asked: list[tuple[Identity, Action, Resource | None, Resource | None]] = []

    def authorize(
        self, who: Identity, action: Action, current: Resource | None, new: Resource | None
    ) -> None:
        self.asked.append((who, action, current, new))


class ReadOnly(AllowAll):
    """Allows reads only; every write is Forbidden (a viewer, in miniature)."""

    def authorize(
        self, who: Identity, action: Action, current: Resource | None, new: Resource | None
    ) -> None:
        super().authorize(who, action, current, new)
        if action.verb not in ("get", "list", "watch"):
            raise Forbidden(f'{action.resource}.hvfleet.io "{action.name}" is forbidden: '
                            f'User "{who.subject}" cannot {action.verb}')


@dataclass
class AuditRecord:
    who: Identity | None
    action: Action
    before: str | None
    after: str | None
    code: int
    reason: str


class RecordingAudit:
    """An AuditLog (hvfleet.server.context) that keeps its records in a list."""

    def __init__(self) -> None:
        self.records: list[AuditRecord] = []

    def record(self, who: Identity | None, action: Action, *, before: str | None,
               after: str | None, code: int, reason: str) -> None:
        self.records.append(AuditRecord(who, action, before, after, code, reason))
