"""Access tokens on every backend: two handles on one store (two replicas) share
tokens and a revoke, and an all-kinds watch never carries a token record."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from hvfleet.model import Hypervisor, ObjectMeta
from hvfleet.model.errors import Unauthorized
from hvfleet.server.auth import TokenAuthenticator
from hvfleet.store import Store, open_store
from hvfleet.store.tokens import issue_token, list_tokens, revoke_token


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
