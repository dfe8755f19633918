"""Three API servers over one 3-member etcd are one service: a paged list may
go on at any replica, read at the revision of its first page (or 410 Expired
with a fresh token once that revision is compacted).

One etcd cluster and three replicas serve the whole module; each test keeps to
its own names.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvfleet.agent.runner import Agent, AgentConfig
from hvfleet.model.lease import Lease
from hvfleet.server.app import create_app
from hvfleet.store import Store, open_store
from hvfleet.store.etcd import EtcdStore
from hvfleet.store.remote import RemoteStore
from tests.server.conftest import TOKENS, Api
from tests.server.objects import HV, hypervisor, status_of
from tests.server.running import ServerThread
from tests.server.static_auth import AllowAll, StaticTokens
from tests.server.watching import Watcher
from tests.support.etcd_local import EtcdCluster
from tests.support.serve import HVFLEET, KUBECTL, role_tokens, start_server, stop_server

NODE = Path(__file__).resolve().parents[2] / "examples" / "fleet" / "compute-01.xml"


@pytest.fixture(scope="module")
def etcd3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    with EtcdCluster(tmp_path_factory.mktemp("etcd3"), size=3) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def replicas(etcd3: EtcdCluster) -> Iterator[list[Api]]:
    url = etcd3.url(prefix=f"/replicas-{uuid.uuid4().hex[:12]}")
    started: list[tuple[ServerThread, Store]] = []
    for _ in range(3):
        store = open_store(url)
        app = create_app(store, StaticTokens(TOKENS), AllowAll(), dashboard_pages=False)
        started.append((ServerThread(app).__enter__(), store))
    yield [Api(server.url, store, AllowAll(), server) for server, store in started]
    for server, store in reversed(started):
        server.__exit__(None, None, None)
        store.close()


def _names(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(o["metadata"]["name"], o["metadata"]["resourceVersion"]) for o in body["items"]]


# Writes between two pages: (what, which object).
_WRITE = st.tuples(st.sampled_from(["create", "patch", "delete"]), st.integers(0, 11))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 4), st.lists(st.lists(_WRITE, max_size=3), min_size=4, max_size=4))
def test_paging_across_replicas_ends_where_a_list_at_the_first_pages_revision_ends(
    replicas: list[Api], limit: int, writes: list[list[tuple[str, int]]]
) -> None:
    group = uuid.uuid4().hex[:8]
    a = replicas[0].client()
    for i in range(0, 12, 2):
        assert a.post(HV, json=_labelled(f"{group}-{i:02}", group)).status_code == 201
    params: dict[str, Any] = {"limit": limit, "labelSelector": f"group={group}"}
    first = a.get(HV, params=params).json()
    revision = int(first["metadata"]["resourceVersion"])
    seen = _names(first)
    token = first["metadata"].get("continue")
    page = 0
    while token:
        for what, i in writes[page % len(writes)]:
            _write(replicas[(page + i) % 3].client(), what, f"{group}-{i:02}", group)
        page += 1
        body = replicas[page % 3].client().get(HV, params={**params, "continue": token}).json()
        assert body["metadata"]["resourceVersion"] == str(revision)
        seen += _names(body)
        token = body["metadata"].get("continue")
    expected = replicas[0].store.list_at("Hypervisor", revision, f"group={group}")
    assert seen == [(o.metadata.name, o.metadata.resource_version) for o in expected.items]


def _labelled(name: str, group: str) -> dict[str, Any]:
    body = hypervisor(name)
    body["metadata"]["labels"]["group"] = group
    return body


def _write(client: Any, what: str, name: str, group: str) -> None:
    if what == "create":
        client.post(HV, json=_labelled(name, group))  # 409 when it exists: no change
    elif what == "patch":
        client.patch(f"{HV}/{name}", {"metadata": {"labels": {"touched": uuid.uuid4().hex[:6]}}})
    else:
        client.delete(f"{HV}/{name}")


def test_a_continue_token_past_compaction_is_410_with_a_token_that_goes_on(
    replicas: list[Api],
) -> None:
    """As kube-apiserver: the Status carries a token that lists the rest at the
    current revision (an inconsistent list, and says so)."""
    group = uuid.uuid4().hex[:8]
    a, b = replicas[0].client(), replicas[1].client()
    for i in range(5):
        a.post(HV, json=_labelled(f"{group}-{i}", group))
    params = {"limit": 2, "labelSelector": f"group={group}"}
    first = a.get(HV, params=params).json()
    a.post(HV, json=_labelled(f"{group}-9", group))
    a.delete(f"{HV}/{group}-3")
    store = replicas[0].store
    assert isinstance(store, EtcdStore)
    store.compact(store.revision())
    r = b.get(HV, params={**params, "continue": first["metadata"]["continue"]})
    assert r.status_code == 410, r.text
    status_of(410, "Expired", r.json())
    assert "too old to display a consistent list result" in r.json()["message"]
    rest: list[str] = []
    token = r.json()["metadata"]["continue"]
    while token:
        body = b.get(HV, params={**params, "continue": token}).json()
        rest += [name for name, _ in _names(body)]
        token = body["metadata"].get("continue")
    assert rest == [f"{group}-2", f"{group}-4", f"{group}-9"]


def test_a_page_after_many_other_lists_is_still_read_at_its_revision(
    replicas: list[Api],
) -> None:
    """The issuing replica's copy of the first read is gone after 16 other paged
    lists; the next page is read at the token's revision all the same."""
    group = uuid.uuid4().hex[:8]
    a = replicas[0].client()
    for i in range(4):
        a.post(HV, json=_labelled(f"{group}-{i}", group))
    params = {"limit": 2, "labelSelector": f"group={group}"}
    first = a.get(HV, params=params).json()
    a.patch(f"{HV}/{group}-3", {"spec": {"maintenance": "drain"}})
    for _ in range(17):
        a.get(HV, params=params)
    body = a.get(HV, params={**params, "continue": first["metadata"]["continue"]}).json()
    (late,) = [o for o in body["items"] if o["metadata"]["name"] == f"{group}-3"]
    assert late["spec"].get("maintenance") != "drain"
    assert body["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


def _replica(url: str) -> tuple[ServerThread, Store]:
    store = open_store(url)
    app = create_app(store, StaticTokens(TOKENS), AllowAll(), dashboard_pages=False)
    return ServerThread(app).__enter__(), store


@pytest.mark.timeout(120)
def test_an_agent_with_two_endpoints_keeps_its_host_ready_when_one_replica_dies(
    etcd3: EtcdCluster,
) -> None:
    url = etcd3.url(prefix=f"/failover-{uuid.uuid4().hex[:12]}")
    (a, a_store), (b, b_store) = _replica(url), _replica(url)
    remote = RemoteStore([a.url, b.url], "agent-hv1-token")
    try:
        # replica A, the one the agent talks to, goes away
        _agent_outlives(remote, b_store, lambda: a.__exit__(None, None, None))
    finally:
        b.__exit__(None, None, None)
        remote.close()
        a_store.close()
        b_store.close()


def _agent_outlives(agent_store: Store, direct: Store, kill: Callable[[], None]) -> None:
    """An agent of hv1 on `agent_store` (several replicas) takes its lease;
    `kill` takes the replica it talks to away; several TTLs later the host is
    still live: renewed through another replica, after the first died."""
    ttl = 3
    agent = Agent(AgentConfig(uri=f"test://{NODE}", name="hv1", lease_ttl=ttl, resync=5),
                  agent_store)
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()
    try:
        _wait(lambda: direct.agent_liveness() == {"hv1": True}, 30, "the agent never took its lease")
        kill()
        killed = datetime.now(UTC)
        time.sleep(ttl * 2.5)
        lease = direct.get("Lease", "hv1")
        assert isinstance(lease, Lease) and lease.spec.renew_time is not None
        assert lease.spec.renew_time.replace(tzinfo=UTC) > killed
        assert direct.agent_liveness() == {"hv1": True}
    finally:
        stop.set()
        runner.join(15)


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.slow  # three real `hvfleet serve` processes, kubectl and an agent: about 40 s
@pytest.mark.timeout(180)
def test_a_kubeconfig_made_against_one_replica_works_on_the_others(
    etcd3: EtcdCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Real `hvfleet serve` processes, each with its own data dir, over one etcd:
    they share one CA through the store, so the CA `hvfleet kubeconfig` embeds
    for replica A verifies B and C (kubectl, and the remote store). Then an
    agent given A and B keeps its host Ready when A is killed (SIGKILL)."""
    url = etcd3.url(prefix=f"/ca-{uuid.uuid4().hex[:12]}")
    tokens = role_tokens(url)
    servers = [start_server(tmp_path_factory.mktemp(f"replica{i}"), url, tokens) for i in range(3)]
    try:
        a = servers[0]
        config = tmp_path_factory.mktemp("kubeconfig") / "config"
        made = subprocess.run(
            [HVFLEET, "kubeconfig", "--server", a.url, "--token", tokens["viewer"], "-o", str(config)],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "HVFLEET_DATA_DIR": str(a.data_dir)})
        assert made.returncode == 0, made.stderr
        for other in servers[1:]:
            assert other.ca.read_bytes() == a.ca.read_bytes()
            got = subprocess.run([KUBECTL, "--kubeconfig", str(config), "--server", other.url,
                                  "get", "hypervisors", "-o", "name"],
                                 capture_output=True, text=True, timeout=120)
            assert got.returncode == 0, got.stderr
        # The remote store with every replica named, trusting A's CA only.
        ca_pem = a.ca.read_bytes()
        remote = RemoteStore([s.url for s in servers], tokens["viewer"], ca_pem)
        # An agent (its own token, hv1's) given A and B keeps its host live when
        # A is killed with SIGKILL: no goodbye, its connections just die.
        agent_store = RemoteStore([a.url, servers[1].url], tokens["agent"], ca_pem)
        direct = open_store(url)

        def kill_a() -> None:  # SIGKILL: no goodbye, its connections just die
            a.process.kill()
            a.process.wait(10)

        try:
            _agent_outlives(agent_store, direct, kill_a)
        finally:
            agent_store.close()
            direct.close()
        assert remote.list("Hypervisor").revision > 0
        remote.close()
    finally:
        for s in servers:
            stop_server(s)


def test_the_watch_limit_per_token_holds_per_replica(replicas: list[Api]) -> None:
    """The limit guards one process's memory and threads, so it is counted per
    replica (docs/scaling.md): a token at its 16 watches on A is refused there
    (429) and may still watch on B; fleet-wide it holds 16 × replicas."""
    rv = replicas[0].client("viewer-token").get(HV).json()["metadata"]["resourceVersion"]
    params = {"resourceVersion": rv, "timeoutSeconds": "30"}
    held = [Watcher(replicas[0], params, "viewer-token") for _ in range(16)]
    try:
        assert all(w.status == 200 for w in held)
        refused = Watcher(replicas[0], params, "viewer-token")
        assert refused.status == 429
        refused.close()
        other = Watcher(replicas[1], params, "viewer-token")
        assert other.status == 200
        other.close()
    finally:
        for w in held:
            w.close()
