"""Bearer tokens in the store: only a hash kept, unknown/expired/revoked → Unauthorized,
a revoke seen within the cache age, and tokens kept out of the fleet's public kinds."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hvfleet.model.errors import InvalidInput, Unauthorized
from hvfleet.model.token import AccessToken, split_token, token_text
from hvfleet.server.auth import TokenAuthenticator
from hvfleet.store.base import kind_of
from hvfleet.store.sqlite import SqliteStore
from hvfleet.store.tokens import issue_token, list_tokens, revoke_token
from tests.conftest import CliResult

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    with SqliteStore(str(tmp_path / "hvfleet.db")) as s:
        yield s


def bearer(text: str) -> str:
    return f"Bearer {text}"


def test_the_store_keeps_only_the_hash_of_a_256_bit_secret(store: SqliteStore, tmp_path: Path) -> None:
    record, text = issue_token(store, "viewer", manager="admin", now=NOW, ttl=timedelta(days=30))
    token_id, secret = split_token(text)
    assert token_id == record.name
    assert len(secret) == 43  # 32 random bytes, base64url
    assert record.spec.secret_sha256 == hashlib.sha256(secret.encode()).hexdigest()
    assert record.spec.expires_at == NOW + timedelta(days=30)
    store.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert secret.encode() not in raw
    assert record.spec.secret_sha256.encode() in raw


def test_a_valid_token_names_its_subject_role_and_hypervisor(store: SqliteStore) -> None:
    _, agent = issue_token(store, "agent", manager="admin", now=NOW, ttl=None, hypervisor="hv1")
    _, sched = issue_token(store, "scheduler", manager="admin", now=NOW, ttl=None, name="nova")
    auth = TokenAuthenticator(store)
    who = auth.authenticate(bearer(agent))
    assert (who.subject, who.role, who.hypervisor, who.manager) == ("agent/hv1", "agent", "hv1", "agent/hv1")
    who = auth.authenticate(f"bearer   {sched}")
    assert (who.subject, who.role, who.hypervisor) == ("nova", "scheduler", None)
    assert who.token_id == split_token(sched)[0]


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer", "Basic dXNlcjpwYXNz", "Bearer abc", "Bearer hvf_nothex_x",
     "Bearer hvf_0123456789abcdef_" + "A" * 43],
)
def test_missing_malformed_and_unknown_credentials_are_unauthorized(
    store: SqliteStore, header: str | None
) -> None:
    with pytest.raises(Unauthorized):
        TokenAuthenticator(store).authenticate(header)


def test_the_right_id_with_a_wrong_secret_is_unauthorized(store: SqliteStore) -> None:
    _, text = issue_token(store, "admin", manager="admin", now=NOW, ttl=None)
    token_id, secret = split_token(text)
    wrong = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    with pytest.raises(Unauthorized, match="unknown or wrong"):
        TokenAuthenticator(store).authenticate(bearer(token_text(token_id, wrong)))


def test_an_expired_token_is_unauthorized(store: SqliteStore) -> None:
    _, text = issue_token(store, "viewer", manager="admin", now=NOW, ttl=timedelta(hours=1))
    clock = [NOW + timedelta(minutes=59)]
    auth = TokenAuthenticator(store, clock=lambda: clock[0])
    assert auth.authenticate(bearer(text)).role == "viewer"
    clock[0] = NOW + timedelta(hours=1)
    with pytest.raises(Unauthorized, match="expired"):
        auth.authenticate(bearer(text))


def test_a_revoke_through_another_store_handle_takes_effect_within_the_cache_age(
    store: SqliteStore, tmp_path: Path
) -> None:
    record, text = issue_token(store, "operator", manager="admin", now=NOW, ttl=None)
    auth = TokenAuthenticator(store, max_age=0.3)
    assert auth.authenticate(bearer(text)).role == "operator"
    # Another replica (its own connection to the same store) revokes it.
    with SqliteStore(str(tmp_path / "hvfleet.db")) as other:
        revoked = revoke_token(other, record.name, "someone-else")
    assert revoked.spec.revoked
    started = time.monotonic()
    while True:
        try:
            auth.authenticate(bearer(text))
        except Unauthorized as exc:
            assert "revoked" in str(exc)
            break
        assert time.monotonic() - started < 0.3 + 0.5, "revoke not seen within the cache age"
        time.sleep(0.02)
    # Revoking by the bearer token itself works too, and keeps the record listed.
    assert revoke_token(store, text, "admin").spec.revoked
    assert [t.name for t in list_tokens(store)] == [record.name]


def test_a_deleted_token_is_unauthorized_after_the_cache_age(store: SqliteStore) -> None:
    record, text = issue_token(store, "viewer", manager="admin", now=NOW, ttl=None)
    auth = TokenAuthenticator(store, max_age=0.05)
    auth.authenticate(bearer(text))
    store.delete("AccessToken", record.name)
    time.sleep(0.06)
    with pytest.raises(Unauthorized):
        auth.authenticate(bearer(text))


def test_names_cannot_borrow_an_agent_or_another_role(store: SqliteStore) -> None:
    with pytest.raises(InvalidInput, match="agent/"):
        issue_token(store, "viewer", manager="admin", now=NOW, ttl=None, name="agent/hv1")
    with pytest.raises(InvalidInput, match="hypervisor"):
        issue_token(store, "agent", manager="admin", now=NOW, ttl=None)
    with pytest.raises(InvalidInput, match="hypervisor"):
        issue_token(store, "viewer", manager="admin", now=NOW, ttl=None, hypervisor="hv1")
    with pytest.raises(InvalidInput, match="agent/hv1"):
        issue_token(store, "agent", manager="admin", now=NOW, ttl=None, hypervisor="hv1", name="x")
    issue_token(store, "scheduler", manager="admin", now=NOW, ttl=None, name="nova")
    with pytest.raises(InvalidInput, match="one name speaks for one role"):
        issue_token(store, "operator", manager="admin", now=NOW, ttl=None, name="nova")
    # The same role may hold several tokens under one name (rotation).
    issue_token(store, "scheduler", manager="admin", now=NOW, ttl=None, name="nova")
    with pytest.raises(InvalidInput, match="ttl"):
        issue_token(store, "viewer", manager="admin", now=NOW, ttl=timedelta(0))


def test_tokens_stay_out_of_the_fleet_kinds(
    store: SqliteStore, tmp_path: Path, run: Callable[..., CliResult]
) -> None:
    record, _ = issue_token(store, "viewer", manager="admin", now=NOW, ttl=None)
    assert kind_of("accesstokens") == "AccessToken"
    assert isinstance(store.get("AccessToken", record.name), AccessToken)
    # An all-kinds watch (the fleet index, the dashboard feed) never carries them.
    assert [e.object.kind for e in store.watch(None, since=0, timeout=0.1)] == []
    assert [e.object.kind for e in store.watch("AccessToken", since=0, timeout=0.1)] == ["AccessToken"]
    url = f"sqlite:///{tmp_path / 'hvfleet.db'}"
    for args in (("export", "--kind", "accesstokens"), ("get", "accesstokens")):
        result = run(*args, "--store", url)
        assert result.code == 2, result
        assert "expected one of Hypervisor, Reservation" in result.err
    assert "AccessToken" not in run("crd").out


@given(st.text(max_size=120))
def test_any_text_is_a_token_or_unauthorized(text: str) -> None:
    try:
        token_id, secret = split_token(text)
    except Unauthorized as exc:
        assert text.strip() not in str(exc) or len(text.strip()) < 4
        return
    assert token_text(token_id, secret) == text.strip()


@given(st.binary(min_size=8, max_size=8), st.binary(min_size=32, max_size=32))
def test_every_issued_shape_parses_back(raw_id: bytes, raw_secret: bytes) -> None:
    import base64

    secret = base64.urlsafe_b64encode(raw_secret).decode().rstrip("=")
    assert split_token(token_text(raw_id.hex(), secret)) == (raw_id.hex(), secret)
