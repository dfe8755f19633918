"""Access tokens kept in the store: issue, list, find and revoke.

Both edges use these: `hvfleet token …` on the store directly (how the first
admin token is made) and the API's admin endpoints. The token itself is
returned once, by `issue_token`; the store keeps only its hash
(hvfleet.model.token). Revoking keeps the record, flagged, so `token list`
still shows who had access; every replica's authenticator sees the flag on
its next lookup.
"""

from __future__ import annotations

from contextlib import suppress
from datetime import datetime, timedelta

from pydantic import ValidationError

from hvfleet.model.errors import InvalidInput, NotFound
from hvfleet.model.kinds import hypervisor_name_error
from hvfleet.model.meta import ObjectMeta, validation_message
from hvfleet.model.token import (
    TOKEN_PREFIX,
    AccessToken,
    AccessTokenSpec,
    Role,
    hash_secret,
    new_secret,
    role_conflict,
    split_token,
    subject_for,
    token_text,
)
from hvfleet.store.base import Store
from hvfleet.store.undecodable import Undecodable, skipped

KIND = "AccessToken"
ROLE_LABEL = "hvfleet.io/role"


def list_tokens(store: Store) -> list[AccessToken]:
    return store.list_as(AccessToken)


def find_token(store: Store, token_id: str) -> AccessToken | None:
    try:
        return store.get_as(AccessToken, token_id)
    except NotFound:
        return None
    except Undecodable as exc:
        # A record that cannot be read proves nothing: as an unknown token (401).
        skipped(exc, "token lookup")
        return None


def issue_token(
    store: Store,
    role: Role,
    *,
    manager: str,
    now: datetime,
    ttl: timedelta | None,
    name: str | None = None,
    hypervisor: str | None = None,
) -> tuple[AccessToken, str]:
    """Create a token; returns its record and the bearer token, which exists
    nowhere else afterwards."""
    if hypervisor is not None:
        why = hypervisor_name_error(hypervisor)
        if why is not None:
            raise InvalidInput(why, field="hypervisor")
    if ttl is not None and ttl <= timedelta(0):
        raise InvalidInput("must be positive (or 0/never for no expiry)", field="ttl")
    subject = subject_for(role, name, hypervisor)
    token_id, secret = new_secret()
    try:
        token = AccessToken(
            metadata=ObjectMeta(name=token_id, labels={ROLE_LABEL: role}),
            spec=AccessTokenSpec(
                subject=subject,
                role=role,
                hypervisor=hypervisor,
                secret_sha256=hash_secret(secret),
                expires_at=None if ttl is None else (now + ttl).replace(microsecond=0),
            ),
        )
    except ValidationError as exc:
        raise InvalidInput(validation_message(exc, "token")) from None
    return create_token(store, token, manager, field="name"), token_text(token_id, secret)


def _one_role(store: Store, token: AccessToken, field: str) -> None:
    other = role_conflict(token, list_tokens(store))
    if other is not None:
        raise InvalidInput(
            f"{token.spec.subject!r} is already the subject of {other.spec.role} token "
            f"{other.name}; one name speaks for one role",
            field=field,
        )


def create_token(
    store: Store, token: AccessToken, manager: str, *, field: str = "spec.subject"
) -> AccessToken:
    """Store a token record (issued here, or hashed by a client and posted), if
    its subject speaks for no other role (`role_conflict`; InvalidInput naming
    `field` otherwise). Every path that creates a token comes here.

    The store has no uniqueness across records, so the rule is checked again
    once the record is in: of two creates racing to give one subject two roles,
    each sees the other and removes itself, or the later one does; never do
    both stay."""
    _one_role(store, token, field)
    created = store.create(token, manager)
    assert isinstance(created, AccessToken)
    try:
        _one_role(store, created, field)
    except InvalidInput:
        with suppress(NotFound):
            store.delete(KIND, created.name)
        raise
    return created


def token_id_of(text: str) -> str:
    """A token's id from its id or from the whole bearer token."""
    text = text.strip()
    return split_token(text)[0] if text.startswith(TOKEN_PREFIX) else text


def revoke_token(store: Store, token: str, manager: str) -> AccessToken:
    """Flag a token revoked (by id or bearer token). Any admin may revoke any
    token, so this takes the field over from whoever issued it."""
    token_id = token_id_of(token)

    def mutate(obj: AccessToken) -> AccessToken:
        return obj.model_copy(update={"spec": obj.spec.model_copy(update={"revoked": True})})

    try:
        return store.update_as(AccessToken, token_id, mutate, manager, force=True)
    except NotFound:
        raise NotFound(f"token {token_id!r} not found") from None
