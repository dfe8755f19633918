"""A real fleet for the dashboard tests and benchmark: `hvfleet serve` (TLS, its
own CA) over a SQLite store, hosts reported by `hvfleet agent --once` on the
libvirt test driver (examples/fleet/), real tokens per role, and the system
Chromium driven by Playwright."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from hvfleet.model import Hypervisor
from hvfleet.model.token import Role
from hvfleet.store import open_store
from hvfleet.store.base import Write
from hvfleet.store.ownership import agent_manager
from hvfleet.store.tokens import issue_token
from tests.support.serve import launch, stop

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "examples" / "fleet"
HVFLEET = str(Path(sys.executable).parent / "hvfleet")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
# Labels the tests group and filter by (az, role), set by a setup manager.
LABELS = {
    "bigmem-01": {"az": "az1", "role": "bigmem"},
    "compute-01": {"az": "az1", "role": "compute"},
    "compute-02": {"az": "az1", "role": "compute"},
    "compute-03": {"az": "az2", "role": "compute"},
    "edge-01": {"az": "az2", "role": "edge"},
    "gpu-01": {"az": "az2", "role": "gpu"},
    "lab-01": {"az": "az3", "role": "lab"},
}


SYNTHETIC_ROLES = ("compute", "compute", "compute", "gpu", "bigmem", "edge")


def seed_synthetic(store_url: str, n: int, seed_: int = 1) -> None:
    """`n` synthetic hosts `hv-00000`…, labelled az=az1..3 and a role: status
    written as each host's agent (a status in anyone else's create is
    ignored), then spec (ratios, reserve) by an operator, in atomic batches."""
    rng = random.Random(seed_)
    now = datetime.now(UTC).isoformat()
    specs = []
    with open_store(store_url) as s:
        for i in range(n):
            cpus = rng.choice([32, 48, 64, 96, 128])
            mem = rng.choice([128, 256, 384, 512, 1024])
            name = f"hv-{i:05d}"
            hv = Hypervisor.model_validate({
                "metadata": {"name": name, "labels": {
                    "az": f"az{i % 3 + 1}", "role": SYNTHETIC_ROLES[i % len(SYNTHETIC_ROLES)]}},
                "status": {
                    "capacity": {"cpu": cpus, "memory": f"{mem}Gi"},
                    "allocation": {"cpu": rng.randint(0, cpus * 2), "memory": f"{rng.randint(0, mem - 8)}Gi"},
                    "conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled"}],
                    "lastHeartbeatTime": now,
                },
            })
            specs.append({"overcommit": {"cpu": rng.choice([1.0, 2.0, 4.0])}, "reserved": {"cpu": 2}})
            s.create(hv, agent_manager(name))
        hosts = s.list_hypervisors()
        for at in range(0, len(hosts), 500):
            batch = []
            for h in hosts[at:at + 500]:
                spec = h.spec.model_validate(specs[int(h.name.removeprefix("hv-"))])
                batch.append(Write("update", h.model_copy(update={"spec": spec})))
            s.write_all(batch, "bench-operator")


def wait_dashboard_loaded(fleet: Fleet, token: str, timeout: float = 300.0) -> None:
    """Until the dashboard has read the fleet (its first load of a big fleet
    runs in the background after start-up)."""
    s = fleet.http()
    s.cookies.set("hvfleet_session", token)
    deadline = time.monotonic() + timeout
    while s.get(fleet.url + "/dashboard/overview.json?perPage=1", timeout=120).status_code != 200:
        if time.monotonic() > deadline:
            raise AssertionError("the dashboard did not load the fleet")
        time.sleep(1)


def hvfleet(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([HVFLEET, *args], capture_output=True, text=True, timeout=120)
    if check and out.returncode != 0:
        raise AssertionError(f"hvfleet {' '.join(args)}: {out.returncode}\n{out.stdout}\n{out.stderr}")
    return out


def agent_once(store_url: str, node_xml: Path, name: str) -> None:
    hvfleet("agent", "--connect", f"test://{node_xml}", "--name", name, "--store", store_url, "--once")


@dataclass
class Fleet:
    url: str
    store_url: str
    tmp: Path
    tokens: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[str] | None = None

    def token(self, role: Role, name: str) -> str:
        with open_store(self.store_url) as s:
            _, text = issue_token(s, role, manager="test-setup", now=datetime.now(UTC),
                                  ttl=timedelta(hours=2), name=name)
        self.tokens[name] = text
        return text

    def http(self, token: str | None = None) -> requests.Session:
        s = requests.Session()
        s.trust_env = False
        s.verify = False
        if token:
            s.headers["Authorization"] = f"Bearer {token}"
        return s


def report_fleet(store_url: str) -> None:
    # The agents run at once (each writes only its own host): the fixture waits
    # for the slowest start-up, not the sum of seven (~0.9 s of CPU each).
    agents = {f.stem: subprocess.Popen(
        [HVFLEET, "agent", "--connect", f"test://{f}", "--name", f.stem, "--store", store_url, "--once"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for f in sorted(FLEET.glob("*.xml"))}
    for name, agent in agents.items():
        out, err = agent.communicate(timeout=120)
        if agent.returncode != 0:
            raise AssertionError(f"hvfleet agent --once for {name}: {agent.returncode}\n{out}\n{err}")
    with open_store(store_url) as s:
        for name, labels in LABELS.items():
            def label(h: Any, labels: dict[str, str] = labels) -> Any:
                meta = h.metadata.model_copy(update={"labels": {**h.metadata.labels, **labels}})
                return h.model_copy(update={"metadata": meta})
            s.update_hypervisor(name, label, "test-setup")


@contextmanager
def serving(tmp: Path, store_url: str) -> Iterator[Fleet]:
    # History points every second, so tests see a change's point at once.
    proc, url, _ = launch(tmp, store_url, "--history-tiers", "1s:1h,1m:1d,10m:7d")
    try:
        yield Fleet(url, store_url, tmp, process=proc)
    finally:
        stop(proc)


def login(page: Any, fleet: Fleet, token: str, path: str = "/") -> None:
    page.goto(f"{fleet.url}/login?next={quote(path)}")
    page.fill("#token", token)
    page.click("form.login button[type=submit]")
    page.wait_for_load_state()


def heat_map_grouped_by_az(page: Any) -> tuple[list[str], int]:
    """Group the open overview's heat map by the `az` label (the form, then
    the URL); the first figure's group headings and the number of figures
    (one per resource)."""
    page.wait_for_selector("#heat canvas")
    page.select_option("#heat-group", "az")
    page.click("#heat-form button[type=submit]")
    page.wait_for_function("new URLSearchParams(location.search).get('group') === 'az'")
    page.wait_for_selector("#heat-0-2")
    headings = page.locator("#heat figure:first-child .heat-group").all_inner_texts()
    return headings, len(page.locator("#heat figure").all())
