"""The overview and fit pages at 10,000 hosts (issue 19), in the real Chromium
against the real `hvfleet serve` over a SQLite store of synthetic hosts (one
server for the module): find one host by name, jump to the last of 100
pages, the heat map gzipped and sent as deltas, a burst of status writes
coalesced while the page stays responsive, the fit page's reason summary and
its limited rows. Marked slow (one fleet of 10,000 hosts, copied from a store
seeded once: tests/dashboard/synthetic.py); run by `make test` and CI.

Every action waits at most ACTION_S: the first overview after a login once
took 20-30+ s here (three reloads of the fleet after start-up, and history
and redraws for every host when all went Stale), and a regression like that
must fail, not wait."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hvfleet.model.quantity import Quantity
from hvfleet.store import open_store
from hvfleet.store.ownership import agent_manager
from tests.dashboard.fleet import Fleet, login, serving, wait_dashboard_loaded
from tests.dashboard.synthetic import seeded_store

pytestmark = pytest.mark.slow

HOSTS = 10_000
ROWS = "table.hosts tbody tr"
ACTION_S = 15


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("dashboard10k")
    store_url = seeded_store(tmp / "hvfleet.db", HOSTS)
    with serving(Path(tmp), store_url) as f:
        f.token("viewer", "viewer")
        f.token("operator", "ops")
        wait_dashboard_loaded(f, f.tokens["viewer"])
        yield f


@pytest.fixture(autouse=True)
def _prompt(page: Any) -> None:
    page.set_default_timeout(ACTION_S * 1000)


def _names(page: Any) -> list[str]:
    return list(page.locator(ROWS).evaluate_all("rows => rows.map(r => r.dataset.host)"))


def _session(fleet: Fleet) -> Any:
    s = fleet.http()
    s.cookies.set("hvfleet_session", fleet.tokens["viewer"])
    return s


def test_find_one_host_among_10k_and_jump_to_the_last_page(big: Fleet, page: Any) -> None:
    login(page, big, big.tokens["viewer"])
    page.wait_for_selector("body[data-ready='1']")
    assert "Page 1 of 100" in page.inner_text("#pager")
    page.fill("#q", "hv-0424")
    page.press("#q", "Enter")
    page.wait_for_function(f"document.querySelectorAll('{ROWS}').length === 10")
    assert _names(page) == [f"hv-0424{i}" for i in range(10)]
    page.fill("#q", "")
    page.press("#q", "Enter")
    page.wait_for_function("document.getElementById('pager').textContent.includes('Page 1 of 100')")
    page.fill("#jump", "100")
    page.press("#jump", "Enter")
    page.wait_for_function("document.getElementById('pager').textContent.includes('Page 100 of 100')")
    assert _names(page)[0] == "hv-09900"
    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    assert _names(page)[0] == "hv-09900"


def test_heat_map_of_10k_is_gzipped_and_a_change_is_a_small_delta(big: Fleet) -> None:
    s = _session(big)
    r = s.get(big.url + "/dashboard/heat.json", stream=True, timeout=ACTION_S)
    raw = r.raw.read(decode_content=False)
    assert r.headers["Content-Encoding"] == "gzip"
    assert len(raw) < 120_000, len(raw)  # 508 KB of plain JSON before
    full = json.loads(gzip.decompress(raw))
    assert len(full["names"]) == HOSTS and len(full["tiles"]) == HOSTS
    with open_store(big.store_url) as store:
        h = store.get_hypervisor("hv-00007")
        status = h.status.model_copy(update={"allocation": {**h.status.allocation, "cpu": Quantity(1)}})
        store.update(h.model_copy(update={"status": status}), agent_manager("hv-00007"))
    deadline = time.monotonic() + 10
    while True:
        d = s.get(big.url + "/dashboard/heat.json",
                  params={"since": full["version"], "layout": full["layout"]}, timeout=ACTION_S)
        if d.json()["changed"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [c[0] for c in d.json()["changed"]] == [7]
    assert len(d.content) < 1000


def test_a_burst_of_status_writes_is_coalesced_and_the_page_stays_responsive(big: Fleet, page: Any) -> None:
    login(page, big, big.tokens["viewer"])
    page.wait_for_selector("#live-status:has-text('on')")
    start = int(page.get_attribute("body", "data-redraws") or 0)
    done = threading.Event()
    written = [0]

    def burst() -> None:
        with open_store(big.store_url) as store:
            hosts = {h.name: h for h in store.list_hypervisors()}
            t0 = time.monotonic()
            i = 0
            while time.monotonic() - t0 < 6.0:
                name = f"hv-{(i * 37) % HOSTS:05d}"
                h = hosts[name]
                status = h.status.model_copy(update={"allocation": {**h.status.allocation,
                                                                     "cpu": Quantity(i % 50)}})
                hosts[name] = store.update(h.model_copy(update={"status": status}), agent_manager(name))
                i += 1
            written[0] = i
        done.set()

    # Long tasks of the page's main thread (a frozen page is one long task).
    page.evaluate("""() => { window.__longest = 0; new PerformanceObserver((l) => {
        for (const e of l.getEntries()) window.__longest = Math.max(window.__longest, e.duration); })
        .observe({type: 'longtask'}); }""")
    t = threading.Thread(target=burst)
    t0 = time.monotonic()
    t.start()
    t.join()
    elapsed = time.monotonic() - t0
    redraws = int(page.get_attribute("body", "data-redraws") or 0) - start
    # The burst is shown (on a loaded machine the server may still be catching up).
    page.wait_for_function(f"Number(document.body.dataset.redraws) > {start}")
    longest = page.evaluate("window.__longest")
    assert written[0] >= 200, written
    assert redraws <= elapsed + 3, (redraws, elapsed, written)
    # The page never froze (17 s before). The bound leaves room for a loaded
    # 2-core CI machine, where a 0.2 s task can take a second of wall time.
    assert longest < 2000, (longest, redraws, written)


def test_fit_at_10k_summarises_reasons_and_lists_a_limited_number_of_rows(big: Fleet, page: Any) -> None:
    login(page, big, big.tokens["ops"], "/fit")
    # The server's first fit builds its fleet index (scheduling.FleetIndex.from_store):
    # about 10 s of CPU at 10,000 hosts, once per process.
    page.goto(big.url + "/fit?go=1&cpu=100000", timeout=2 * ACTION_S * 1000)
    page.wait_for_selector("#fit-reasons")
    counts = [int(t.split(" × ")[0].replace(",", ""))
              for t in page.locator("#fit-reasons li").all_inner_texts()]
    assert sum(counts) >= HOSTS and counts[0] <= HOSTS
    assert page.locator("table.rejected tbody tr").count() == 25
    assert "the first 25 of 10,000" in page.inner_text("table.rejected caption")
    page.select_option("#show", "100")
    with page.expect_navigation():
        page.click("form.fit button[type=submit]")
    assert page.locator("table.rejected tbody tr").count() == 100
