"""Issue 20: real `hvfleet agent` processes writing through the real `hvfleet
serve` with their own agent tokens, over SQLite and over etcd, keep
status.effectiveCapacity equal to what every reader computes while policies
are created, changed and deleted, hosts are relabelled into and out of them,
and a host's own ratio overrides a policy's — each within the agent's event
latency (seconds, where the resync is a minute away). An agent that cannot
read its policies keeps its last effectiveCapacity and says SYNCED False, and
`get`, `capacity`, `fit` and the dashboard's feed show it."""

from __future__ import annotations

import json
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from hvfleet.model import Hypervisor, NotFound
from hvfleet.model.capacity import hypervisor_effective_capacity
from hvfleet.model.hypervisor import OvercommitPolicy
from hvfleet.model.meta import find_condition
from hvfleet.server.app import create_app
from hvfleet.server.auth import ROLE_GRANTS, RoleAuthorizer, TokenAuthenticator
from hvfleet.store import Store, open_store
from hvfleet.store.tokens import issue_token
from tests.server.running import ServerThread
from tests.server.tls_files import make_tls_files
from tests.support.etcd_local import EtcdCluster
from tests.support.serve import SETUP, Server, start_server, stop_server

from .conftest import GI, fleet_uri, hvfleet, start_agent, stop, wait_for

HOSTS = ("compute-01", "compute-02")  # 32 CPUs and 128Gi each
# Seconds a change may take to reach status.effectiveCapacity: event-driven
# (the agents' resync is 60 s), with room for a machine shared by many tests.
LATENCY = 5.0


@dataclass
class Fleet:
    server: Server
    store: Store
    agents: dict[str, subprocess.Popen[str]]
    latencies: list[float]

    def cli(self, role: str, *args: str) -> subprocess.CompletedProcess[str]:
        return hvfleet(*args, "--store", self.server.url, "--ca", str(self.server.ca),
                       "--token", self.server.tokens[role])


@pytest.fixture(params=["sqlite", "etcd"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "etcd":
        cluster: EtcdCluster = request.getfixturevalue("etcd_session")
        return cluster.url(prefix=f"/agentpol-{uuid.uuid4().hex[:12]}")
    return f"sqlite:///{tmp_path / 'hvfleet.db'}"


@pytest.fixture
def fleet(store_url: str, tmp_path: Path) -> Iterator[Fleet]:
    server = start_server(tmp_path, store_url, tokens={})
    agents: dict[str, subprocess.Popen[str]] = {}
    try:
        server.tokens.update(viewer=server.token("viewer"), scheduler=server.token("scheduler"))
        with open_store(store_url) as store:
            for host in HOSTS:
                token = server.token("agent", hypervisor=host, ttl=timedelta(hours=1))
                agents[host] = start_agent(
                    "--connect", fleet_uri(host), "--store", server.url, "--token", token,
                    "--ca", str(server.ca), "--resync", "60s")
            for host in HOSTS:
                wait_for(store, host, lambda h: bool(h.status.capacity), 30)
            yield (fleet := Fleet(server, store, agents, []))
            if fleet.latencies:  # shown with -s: what a change takes to reach status
                lat = sorted(fleet.latencies)
                print(f"\n{store_url.split(':')[0]}: change → status.effectiveCapacity over the API: "
                      f"median {lat[len(lat) // 2]:.3f} s, max {lat[-1]:.3f} s ({len(lat)} waits)")
    finally:
        errors = {}
        for host, agent in agents.items():
            rc, _, err = stop(agent, signal.SIGTERM)
            errors[host] = (rc, err)
        stop_server(server)
    for host, (rc, err) in errors.items():
        assert rc == 0, f"{host}: {err}"
        # Reading its policies never failed, and no ratio was guessed.
        assert "WARNING" not in err, f"{host}: {err}"


def relabel(store: Store, name: str, role: str) -> None:
    h = store.get_hypervisor(name)
    meta = h.metadata.model_copy(update={"labels": {**h.metadata.labels, "role": role}})
    store.update(h.model_copy(update={"metadata": meta}), SETUP)


def put_policy(store: Store, selector: dict[str, Any], overcommit: dict[str, float]) -> None:
    p = OvercommitPolicy.model_validate({"metadata": {"name": "compute"}, "spec": {
        "selector": selector, "overcommit": overcommit}})
    try:
        current = store.get("OvercommitPolicy", "compute")
    except NotFound:
        store.create(p, SETUP)
        return
    store.update(p.model_copy(update={"metadata": current.metadata}), SETUP)


def set_own_ratio(store: Store, name: str, cpu: float) -> None:
    h = store.get_hypervisor(name)
    store.update(h.model_copy(update={"spec": h.spec.model_copy(update={"overcommit": {"cpu": cpu}})}),
                 "ops")


def settle(fleet: Fleet, expected: dict[str, tuple[int, int]]) -> None:
    """Every host's status.effectiveCapacity reaches (cpu, memory GiB) within
    LATENCY, equals what readers compute from spec and the store's policies,
    and the agent says Synced True."""
    policies = fleet.store.list_overcommit_policies()
    for host, (cpu, mem) in expected.items():
        def there(h: Hypervisor, cpu: int = cpu, mem: int = mem) -> bool:
            e = h.status.effective_capacity
            return e.get("cpu") == cpu and e.get("memory") == mem * GI
        took, h = wait_for(fleet.store, host, there, LATENCY)
        fleet.latencies.append(took)
        assert h.status.effective_capacity == hypervisor_effective_capacity(h, policies)
        synced = find_condition(h.status.conditions, "Synced")
        assert synced is not None and synced.status == "True", synced


def readers(fleet: Fleet) -> dict[str, dict[str, Any]]:
    """`hvfleet capacity -o json` through the API, by host."""
    out = fleet.cli("viewer", "capacity", "-o", "json")
    assert out.returncode == 0, out.stderr
    return {h["name"]: h for h in json.loads(out.stdout)["hosts"]}


def test_effective_capacity_follows_policies_through_the_api(fleet: Fleet) -> None:
    store = fleet.store
    for host in HOSTS:
        relabel(store, host, "compute")
    settle(fleet, {"compute-01": (32, 128), "compute-02": (32, 128)})

    put_policy(store, {"matchLabels": {"role": "compute"}}, {"cpu": 3})  # created
    settle(fleet, {"compute-01": (96, 128), "compute-02": (96, 128)})

    put_policy(store, {"matchLabels": {"role": "compute"}}, {"cpu": 2, "memory": 1.5})  # changed
    settle(fleet, {"compute-01": (64, 192), "compute-02": (64, 192)})

    relabel(store, "compute-02", "edge")  # out of the policy
    settle(fleet, {"compute-01": (64, 192), "compute-02": (32, 128)})
    relabel(store, "compute-02", "compute")  # and back in
    settle(fleet, {"compute-01": (64, 192), "compute-02": (64, 192)})

    set_own_ratio(store, "compute-01", 4)  # the host's own ratio wins, for cpu only
    settle(fleet, {"compute-01": (128, 192), "compute-02": (64, 192)})
    seen = readers(fleet)
    assert {h: seen[h]["effective"] for h in HOSTS} == {
        "compute-01": {"cpu": "128", "memory": "192Gi"},
        "compute-02": {"cpu": "64", "memory": "192Gi"}}
    assert {h: seen[h]["synced"]["state"] for h in HOSTS} == {h: "True" for h in HOSTS}
    described = fleet.cli("viewer", "describe", "hypervisor", "compute-01")
    assert described.returncode == 0, described.stderr
    assert "cpu" in described.stdout and "OvercommitPolicy/compute" in described.stdout

    put_policy(store, {"matchLabels": {"role": "gpu"}}, {"cpu": 2, "memory": 1.5})  # selects none
    settle(fleet, {"compute-01": (128, 128), "compute-02": (32, 128)})
    put_policy(store, {"matchLabels": {"role": "compute"}}, {"memory": 1.25})  # selects both again
    settle(fleet, {"compute-01": (128, 160), "compute-02": (32, 160)})

    store.delete("OvercommitPolicy", "compute")  # deleted
    settle(fleet, {"compute-01": (128, 128), "compute-02": (32, 128)})
    seen = readers(fleet)
    assert {h: seen[h]["effective"] for h in HOSTS} == {
        "compute-01": {"cpu": "128", "memory": "128Gi"},
        "compute-02": {"cpu": "32", "memory": "128Gi"}}


# -- when the agent cannot read its policies ---------------------------------------------------

# A server whose role table is from before issue 20: agents may not read policies.
OLD_GRANTS = {**ROLE_GRANTS, "agent": tuple(g for g in ROLE_GRANTS["agent"]
                                            if g.resource != "overcommitpolicies")}


def test_an_agent_that_cannot_read_its_policies_keeps_the_last_effective_capacity(
    tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'hvfleet.db'}"
    with open_store(url) as store:
        put_policy(store, {"matchLabels": {"role": "compute"}}, {"cpu": 3})
        # First an agent that can resolve its ratios (on the store itself) ...
        once = hvfleet("agent", "--once", "--connect", fleet_uri("compute-01"), "--store", url)
        assert once.returncode == 0, once.stderr
        relabel(store, "compute-01", "compute")
        once = hvfleet("agent", "--once", "--connect", fleet_uri("compute-01"), "--store", url)
        assert once.returncode == 0, once.stderr
        assert store.get_hypervisor("compute-01").status.effective_capacity["cpu"] == 96

        # ... then one writing through a server that refuses it the policies.
        files = make_tls_files(tmp_path / "tls")
        app = create_app(store, TokenAuthenticator(store), RoleAuthorizer(OLD_GRANTS),
                         dashboard_pages=True)
        token, viewer = (
            issue_token(store, role, manager=SETUP, now=datetime.now(UTC), ttl=timedelta(hours=1),
                        hypervisor="compute-01" if role == "agent" else None)[1]
            for role in ("agent", "viewer"))
        with ServerThread(app, files) as srv:
            once = hvfleet("agent", "--once", "--connect", fleet_uri("compute-01"), "--store", srv.url,
                           "--token", token, "--ca", str(files.ca))
            assert once.returncode == 0, once.stderr
            # The dashboard's host page shows it too.
            browser = requests.Session()
            browser.trust_env = False
            browser.verify = str(files.ca)
            login = browser.post(srv.url + "/login", data={"token": viewer, "next": "/"},
                                 headers={"Origin": srv.url}, timeout=30)
            assert login.status_code == 200, login.text
            page = browser.get(srv.url + "/hosts/compute-01", timeout=30)
            assert page.status_code == 200, page.text
            assert "Synced: <strong>False</strong> — RatiosUnresolved" in page.text
        assert "cannot read the overcommit policies" in once.stderr
        h = store.get_hypervisor("compute-01")
        assert h.status.effective_capacity["cpu"] == 96  # kept, not 32 guessed
        synced = find_condition(h.status.conditions, "Synced")
        assert synced is not None and (synced.status, synced.reason) == ("False", "RatiosUnresolved")
        assert "forbidden" in synced.message

        # Every reader shows it.
        got = hvfleet("get", "hypervisors", "--store", url)
        header, row = got.stdout.splitlines()[0].split(), got.stdout.splitlines()[1].split()
        assert row[header.index("SYNCED")] == "False", got.stdout
        cap = json.loads(hvfleet("capacity", "-o", "json", "--store", url).stdout)["hosts"][0]
        assert cap["synced"]["state"] == "False" and "RatiosUnresolved" in cap["synced"]["message"]
        fit = hvfleet("fit", "--cpu", "1", "-o", "json", "--store", url)
        assert fit.returncode == 0, fit.stderr
        (candidate,) = json.loads(fit.stdout)["candidates"]
        assert candidate["synced"]["state"] == "False"
        table = hvfleet("fit", "--cpu", "1", "--store", url)
        assert "compute-01: SYNCED False: RatiosUnresolved" in table.stderr


def test_a_running_agent_resolves_its_ratios_again_once_it_may_read_them(tmp_path: Path) -> None:
    """Refused the policies, a long-running agent writes Synced False and no
    guess; once the server lets it read them it tries again on its own (the
    write backoff, at most 10 s) and writes the resolved effectiveCapacity."""
    url = f"sqlite:///{tmp_path / 'hvfleet.db'}"
    with open_store(url) as store:
        put_policy(store, {"matchLabels": {"role": "compute"}}, {"cpu": 3})
        store.create(Hypervisor.model_validate(
            {"metadata": {"name": "compute-01", "labels": {"role": "compute"}}}), SETUP)
        files = make_tls_files(tmp_path / "tls")
        authorizer = RoleAuthorizer(OLD_GRANTS)
        app = create_app(store, TokenAuthenticator(store), authorizer, dashboard_pages=False)
        token = issue_token(store, "agent", manager=SETUP, now=datetime.now(UTC),
                            ttl=timedelta(hours=1), hypervisor="compute-01")[1]
        with ServerThread(app, files) as srv:
            agent = start_agent("--connect", fleet_uri("compute-01"), "--store", srv.url,
                                "--token", token, "--ca", str(files.ca), "--resync", "60s")
            try:
                def unresolved(h: Hypervisor) -> bool:
                    c = find_condition(h.status.conditions, "Synced")
                    return c is not None and c.status == "False"
                _, h = wait_for(store, "compute-01", unresolved, 30)
                assert h.status.capacity["cpu"] == 32
                assert h.status.effective_capacity == {}  # never resolved: none, not a guess
                authorizer.grants = ROLE_GRANTS  # the server learns issue 20
                _, h = wait_for(store, "compute-01",
                                lambda h: h.status.effective_capacity.get("cpu") == 96, 15)
                synced = find_condition(h.status.conditions, "Synced")
                assert synced is not None and synced.status == "True"
            finally:
                rc, _, err = stop(agent, signal.SIGTERM)
        assert rc == 0, err
        assert err.count("cannot read the overcommit policies") == 1  # once, not per retry
