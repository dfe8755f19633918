"""Fixtures: one real fleet behind `hvfleet serve` per module, the system
Chromium per session, and a fresh browser context (its own cookies) per test."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, sync_playwright

from tests.dashboard.fleet import CHROMIUM, CHROMIUM_ARGS, Fleet, report_fleet, serving


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("dashboard")
    store_url = f"sqlite:///{tmp}/hvfleet.db"
    report_fleet(store_url)
    with serving(tmp, store_url) as f:
        for role, name in (("viewer", "viewer"), ("operator", "ops"), ("operator", "ops2"),
                           ("admin", "admin")):
            f.token(role, name)  # type: ignore[arg-type]
        yield f


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
