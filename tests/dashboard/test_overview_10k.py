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
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from hvfleet.model.quantity import Quantity
from hvfleet.store import open_store
from hvfleet.store.ownership import agent_manager
from tests.dashboard.fleet import Fleet, heat_map_grouped_by_az, login, serving, wait_dashboard_loaded
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
    # The server's first fit builds its fleet index from the dashboard's hosts
    # (about 1.1 s of CPU at 10,000 hosts; 5-10 s when it listed them again).
    page.goto(big.url + "/fit?go=1&cpu=100000")
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


# -- the state filter, sort by state, a reordering change, the heat map by a label, history ---------

RANK = {"NotReady": 0, "Stale": 1, "Unknown": 2, "Maintenance": 3, "Ready": 4}


def _status(fleet: Fleet, name: str, **update: Any) -> None:
    """A status write as the host's agent, with a fresh heartbeat."""
    from datetime import UTC, datetime

    with open_store(fleet.store_url) as store:
        h = store.get_hypervisor(name)
        status = h.status.model_copy(update={"last_heartbeat_time": datetime.now(UTC), **update})
        store.update(h.model_copy(update={"status": status}), agent_manager(name))


def _spec(fleet: Fleet, name: str, **update: Any) -> None:
    with open_store(fleet.store_url) as store:
        store.update_hypervisor(
            name, lambda h: h.model_copy(update={"spec": h.spec.model_copy(update=update)}), "test-ops")


def _feed(fleet: Fleet, query: str) -> dict[str, Any]:
    r = _session(fleet).get(f"{fleet.url}/dashboard/overview.json?{query}", timeout=ACTION_S)
    r.raise_for_status()
    return dict(r.json())


@pytest.fixture(scope="module")
def states(big: Fleet) -> dict[str, str]:
    """One host in each state the filter offers besides the fleet's own
    (Stale from an old template, else Ready): the state each must show."""
    from hvfleet.model.meta import Condition

    ready = [Condition(type="Ready", status="True", reason="Reconciled")]
    _status(big, "hv-00011", conditions=ready)
    _status(big, "hv-00013", conditions=[Condition(type="Ready", status="False", reason="LibvirtDown",
                                                   message="libvirt is not answering")])
    _status(big, "hv-00014", conditions=[])
    _spec(big, "hv-00012", maintenance="manual", maintenance_reason="disk swap")
    # SYNCED False: the agent observed the spec's generation, then an operator sets a ratio.
    with open_store(big.store_url) as store:
        generation = store.get_hypervisor("hv-00015").metadata.generation
    _status(big, "hv-00015", observed_generation=generation)
    _spec(big, "hv-00015", overcommit={"cpu": 3.0})
    want = {"hv-00011": "Ready", "hv-00012": "Maintenance", "hv-00013": "NotReady", "hv-00014": "Unknown"}
    deadline = time.monotonic() + ACTION_S
    while True:  # the writes reach the dashboard through its watch
        got = {h["name"]: h for h in _feed(big, "q=hv-0001&perPage=10")["hosts"]}
        if all(got[n]["readiness"]["state"] == s for n, s in want.items()) and \
                got["hv-00015"]["synced"]["state"] == "False":
            return want
        assert time.monotonic() < deadline, {n: (got[n]["readiness"]["state"], got[n]["synced"]["state"])
                                             for n in [*want, "hv-00015"]}
        time.sleep(0.2)


def _pages(text: str) -> int:
    return int(text.split(" of ")[1].split()[0].replace(",", ""))


def test_at_10k_filter_by_each_state_and_synced(big: Fleet, page: Any, states: dict[str, str]) -> None:
    login(page, big, big.tokens["viewer"])
    page.wait_for_selector("body[data-ready='1']")
    for state in ("NotReady", "Unknown", "Maintenance", "Ready", "Stale", "NotSynced"):
        page.select_option("#state", state)
        page.wait_for_function(f"new URLSearchParams(location.search).get('state') === '{state}'")
        feed = _feed(big, f"state={state}&perPage=100")
        want = [h["name"] for h in feed["hosts"]]
        try:
            page.wait_for_function(
                f"want => JSON.stringify([...document.querySelectorAll('{ROWS}')].map(r => r.dataset.host)"
                ".filter(Boolean)) === JSON.stringify(want)", arg=want)
        except PlaywrightTimeout:
            raise AssertionError((state, want[:5], _names(page)[:5])) from None
        shown = _names(page)
        assert f"Page 1 of {feed['pages']:,}" in page.inner_text("#pager")
        mine = [n for n, s in states.items() if s == state]
        assert set(mine) <= set(shown) or feed["count"] > 100, (state, mine)
        if not want:  # Stale or Ready: the fleet's own state decides which one is empty
            assert state in ("Stale", "Ready") and shown == []
            continue
        if state == "NotSynced":
            assert "hv-00015" in shown  # a ratio set after the agent observed the spec
            continue
        badges = set(page.locator(f"{ROWS} .state").all_inner_texts())
        assert {b.split(",")[0] for b in badges} == {state}, (state, badges)
    # Every host is in exactly one state: the counts add up to the fleet.
    counts = {s: _feed(big, f"state={s}&perPage=1")["count"] for s in RANK}
    assert sum(counts.values()) == HOSTS and counts["NotReady"] == 1 and counts["Unknown"] == 1


def test_at_10k_sort_by_state_puts_the_hosts_that_need_a_look_first(
        big: Fleet, page: Any, states: dict[str, str]) -> None:
    login(page, big, big.tokens["viewer"])
    page.wait_for_selector("body[data-ready='1']")
    page.click("th button[data-sort='state']")
    page.wait_for_function("new URLSearchParams(location.search).get('sort') === 'state'")
    page.wait_for_selector("th[aria-sort='ascending'] button[data-sort='state']")
    feed = _feed(big, "sort=state&perPage=100")
    page.wait_for_function(f"document.querySelector('{ROWS}').dataset.host === 'hv-00013'")
    assert _names(page) == [h["name"] for h in feed["hosts"]]
    ranks = [RANK[h["readiness"]["state"]] for h in feed["hosts"]]
    assert ranks == sorted(ranks) and ranks[0] == 0  # NotReady first
    page.click("th button[data-sort='state']")  # again: the other way round
    page.wait_for_selector("th[aria-sort='descending'] button[data-sort='state']")
    feed = _feed(big, "sort=state&order=desc&page=100&perPage=100")
    page.fill("#jump", "100")
    page.press("#jump", "Enter")
    page.wait_for_function("document.getElementById('pager').textContent.includes('Page 100 of 100')")
    assert _names(page)[-1] == "hv-00013" == feed["hosts"][-1]["name"]


def test_at_10k_a_change_that_would_reorder_the_page_is_announced_not_applied(big: Fleet, page: Any) -> None:
    login(page, big, big.tokens["viewer"], "/?sort=used:cpu")
    page.wait_for_selector("#live-status:has-text('on')")
    before = _names(page)
    assert len(before) == 100
    last = before[-1]
    with open_store(big.store_url) as store:
        was = int(store.get_hypervisor(last).status.allocation["cpu"].value)
    try:
        _allocate(big, last, 99_999)
        page.wait_for_selector("#changes:has-text('would reorder this page')")
        assert _names(page) == before  # nothing jumped
        cell = f"tr[data-host='{last}'] .res[data-resource='cpu']"
        page.wait_for_function(f"document.querySelector(\"{cell}\").dataset.allocation === '99999'")
        page.click("#show-changes")
        page.wait_for_function(f"document.querySelector('{ROWS}').dataset.host === '{last}'")
        assert page.inner_text("#changes") == ""
    finally:
        _allocate(big, last, was)


def test_at_10k_the_heat_map_is_grouped_by_a_label_and_read_on_hover_and_focus(big: Fleet, page: Any) -> None:
    import re

    login(page, big, big.tokens["viewer"])
    headings, resources = heat_map_grouped_by_az(page)
    assert headings == ["az=az1: 3,334 hosts", "az=az2: 3,333 hosts", "az=az3: 3,333 hosts"]
    assert page.locator("#heat canvas").count() == resources * 3
    page.hover("#heat-0-1", position={"x": 1, "y": 1})  # the first tile of az2
    page.wait_for_selector("#heat-tip:not([hidden])")
    assert page.inner_text("#heat-tip").startswith("hv-00001 (")
    page.focus("#heat-0-0")
    assert page.inner_text("#heat-cell").startswith("hv-00000 (")
    page.keyboard.press("ArrowRight")
    assert page.inner_text("#heat-cell").startswith("hv-00003 (")  # the next host of az1
    page.keyboard.press("End")
    assert page.inner_text("#heat-cell").startswith("hv-09999 (")  # the last of az1's 3,334
    assert re.search(r"cpu (\d+\.\d% of effective capacity in use|no effective capacity)",
                     page.inner_text("#heat-cell"))
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*/hosts/hv-09999$"))


def _newest(page: Any, resource: str) -> list[str]:
    """The newest row of a chart's data table: from, allocated, held, effective."""
    return list(page.locator(f"figure.chart[data-resource={resource}] table.history-data tbody tr")
                .first.locator("td").all_text_contents())


def test_at_10k_fleet_and_host_history_are_charts_that_follow_a_write(big: Fleet, page: Any) -> None:
    login(page, big, big.tokens["viewer"], "/history?range=hour")
    assert page.locator("figure.chart svg[role=img] title").count() == 2  # cpu and memory
    assert page.locator("figure.chart[data-resource=memory] .axis.y text").count() >= 3
    assert page.locator("figure.chart .axis.x text:has-text('time (UTC)')").count() == 2
    legend = page.inner_text("section.history p.legend")
    assert "allocated" in legend and "held by reservations" in legend and "effective capacity" in legend
    before = int(_newest(page, "cpu")[1].replace(",", ""))
    assert before > 100_000  # the fleet's sum, not one host's
    # Memory in binary units (was "1160448Mi", "66142496358 free"), counts with separators.
    import re

    memory = _newest(page, "memory")[1:]
    assert all(re.fullmatch(r"\d{1,4}(\.\d)?[KMGTPE]i|0", m) for m in memory), memory
    assert memory[2].endswith("Pi")  # 10,000 hosts' memory (was "4498.2Ti")
    assert re.fullmatch(r"\d{1,3}(,\d{3})+", _newest(page, "cpu")[1])
    with open_store(big.store_url) as store:
        was = int(store.get_hypervisor("hv-00021").status.allocation["cpu"].value)
    _allocate(big, "hv-00021", was + 555)
    deadline = time.monotonic() + ACTION_S
    while int(_newest(page, "cpu")[1].replace(",", "")) != before + 555:
        assert time.monotonic() < deadline, _newest(page, "cpu")
        time.sleep(0.5)
        page.reload()
    page.goto(big.url + "/hosts/hv-00021?range=hour")
    assert page.locator("figure.chart svg[role=img] title").count() == 2
    deadline = time.monotonic() + ACTION_S
    while _newest(page, "cpu")[1] != str(was + 555):
        assert time.monotonic() < deadline, _newest(page, "cpu")
        time.sleep(0.5)
        page.reload()
