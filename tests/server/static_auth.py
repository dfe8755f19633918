"""A fixed token table and an allow-all authorizer, named as test stand-ins.

They implement the `Authenticator` / `Authorizer` protocols of
hvfleet.server.identity so the handler tests need no token store; the real
ones (hvfleet.server.auth) are tested on their own and against the app.
"""

from __future__ import annotations

from hvfleet.model.errors import Unauthorized
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
