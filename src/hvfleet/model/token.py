"""The AccessToken resource: one bearer token of the fleet API, as stored.

A token is `hvf_<id>_<secret>`: `id` is the object's name (public, in logs and
`token list`), `secret` 256 random bits that are shown once and never stored;
the store keeps only their SHA-256. A 256-bit random secret needs no slow,
salted password hash: nobody can guess it, so the hash only has to be one-way.
Tokens live in the store (not in one server's files) so every `hvfleet serve`
replica over one etcd accepts, and stops accepting, the same tokens. The kind
is stored but not part of the fleet's public kinds (`KINDS`): it has no CRD, is
not exported, and is not in an all-kinds watch.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from datetime import datetime
from typing import Literal

from pydantic import Field, field_validator, model_validator

from hvfleet.model.bounds import Timestamp
from hvfleet.model.errors import InvalidInput, Unauthorized
from hvfleet.model.meta import Model, NoStatus, StoredObject, validate_name

Role = Literal["viewer", "operator", "scheduler", "agent", "admin"]
ROLES: tuple[Role, ...] = ("viewer", "operator", "scheduler", "agent", "admin")

TOKEN_PREFIX = "hvf_"
AGENT_SUBJECT_PREFIX = "agent/"
_ID_BYTES = 8  # 16 hex characters: unique enough to name, not a secret
_SECRET_BYTES = 32  # 256 bits
_SUBJECT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}$")
_SECRET_RE = re.compile(r"^[A-Za-z0-9_-]{43}$")
_ID_RE = re.compile(r"^[0-9a-f]{16}$")


class AccessTokenSpec(Model):
    # Who the token speaks for, and the field manager of its writes.
    subject: str
    role: Role
    hypervisor: str | None = None
    secret_sha256: str
    expires_at: Timestamp | None = None
    revoked: bool = False

    @field_validator("hypervisor")
    @classmethod
    def _hypervisor(cls, v: str | None) -> str | None:
        return None if v is None else validate_name(v, "spec.hypervisor")

    @field_validator("subject")
    @classmethod
    def _subject(cls, v: str) -> str:
        if not _SUBJECT_RE.match(v):
            raise ValueError(
                f"subject: {v!r} must be 1 to 128 letters, digits or ._:@/- "
                "starting with a letter or digit"
            )
        return v

    @field_validator("secret_sha256")
    @classmethod
    def _sha256(cls, v: str) -> str:
        if not re.fullmatch(r"[0-9a-f]{64}", v):
            raise ValueError("secretSha256: expected 64 lower-case hex digits")
        return v

    @model_validator(mode="after")
    def _binding(self) -> AccessTokenSpec:
        # An agent speaks for exactly one hypervisor, and only an agent may carry
        # an agent's manager name: otherwise a viewer named "agent/hv1" would
        # write as hv1's agent.
        if self.role == "agent":
            if not self.hypervisor:
                raise ValueError("hypervisor: an agent token is bound to one hypervisor")
            if self.subject != AGENT_SUBJECT_PREFIX + self.hypervisor:
                raise ValueError(f"subject: an agent token's subject is agent/{self.hypervisor}")
        else:
            if self.hypervisor:
                raise ValueError(f"hypervisor: only an agent token is bound to one (role {self.role})")
            if self.subject.startswith(AGENT_SUBJECT_PREFIX):
                raise ValueError("subject: names starting with agent/ are reserved for agent tokens")
        return self


class AccessToken(StoredObject):
    kind: Literal["AccessToken"] = "AccessToken"
    spec: AccessTokenSpec
    status: NoStatus = Field(default_factory=NoStatus)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> tuple[str, str]:
    """A fresh (id, secret) pair from the OS's CSPRNG."""
    return secrets.token_hex(_ID_BYTES), secrets.token_urlsafe(_SECRET_BYTES)


def token_text(token_id: str, secret: str) -> str:
    return f"{TOKEN_PREFIX}{token_id}_{secret}"


def split_token(text: str) -> tuple[str, str]:
    """(id, secret) of a bearer token; Unauthorized when it is not one of ours.
    The message never repeats the text: it may be someone's real secret."""
    body = text.strip()
    if not body.startswith(TOKEN_PREFIX):
        raise Unauthorized("token: not an hvfleet token (expected hvf_...)")
    token_id, sep, secret = body.removeprefix(TOKEN_PREFIX).partition("_")
    if not sep or not _ID_RE.match(token_id) or not _SECRET_RE.match(secret):
        raise Unauthorized("token: malformed hvfleet token")
    return token_id, secret


def check_token(token: AccessToken, secret: str, now: datetime) -> None:
    """Unauthorized unless `secret` is this token's and the token is in force."""
    # compare_digest: the time taken must not tell how many leading characters match.
    if not hmac.compare_digest(hash_secret(secret), token.spec.secret_sha256):
        raise Unauthorized("token: unknown or wrong token")
    if token.spec.revoked:
        raise Unauthorized(f"token {token.name}: revoked")
    if token.spec.expires_at is not None and now >= token.spec.expires_at:
        raise Unauthorized(f"token {token.name}: expired at {token.spec.expires_at.isoformat()}")


def subject_for(role: Role, name: str | None, hypervisor: str | None) -> str:
    """The subject (and field manager) of a new token: agent/<hypervisor> for an
    agent, else the given name, else the role's name."""
    if role == "agent":
        if not hypervisor:
            raise InvalidInput("an agent token is bound to one hypervisor", field="hypervisor")
        subject = AGENT_SUBJECT_PREFIX + hypervisor
        if name and name != subject:
            raise InvalidInput(f"an agent token's name is always {subject}", field="name")
        return subject
    return name or role


def role_conflict(token: AccessToken, others: Iterable[AccessToken]) -> AccessToken | None:
    """Another token, not revoked, whose subject is `token`'s with another role.
    One subject speaks for one role: its name is the field manager of its
    writes, and a manager's fields must not be writable by a token of another
    role that happens to carry the same name. None when `token` is revoked."""
    if token.spec.revoked:
        return None
    for other in others:
        if (
            other.name != token.name
            and other.spec.subject == token.spec.subject
            and other.spec.role != token.spec.role
            and not other.spec.revoked
        ):
            return other
    return None


# Who a token speaks for, and as what, never changes: a new role or subject is
# a new token (and the old one revoked).
_IDENTITY_FIELDS = {"subject": "spec.subject", "role": "spec.role", "hypervisor": "spec.hypervisor"}


def check_token_update(old: AccessToken, new: AccessToken) -> None:
    """InvalidInput, naming the field, for an update that would change who a
    token speaks for or bring a revoked token back. Together with the check on
    create (`role_conflict`), no update can give a subject a second role."""
    for attr, where in _IDENTITY_FIELDS.items():
        if getattr(old.spec, attr) != getattr(new.spec, attr):
            raise InvalidInput(
                f"token {old.name}: who a token speaks for does not change; issue a new token",
                field=where,
            )
    if old.spec.revoked and not new.spec.revoked:
        raise InvalidInput(f"token {old.name}: a revoked token stays revoked; issue a new one",
                           field="spec.revoked")


TokenState = Literal["active", "expired", "revoked"]


def token_state(token: AccessToken, now: datetime) -> TokenState:
    if token.spec.revoked:
        return "revoked"
    if token.spec.expires_at is not None and now >= token.spec.expires_at:
        return "expired"
    return "active"
