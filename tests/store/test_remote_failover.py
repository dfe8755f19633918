"""The remote store with several replicas: a request goes to the next replica
when one cannot be reached, and one that may have been applied is sent again
only when that is safe (a GET, a PUT naming its resourceVersion; never a POST).

The replica that dies mid-request is a stand-in (a socket that reads the
request and closes without an answer, as a replica killed while working on it
does); the replica that answers is a real `hvfleet serve` app over SQLite.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.server.conftest import TOKENS
from tests.server.running import ServerThread
from tests.server.static_auth import AllowAll, StaticTokens
from tests.support.etcd_local import free_port

from hvfleet.model import Hypervisor, Unavailable
from hvfleet.model.errors import InvalidInput
from hvfleet.server.app import create_app
from hvfleet.store import open_store
from hvfleet.store.remote import RemoteStore, resendable, split_servers


class DyingReplica:
    """Stand-in for a replica killed while handling a request: accepts, reads
    the request head, closes. Counts the requests it swallowed."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.swallowed = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                if conn.recv(65536):
                    self.swallowed += 1

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, AllowAll]]:
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('failover')}/hvfleet.db")
    seen = AllowAll()
    app = create_app(store, StaticTokens(TOKENS), seen, dashboard_pages=False)
    with ServerThread(app) as server:
        yield server.url, seen
    store.close()


def test_a_request_goes_to_the_next_replica_when_one_is_down(replica: tuple[str, AllowAll]) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    remote = RemoteStore([down, replica[0]], "ops-token")
    made = remote.create(Hypervisor.model_validate({"metadata": {"name": "fo-1"}}), "ops")
    assert remote.get("Hypervisor", "fo-1").metadata.resource_version == made.metadata.resource_version
    remote.close()


def test_no_replica_reachable_names_every_one(replica: tuple[str, AllowAll]) -> None:
    ports = [free_port(), free_port()]
    remote = RemoteStore([f"http://127.0.0.1:{p}" for p in ports], "ops-token")
    with pytest.raises(Unavailable) as exc:
        remote.get("Hypervisor", "x")
    assert all(str(p) in str(exc.value) for p in ports)
    remote.close()


def test_a_post_that_may_have_been_applied_is_never_sent_again(
    replica: tuple[str, AllowAll],
) -> None:
    dying = DyingReplica()
    remote = RemoteStore([dying.url, replica[0]], "ops-token")
    asked = len(replica[1].asked)
    with pytest.raises(Unavailable):
        remote.create(Hypervisor.model_validate({"metadata": {"name": "fo-post"}}), "ops")
    assert dying.swallowed == 1 and len(replica[1].asked) == asked  # not sent to the other
    # A read lost the same way is read from the next replica.
    remote2 = RemoteStore([dying.url, replica[0]], "ops-token")
    assert remote2.list("Hypervisor").revision > 0
    assert dying.swallowed == 2
    # A CAS write by a client whose first read failed over goes on at that replica.
    made = remote2.create(Hypervisor.model_validate({"metadata": {"name": "fo-put"}}), "ops")
    remote3 = RemoteStore([dying.url, replica[0]], "ops-token")
    changed = made.model_copy(update={"spec": made.spec.model_copy(update={"maintenance": "drain"})})
    assert remote3.update(changed, "ops").spec.maintenance == "drain"
    for r in (remote, remote2, remote3):
        r.close()
    dying.close()


@given(st.sampled_from(["GET", "PUT", "DELETE", "POST", "PATCH"]),
       st.sampled_from([None, "", "12"]))
def test_only_reads_and_versioned_writes_are_resendable(method: str, rv: str | None) -> None:
    put = {"metadata": {} if rv is None else {"resourceVersion": rv}}
    delete = {"preconditions": {} if rv is None else {"resourceVersion": rv}}
    body = {"PUT": put, "DELETE": delete}.get(method, put)
    assert resendable(method, body) == (method == "GET" or (method in ("PUT", "DELETE") and bool(rv)))


def test_a_store_url_names_several_replicas() -> None:
    assert split_servers("https://a:8443,https://b:8443") == ["https://a:8443", "https://b:8443"]
    assert split_servers("https://a:8443, b:8443") == ["https://a:8443", "https://b:8443"]
    with pytest.raises(InvalidInput, match="empty server"):
        split_servers("https://a:8443,")
    with pytest.raises(InvalidInput, match="same scheme"):
        RemoteStore("https://a:8443,http://127.0.0.1:1", None)
    assert open_store("https://a:8443,https://b:8443").url == "https://a:8443,https://b:8443"


def test_credentials_come_from_a_kubeconfig_naming_any_of_the_replicas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.server.running import write_kubeconfig

    from hvfleet.store.remote import find_credentials

    monkeypatch.delenv("HVFLEET_TOKEN", raising=False)
    monkeypatch.delenv("HVFLEET_CA", raising=False)
    config = write_kubeconfig(tmp_path / "config", "https://b:8443", "hvf_x")
    monkeypatch.setenv("KUBECONFIG", str(config))
    assert find_credentials(["https://a:8443", "https://b:8443"]).token == "hvf_x"
    assert find_credentials(["https://a:8443", "https://c:8443"]).token is None
