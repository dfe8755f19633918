"""Token issue: `hvfleet token create` and `POST .../accesstokens` with a
token request. One request form (the API's body; the CLI's options mapped to
it) and one answer: the stored record and the bearer token, shown once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hvfleet.model.durations import parse_expiry
from hvfleet.model.token import AccessToken, Role
from hvfleet.ops.parsing import Query
from hvfleet.store.base import Store
from hvfleet.store.tokens import issue_token


class TokenQuery(Query):
    role: Role
    hypervisor: str | None = None
    name: str | None = None
    ttl: str = "30d"


@dataclass(frozen=True)
class TokenAnswer:
    record: AccessToken
    token: str

    def document(self) -> dict[str, Any]:
        """The record with the bearer token in status (the only time it is shown)."""
        doc = self.record.to_dict()
        doc["status"] = {"token": self.token}
        return doc

    def summary(self) -> str:
        spec = self.record.spec
        expires = spec.expires_at.isoformat() if spec.expires_at else "never"
        return (f"token {self.record.name}: role {spec.role}, subject {spec.subject}, "
                f"expires {expires}. It is shown only now.")


def issue(store: Store, query: TokenQuery, manager: str) -> TokenAnswer:
    """Create the token; only its hash is stored."""
    record, text = issue_token(store, query.role, manager=manager, now=datetime.now(UTC),
                               ttl=parse_expiry(query.ttl, field="ttl"), name=query.name,
                               hypervisor=query.hypervisor)
    return TokenAnswer(record, text)
