"""Fixtures: one real fleet behind `hvfleet serve` per session, handed to each
module as the agents reported it, the system Chromium per session, and a fresh
browser context (its own cookies) per test."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, sync_playwright

from hvfleet.model import Hypervisor, ObjectMeta
from hvfleet.model.hypervisor import STORED_KINDS
from hvfleet.store import open_store
from hvfleet.store.ownership import agent_manager
from tests.dashboard.fleet import CHROMIUM, CHROMIUM_ARGS, Fleet, report_fleet, serving


@pytest.fixture(scope="session")
def reported_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, Reported]]:
    """One fleet per session (per xdist worker): the hosts the real agents
    reported, with their labels, behind `hvfleet serve`, a token per name."""
    tmp = tmp_path_factory.mktemp("dashboard")
    store_url = f"sqlite:///{tmp}/hvfleet.db"
    report_fleet(store_url)
    with open_store(store_url) as s:
        reported = Reported(s.list_hypervisors())
    with serving(tmp, store_url) as f:
        for role, name in (("viewer", "viewer"), ("operator", "ops"), ("operator", "ops2"),
                           ("admin", "admin")):
            f.token(role, name)  # type: ignore[arg-type]
        reported.tokens = dict(f.tokens)
        yield f, reported


@pytest.fixture(scope="module")
def fleet(reported_fleet: tuple[Fleet, Reported]) -> Fleet:
    """The session's fleet, as the agents reported it when a module starts: a
    module that follows another gets its hosts back as written then (status as
    each host's agent, labels as test-setup), and nothing else but its history
    and the four tokens (the server is not restarted; the agents not rerun)."""
    f, reported = reported_fleet
    if reported.used:
        reported.restore(f)
    reported.used = True
    return f


class Reported:
    """The hosts as report_fleet left them, and the tokens the fixture issued."""

    def __init__(self, hosts: list[Hypervisor]) -> None:
        self.hosts = hosts
        self.tokens: dict[str, str] = {}
        self.used = False

    def restore(self, fleet: Fleet) -> None:
        keep = {text.split("_")[1] for text in self.tokens.values()}
        now = datetime.now(UTC)
        with open_store(fleet.store_url) as s:
            for kind in STORED_KINDS:
                if kind == "HistorySeries":
                    continue  # the server's sampler owns it; a fleet's history just goes on
                listed = s.list(kind)
                for name in [o.metadata.name for o in listed.items] + [u.name for u in listed.undecodable]:
                    if not (kind == "AccessToken" and name in keep):
                        s.delete(kind, name)
            for h in self.hosts:
                status = h.status.model_copy(update={"last_heartbeat_time": now})
                made = s.create(Hypervisor(metadata=ObjectMeta(name=h.name), status=status),
                                agent_manager(h.name))
                meta = made.metadata.model_copy(update={"labels": dict(h.metadata.labels)})
                s.update(made.model_copy(update={"metadata": meta}), "test-setup")
        fleet.tokens = dict(self.tokens)


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[Any]:
    # The server's own CA signed its certificate; this browser does not know it.
    # The tests' own probes (wait_for_function, axe) are scripts the page's CSP
    # refuses; test_pages_run_under_their_content_security_policy runs without this.
    ctx = browser.new_context(ignore_https_errors=True, bypass_csp=True,
                              viewport={"width": 1400, "height": 1000})
    yield ctx
    ctx.close()


@pytest.fixture
def page(context: Any) -> Any:
    p = context.new_page()
    errors: list[str] = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    yield p
    assert not errors, f"JavaScript errors on the page: {errors}"


@pytest.fixture(autouse=True)
def _quiet_insecure_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


AXE = Path(__file__).resolve().parents[2] / "build" / "axe" / "node_modules" / "axe-core" / "axe.min.js"


@pytest.fixture(scope="session")
def axe_js() -> str:
    """axe-core from npm, installed into build/axe on first use (not at run time
    of the dashboard: only the tests inject it)."""
    import subprocess

    if not AXE.exists():
        AXE.parents[2].mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix",
                        str(AXE.parents[2]), "axe-core@4"], check=True, timeout=300)
    return AXE.read_text()
