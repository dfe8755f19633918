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


def _allocate(fleet: Fleet, name: str, cpu: int) -> None:
    with open_store(fleet.store_url) as store:
        h = store.get_hypervisor(name)
        status = h.status.model_copy(update={"allocation": {**h.status.allocation, "cpu": Quantity(cpu)}})
        store.update(h.model_copy(update={"status": status}), agent_manager(name))


def test_at_10k_a_live_change_is_in_place_and_a_label_value_links_into_its_view(
        big: Fleet, page: Any) -> None:
    login(page, big, big.tokens["viewer"])
    page.wait_for_selector("#live-status:has-text('on')")
    page.evaluate("""() => { document.querySelector("tr[data-host='hv-00050']").__kept = 1; }""")
    # Text typed into the search but not submitted is neither read nor lost.
    page.focus("#q")
    page.keyboard.type("hv-0999")
    url = page.url
    _allocate(big, "hv-00003", 777)
    cell = "tr[data-host='hv-00003'] .res[data-resource='cpu']"
    page.wait_for_function(f"document.querySelector(\"{cell}\").dataset.allocation === '777'")
    assert page.url == url
    assert page.evaluate("document.activeElement.id") == "q"
    assert page.input_value("#q") == "hv-0999"
    assert page.locator(ROWS).count() == 100
    assert page.evaluate("document.querySelector(\"tr[data-host='hv-00050']\").__kept") == 1
    # A label value's totals link into the fleet narrowed to it.
    page.click("tr[data-group='az=az2'] th a")
    page.wait_for_function("location.search.includes('selector=az%3Daz2')")
    page.wait_for_selector("body[data-ready='1']")
    assert _names(page)[:3] == ["hv-00001", "hv-00004", "hv-00007"]
    assert "Page 1 of 34" in page.inner_text("#pager")  # 3,333 hosts


def test_a_phone_sees_the_overview_of_10k_without_sideways_scrolling(big: Fleet, browser: Any) -> None:
    ctx = browser.new_context(ignore_https_errors=True, viewport={"width": 390, "height": 844},
                              is_mobile=True, has_touch=True)
    try:
        page = ctx.new_page()
        page.set_default_timeout(ACTION_S * 1000)
        login(page, big, big.tokens["viewer"])
        page.wait_for_selector("#heat canvas")  # the heat map of every host is drawn
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, width
    finally:
        ctx.close()


def test_axe_finds_no_violation_on_the_overview_of_10k(big: Fleet, page: Any, axe_js: str) -> None:
    # 25 rows: every kind of element of the page at a quarter of axe's time (~20 s for 100 rows).
    login(page, big, big.tokens["viewer"], "/?perPage=25")
    page.wait_for_selector("#heat canvas")
    page.add_script_tag(content=axe_js)
    result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    assert [f"{v['id']} ({v['impact']}): {[n['target'] for n in v['nodes']][:3]}"
            for v in result["violations"]] == []


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
