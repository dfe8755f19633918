"""Access tokens on every backend: two handles on one store (two replicas) share
tokens and a revoke, and an all-kinds watch never carries a token record."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from tests.store.conftest import STORE_BACKENDS

from hvfleet.model import Hypervisor, ObjectMeta
from hvfleet.model.errors import Unauthorized
from hvfleet.server.auth import TokenAuthenticator
from hvfleet.store import Store, open_store
from hvfleet.store.tokens import issue_token, list_tokens, revoke_token


@pytest.fixture(params=["etcd", "sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Token records as each backend stores them. Over the API (remote), tokens
    live behind the admins' token endpoints, are never watched, and the
    fixture's own admin token is among them: tests/server covers that."""
    with STORE_BACKENDS[request.param](request, tmp_path) as url:
        yield url

def test_replicas_share_tokens_and_see_a_revoke_within_the_cache_age(store: Store, store_url: str) -> None:
    record, text = issue_token(store, "scheduler", manager="admin", now=datetime.now(UTC),
                               ttl=timedelta(days=30), name="nova")
    with open_store(store_url) as replica:
        auth = TokenAuthenticator(replica, max_age=0.5)
        assert auth.authenticate(f"Bearer {text}").subject == "nova"
        assert [t.name for t in list_tokens(replica)] == [record.name]
        revoke_token(store, record.name, "admin")
        started = time.monotonic()
        with pytest.raises(Unauthorized, match="revoked"):  # polled until seen
            while time.monotonic() - started < 0.5 + 1.5:
                auth.authenticate(f"Bearer {text}")
                time.sleep(0.05)


def test_an_all_kinds_watch_carries_no_token(store: Store) -> None:
    start = store.revision()
    issue_token(store, "viewer", manager="admin", now=datetime.now(UTC), ttl=None)
    store.create(Hypervisor(metadata=ObjectMeta(name="hv1")), "op")
    kinds = [e.object.kind for e in store.watch(None, since=start, timeout=0.5)]
    assert kinds == ["Hypervisor"]
    tokens = [e.object.kind for e in store.watch("AccessToken", since=start, timeout=0.5)]
    assert tokens == ["AccessToken"]


def test_a_followed_token_is_read_once_and_a_revoke_still_reaches_every_replica(
    store: Store, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the token watch (`hvfleet serve`), a replica reuses a token record
    for up to 30 s instead of reading it on each request; the watch drops it
    the moment another replica revokes it."""
    from hvfleet.server import auth as auth_module

    record, text = issue_token(store, "scheduler", manager="admin", now=datetime.now(UTC),
                               ttl=timedelta(days=30), name="nova-followed")
    reads: list[str] = []
    real_find = auth_module.find_token
    monkeypatch.setattr(auth_module, "find_token", lambda s, i: reads.append(i) or real_find(s, i))
    with open_store(store_url) as replica:
        auth = TokenAuthenticator(replica, max_age=0.0, follow=True)
        try:
            _wait_following(auth)
            for _ in range(20):
                assert auth.authenticate(f"Bearer {text}").subject == "nova-followed"
            assert len(reads) == 1
            revoke_token(store, record.name, "admin")
            started = time.monotonic()
            with pytest.raises(Unauthorized, match="revoked"):
                while time.monotonic() - started < 2.0:
                    auth.authenticate(f"Bearer {text}")
                    time.sleep(0.02)
        finally:
            auth.close()


def test_a_followed_token_record_that_stops_decoding_is_dropped_at_once(
    store: Store, store_url: str
) -> None:
    """A token record replaced by something this hvfleet cannot read (written
    around every check) is an unknown token on a replica that follows the
    token records, within the watch's delay: the watch's undecodable event
    drops the cached record, which would otherwise be reused for 30 s."""
    from tests.store.poison import poison

    record, text = issue_token(store, "viewer", manager="admin", now=datetime.now(UTC),
                               ttl=timedelta(days=30), name="spoiled-followed")
    with open_store(store_url) as replica:
        auth = TokenAuthenticator(replica, max_age=0.0, follow=True)
        try:
            _wait_following(auth)
            assert auth.authenticate(f"Bearer {text}").subject == "spoiled-followed"
            poison(store_url, "AccessToken", record.name, b'{"kind": "AccessToken", "spec": 1}')
            started = time.monotonic()
            with pytest.raises(Unauthorized):
                while time.monotonic() - started < 3.0:
                    auth.authenticate(f"Bearer {text}")
                    time.sleep(0.02)
        finally:
            auth.close()


def _wait_following(auth: TokenAuthenticator) -> None:
    """Until the authenticator's token watch is up."""
    deadline = time.monotonic() + 10
    while not auth._following:
        assert time.monotonic() < deadline, "the token watch never started"
        time.sleep(0.02)


def test_closing_the_authenticator_ends_its_token_watch_so_the_store_can_close_quietly(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`hvfleet serve` closes the authenticator before its store: the token
    watch has ended by then (on the shared feed, as a server's), so it never
    reads a closed store and logs its failure at every stop."""
    replica = open_store(store_url)
    replica.share_watches()
    auth = TokenAuthenticator(replica, max_age=0.0, follow=True)
    _wait_following(auth)
    follower = auth._follower
    assert follower is not None and follower.is_alive()
    with caplog.at_level("WARNING"):
        auth.close()
        assert not follower.is_alive()
        replica.close()
        time.sleep(1.2)  # past the watch's pause before it would read the store again
    assert not [r for r in caplog.records if "token watch failed" in r.getMessage()]
