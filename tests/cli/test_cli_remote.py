"""The CLI and the agent against a real `hvfleet serve` (`--store https://…`),
through the real `hvfleet` process, each with a token of its role.

The session's server (its store emptied for this module) over SQLite, with a
long-running agent for the libvirt test-driver host examples/fleet/compute-01.xml holding an agent token: it
creates its Hypervisor, writes status as agent/compute-01 and renews its
Lease, and a viewer's `hvfleet get` sees it Ready. Every command family then
runs with the role that may (and one that may not) do it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hvfleet.model import Forbidden, Hypervisor
from hvfleet.model.lease import Lease
from hvfleet.store.remote import RemoteStore
from tests.support.serve import HVFLEET, Server

REPO = Path(__file__).resolve().parents[2]
NODE = REPO / "examples" / "fleet" / "compute-01.xml"
OTHER = REPO / "examples" / "fleet" / "compute-02.xml"
# Instance UUIDs, as --consumer requires.
VM_X, VM_1, VM_2, VM_3 = (f"00000000-0000-4000-8000-{n:012x}" for n in (15, 1, 2, 3))
HOST = "compute-01"


@dataclass
class Fleet:
    server: Server
    agent: subprocess.Popen[str]
    agent_token: str
    home: Path

    def hvfleet(self, role: str, *args: str, token: str | None = None,
                stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """`hvfleet ARGS --store URL`, the token and CA as flags before the command."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("HVFLEET_TOKEN", "HVFLEET_CA", "KUBECONFIG", "HVFLEET_STORE")}
        env["HOME"] = str(self.home)  # no ~/.kube/config of the machine's
        cmd = [HVFLEET, *args, "--store", self.server.url,
               "--token", token or self.server.tokens[role], "--ca", str(self.server.ca)]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60,
                              input=stdin)

    def ok(self, role: str, *args: str, stdin: str | None = None) -> str:
        r = self.hvfleet(role, *args, stdin=stdin)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r.stdout



def _ready(out: str, name: str) -> str | None:
    for line in out.splitlines()[1:]:
        cells = line.split()
        if cells and cells[0] == name:
            return cells[1]
    return None


@pytest.fixture(scope="module")
def fleet(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("remote-cli")
    srv = server  # the session's (tests/conftest.py), its store emptied for this module
    agent_token = srv.token("agent", hypervisor=HOST)
    env = {k: v for k, v in os.environ.items() if k not in ("HVFLEET_TOKEN", "HVFLEET_CA")}
    env["HOME"] = str(tmp)
    agent = subprocess.Popen(
        [HVFLEET, "agent", "--connect", f"test://{NODE}", "--store", srv.url,
         "--token", agent_token, "--ca", str(srv.ca), "--lease-ttl", "3s", "--resync", "5s"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    fleet = Fleet(srv, agent, agent_token, tmp)
    try:
        deadline = time.monotonic() + 60
        while True:
            r = fleet.hvfleet("viewer", "get", "hypervisors")
            if r.returncode == 0 and _ready(r.stdout, HOST) == "Ready":
                break
            if agent.poll() is not None or time.monotonic() > deadline:
                agent.kill()
                raise AssertionError(f"the agent never showed Ready: {r.stdout} {r.stderr} "
                                     f"{agent.stderr.read() if agent.stderr else ''}")
            time.sleep(0.3)
        yield fleet
    finally:
        if agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(15)
            except subprocess.TimeoutExpired:
                agent.kill()


def _store(fleet: Fleet, token: str) -> RemoteStore:
    return RemoteStore(fleet.server.url, token, fleet.server.ca.read_bytes())


def test_the_agent_writes_its_status_as_itself_and_renews_its_lease(fleet: Fleet) -> None:
    with _store(fleet, fleet.server.tokens["viewer"]) as s:
        h = s.get_hypervisor(HOST)
        assert h.status.capacity["cpu"] == 32  # type: ignore[index]
        managers = {e.manager for e in h.metadata.managed_fields}
        assert managers == {f"agent/{HOST}"}
        first = s.get("Lease", HOST)
        assert isinstance(first, Lease) and first.spec.holder_identity == f"agent/{HOST}"
        deadline = time.monotonic() + 10
        while True:  # renewed every third of its 3 s
            again = s.get("Lease", HOST)
            assert isinstance(again, Lease)
            if again.spec.renew_time != first.spec.renew_time:
                break
            assert time.monotonic() < deadline, "the agent did not renew its Lease"
            time.sleep(0.2)
        assert s.agent_liveness() == {HOST: True}
    out = json.loads(fleet.ok("viewer", "get", "hypervisor", HOST, "-o", "json"))
    assert out["metadata"]["name"] == HOST
    leases = fleet.ok("viewer", "get", "leases")
    assert f"agent/{HOST}" in leases


def test_an_agent_token_cannot_write_another_host(fleet: Fleet) -> None:
    with _store(fleet, fleet.agent_token) as s:
        with pytest.raises(Forbidden):
            s.create(Hypervisor.model_validate({"metadata": {"name": "compute-02"}}), "agent/compute-02")
        with pytest.raises(Forbidden):
            s.keepalive("compute-02", 30)
        with pytest.raises(Forbidden):
            s.list_hypervisors()  # an agent sees its own host only
        assert s.get_hypervisor(HOST).name == HOST
        assert s.revision() > 0  # read through a list narrowed to its own name
    # The real agent for another host with this token: refused, and nothing written.
    r = subprocess.run(
        [HVFLEET, "agent", "--connect", f"test://{OTHER}", "--once", "--store", fleet.server.url,
         "--token", fleet.agent_token, "--ca", str(fleet.server.ca)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": str(fleet.home)})
    assert r.returncode != 0 and "forbidden" in r.stderr.lower(), (r.stdout, r.stderr)
    with _store(fleet, fleet.server.tokens["viewer"]) as s:
        assert [h.name for h in s.list_hypervisors()].count("compute-02") == 0


def test_get_describe_capacity_as_a_viewer(fleet: Fleet) -> None:
    assert _ready(fleet.ok("viewer", "get", "hypervisors"), HOST) == "Ready"
    described = fleet.ok("viewer", "describe", "hypervisor", HOST)
    assert HOST in described and "db-1" in described
    capacity = fleet.ok("viewer", "capacity")
    assert _ready(capacity, HOST) == "Ready"
    r = fleet.hvfleet("viewer", "get", "hypervisor", "nope")
    assert r.returncode == 1 and "not found" in r.stderr, r.stderr
    bad = fleet.hvfleet("viewer", "get", "hypervisors", token="hvf_nope_nope")
    assert bad.returncode == 4 and "token" in bad.stderr.lower(), bad.stderr


def test_apply_and_overcommit_set_as_an_operator_not_as_a_viewer(fleet: Fleet, tmp_path: Path) -> None:
    manifest = tmp_path / "fleet.yaml"
    manifest.write_text(
        "apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata: {name: rack-1, labels: {az: a}}\n"
        "---\napiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata: {name: rack-2, labels: {az: a}}\n")
    refused = fleet.hvfleet("viewer", "apply", "-f", str(manifest))
    assert refused.returncode == 4 and "forbidden" in refused.stderr.lower(), refused.stderr
    out = fleet.ok("operator", "apply", "-f", str(manifest))
    assert "hypervisor/rack-1 created" in out and "hypervisor/rack-2 created" in out
    assert "hypervisor/rack-1 unchanged" in fleet.ok("operator", "apply", "-f", str(manifest))
    listed = fleet.ok("viewer", "get", "hypervisors", "-l", "az=a")
    assert "rack-1" in listed and "rack-2" in listed and HOST not in listed
    refused = fleet.hvfleet("viewer", "overcommit", "set", HOST, "cpu=4")
    assert refused.returncode == 4 and "forbidden" in refused.stderr.lower(), refused.stderr
    out = fleet.ok("operator", "overcommit", "set", HOST, "cpu=4")
    assert f"hypervisor/{HOST} updated" in out
    with _store(fleet, fleet.server.tokens["viewer"]) as s:
        h = s.get_hypervisor(HOST)
        assert h.spec.overcommit == {"cpu": 4.0}
        # The field manager is the token's identity, whatever --manager said.
        owners = {e.manager for e in h.metadata.managed_fields}
        assert f"agent/{HOST}" in owners and len(owners) == 2


def test_fit_reserve_release_as_a_scheduler(fleet: Fleet) -> None:
    fits = fleet.ok("scheduler", "fit", "--cpu", "2", "--memory", "1Gi")
    assert HOST in fits
    refused = fleet.hvfleet("viewer", "reserve", HOST, "--cpu", "1", "--consumer", VM_X)
    assert refused.returncode == 4 and "forbidden" in refused.stderr.lower(), refused.stderr
    name = fleet.ok("scheduler", "reserve", HOST, "--cpu", "2", "--memory", "1Gi",
                    "--consumer", VM_1).strip()
    assert name.startswith("res-")
    # More than the host has: the server's claim check refuses, exit 3 as locally.
    too_big = fleet.hvfleet("scheduler", "reserve", HOST, "--cpu", "4096", "--consumer", VM_2)
    assert too_big.returncode == 3 and "does not fit" in too_big.stderr, too_big.stderr
    auto = fleet.ok("scheduler", "reserve", "--auto", "--cpu", "1", "--consumer", VM_3).strip()
    assert auto.startswith("res-")
    listed = fleet.ok("viewer", "get", "reservations")
    assert name in listed and auto in listed
    out = fleet.ok("scheduler", "release", name)
    assert out.split() == [name, "Released"]
    with _store(fleet, fleet.server.tokens["viewer"]) as s:
        r = s.get("Reservation", name)
        assert r.status.phase == "Released"  # type: ignore[union-attr]
        # Written as the scheduler token's identity.
        assert {e.manager for e in r.metadata.managed_fields} == {"scheduler"}


def test_the_kubeconfig_hvfleet_writes_is_all_a_command_needs(fleet: Fleet, tmp_path: Path) -> None:
    srv = fleet.server
    config = tmp_path / "viewer.kubeconfig"
    subprocess.run([HVFLEET, "kubeconfig", "--server", srv.url, "--token", srv.tokens["viewer"],
                    "--ca", str(srv.ca), "-o", str(config)],
                   check=True, capture_output=True, text=True, timeout=60)
    env = {k: v for k, v in os.environ.items() if k not in ("HVFLEET_TOKEN", "HVFLEET_CA", "KUBECONFIG")}
    env["HOME"] = str(fleet.home)
    got = subprocess.run([HVFLEET, "get", "hypervisors", "--store", srv.url, "--kubeconfig", str(config)],
                         env=env, capture_output=True, text=True, timeout=60)
    assert got.returncode == 0 and HOST in got.stdout, got.stderr
    # $KUBECONFIG gives the CA; $HVFLEET_TOKEN overrides its token (here: the operator's).
    env.update(KUBECONFIG=str(config), HVFLEET_TOKEN=srv.tokens["operator"])
    wrote = subprocess.run([HVFLEET, "overcommit", "set", "rack-1", "memory=1.5", "--store", srv.url],
                           env=env, capture_output=True, text=True, timeout=60)
    assert wrote.returncode == 0, wrote.stderr
    # No token anywhere: 401, in one line.
    env.pop("HVFLEET_TOKEN")
    config.write_text(config.read_text().replace(srv.tokens["viewer"], "hvf_0123456789abcdef_" + "x" * 43))
    denied = subprocess.run([HVFLEET, "get", "hypervisors", "--store", srv.url],
                            env=env, capture_output=True, text=True, timeout=60)
    assert denied.returncode == 4 and len(denied.stderr.strip().splitlines()) == 1, denied.stderr


def test_tokens_over_the_api_as_an_admin_only(fleet: Fleet) -> None:
    made = fleet.hvfleet("admin", "token", "create", "--role", "viewer", "--name", "remote-ro")
    assert made.returncode == 0, made.stderr
    new_token = made.stdout.strip()
    token_id = new_token.split("_")[1]
    listed = fleet.ok("admin", "token", "list")
    assert token_id in listed and "remote-ro" in listed
    # The new token works at once, and as a viewer only.
    assert HOST in fleet.hvfleet("viewer", "get", "hypervisors", token=new_token).stdout
    refused = fleet.hvfleet("viewer", "token", "list")
    assert refused.returncode == 4 and "forbidden" in refused.stderr.lower(), refused.stderr
    assert f"token {token_id} (remote-ro) revoked" in fleet.ok("admin", "token", "revoke", token_id)
    gone = fleet.hvfleet("viewer", "get", "hypervisors", token=new_token)
    assert gone.returncode == 4 and "revoked" in gone.stderr, gone.stderr


def test_a_stopped_agent_shows_not_ready_to_a_viewer(fleet: Fleet) -> None:
    # Last in this module: the agent stops and releases its Lease.
    fleet.agent.send_signal(signal.SIGTERM)
    fleet.agent.wait(15)
    assert fleet.agent.returncode == 0, fleet.agent.stderr.read() if fleet.agent.stderr else ""
    deadline = time.monotonic() + 10
    while _ready(fleet.ok("viewer", "get", "hypervisors"), HOST) != "NotReady":
        assert time.monotonic() < deadline, "a stopped agent still shows Ready"
        time.sleep(0.2)
    with _store(fleet, fleet.server.tokens["viewer"]) as s:
        assert s.agent_liveness(datetime.now(UTC)) == {HOST: False}
