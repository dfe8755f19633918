"""A real Placement client against hvfleet's /placement: python-openstackclient
with osc-placement, configured with the endpoint, an hvfleet token (keystoneauth's
`admin_token` plugin, which sends `X-Auth-Token`) and hvfleet's CA, driving
providers, inventories, traits, aggregates, candidates and allocations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from hvfleet.server.app import create_app
from hvfleet.server.auth import RoleAuthorizer, TokenAuthenticator
from hvfleet.store import open_store
from hvfleet.store.tokens import issue_token
from tests.server.running import ServerThread
from tests.server.tls_files import make_tls_files

OPENSTACK = Path(sys.executable).parent / "openstack"


@pytest.fixture(scope="module")
def openstack() -> Iterator[Callable[..., Any]]:
    d = Path(tempfile.mkdtemp())
    store = open_store(f"sqlite:///{d}/hvfleet.db")
    _, token = issue_token(store, "admin", manager="test", now=datetime.now(UTC), ttl=None, name="osc")
    app = create_app(store, TokenAuthenticator(store), RoleAuthorizer(), dashboard_pages=False)
    files = make_tls_files(d / "tls")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OS_")}
    with ServerThread(app, files) as server:
        base = [str(OPENSTACK), "--os-auth-type", "admin_token", "--os-endpoint",
                f"{server.url}/placement", "--os-token", token, "--os-cacert", str(files.ca),
                "--os-placement-api-version", "1.39"]

        def run(*args: str, as_json: bool = True) -> Any:
            fmt = ["-f", "json"] if as_json else []
            r = subprocess.run([*base, *args, *fmt], capture_output=True, text=True, env=env,
                               timeout=120)
            assert r.returncode == 0, r.stderr
            return json.loads(r.stdout) if r.stdout.strip() else None

        yield run
    store.close()


@pytest.mark.slow
def test_openstack_client_drives_providers_inventories_traits_aggregates_and_allocations(
        openstack: Callable[..., Any]) -> None:
    rp = openstack("resource", "provider", "create", "compute-1")
    uid = rp["uuid"]
    assert (rp["name"], rp["generation"], rp["root_provider_uuid"]) == ("compute-1", 0, uid)
    inv = openstack("resource", "provider", "inventory", "set", uid, "--resource", "VCPU=8",
                    "--resource", "VCPU:allocation_ratio=2.0", "--resource", "MEMORY_MB=4096")
    assert {i["resource_class"]: (i["total"], i["allocation_ratio"]) for i in inv} == {
        "VCPU": (8, 2.0), "MEMORY_MB": (4096, 1.0)}
    openstack("trait", "create", "CUSTOM_FAST", as_json=False)
    traits = openstack("resource", "provider", "trait", "set", uid, "--trait", "CUSTOM_FAST",
                       "--trait", "HW_CPU_X86_AVX2")
    assert sorted(t["name"] for t in traits) == ["CUSTOM_FAST", "HW_CPU_X86_AVX2"]
    agg = str(uuid.uuid4())
    generation = openstack("resource", "provider", "show", uid)["generation"]
    aggs = openstack("resource", "provider", "aggregate", "set", uid, "--aggregate", agg,
                     "--generation", str(generation))
    assert [a["uuid"] for a in aggs] == [agg]
    found = openstack("allocation", "candidate", "list", "--resource", "VCPU=10",
                      "--required", "CUSTOM_FAST", "--member-of", agg)
    assert [c["resource provider"] for c in found] == [uid]
    assert openstack("allocation", "candidate", "list", "--resource", "VCPU=17") == []
    consumer = str(uuid.uuid4())
    alloc = openstack("resource", "provider", "allocation", "set", consumer, "--allocation",
                      f"rp={uid},VCPU=10,MEMORY_MB=1024", "--project-id", str(uuid.uuid4()),
                      "--user-id", str(uuid.uuid4()), "--consumer-type", "INSTANCE")
    assert [(a["resource_provider"], a["resources"]) for a in alloc] == [
        (uid, {"VCPU": 10, "MEMORY_MB": 1024})]
    usage = openstack("resource", "provider", "usage", "show", uid)
    assert {u["resource_class"]: u["usage"] for u in usage} == {"VCPU": 10, "MEMORY_MB": 1024}
    # Full now for another 7 VCPUs: 16 is the capacity, 10 are taken.
    assert openstack("allocation", "candidate", "list", "--resource", "VCPU=7") == []
    openstack("resource", "provider", "allocation", "delete", consumer, as_json=False)
    usage = openstack("resource", "provider", "usage", "show", uid)
    assert {u["resource_class"]: u["usage"] for u in usage} == {"VCPU": 0, "MEMORY_MB": 0}
