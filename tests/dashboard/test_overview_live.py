"""The overview as an operator uses it while the fleet changes (issue 19), in
the real Chromium against the real `hvfleet serve` of the example fleet:
live changes applied in place (focus, typed text, selection and rows kept;
no unsubmitted field read), a change that would reorder the page announced,
churn coalesced, off-page churn leaving the table alone; finding hosts
(name search, state filter, sort by state or column, page size and jump, the
URL keeps the view, label totals as links); the heat map grouped, read on
hover and focus, its bands apart in lightness; the fit page's reason summary
and host links; gzip on pages and feeds but not on the event stream, and the
heat map's compact and delta forms."""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from hvfleet.model.hypervisor import Hypervisor
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import CPU
from hvfleet.server.dashboard.pages.fit import reason_summary
from hvfleet.store import open_store
from hvfleet.store.ownership import agent_manager
from tests.dashboard.fleet import Fleet, heat_map_grouped_by_az, hvfleet, login

ROWS = "table.hosts tbody tr"


def _allocate(fleet: Fleet, name: str, cpu: int) -> None:
    """A status write as the host's agent: `cpu` allocated."""
    with open_store(fleet.store_url) as s:
        h = s.get_hypervisor(name)
        status = h.status.model_copy(update={"allocation": {**h.status.allocation, "cpu": Quantity(cpu)}})
        s.update(h.model_copy(update={"status": status}), agent_manager(name))


def _cpu_allocation(fleet: Fleet, name: str) -> int:
    with open_store(fleet.store_url) as s:
        q = s.get_hypervisor(name).status.allocation.get(CPU)
        return int(q.value) if q is not None else 0


def _names(page: Any) -> list[str]:
    return list(page.locator(ROWS).evaluate_all("rows => rows.map(r => r.dataset.host)"))


def _cell(name: str) -> str:
    return f"tr[data-host='{name}'] .res[data-resource='cpu']"


def _wait_allocation(page: Any, name: str, cpu: int, timeout: int = 5000) -> None:
    page.wait_for_function(f"document.querySelector(\"{_cell(name)}\").dataset.allocation === '{cpu}'",
                           timeout=timeout)


def _session(fleet: Fleet, token: str) -> requests.Session:
    s = fleet.http()
    s.cookies.set("hvfleet_session", token)
    return s


def _feed(fleet: Fleet, query: str = "") -> dict[str, Any]:
    r = _session(fleet, fleet.tokens["viewer"]).get(
        f"{fleet.url}/dashboard/overview.json?perPage=1000{query}", timeout=30)
    r.raise_for_status()
    return dict(r.json())


@pytest.fixture
def stale_host(fleet: Fleet) -> Iterator[str]:
    """A host whose agent last wrote an hour ago (Stale), in az9."""
    from datetime import UTC, datetime, timedelta

    old = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    with open_store(fleet.store_url) as s:
        s.create(Hypervisor.model_validate({
            "metadata": {"name": "aaa-stale", "labels": {"az": "az9"}},
            "status": {"capacity": {"cpu": 4, "memory": "8Gi"}, "allocation": {"cpu": 1},
                       "conditions": [{"type": "Ready", "status": "True"}], "lastHeartbeatTime": old}}),
            agent_manager("aaa-stale"))
    try:
        yield "aaa-stale"
    finally:
        with open_store(fleet.store_url) as s:
            s.delete("Hypervisor", "aaa-stale")


# -- live views -----------------------------------------------------------------------------------

def test_a_live_change_is_applied_in_place_and_reads_no_unsubmitted_field(fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["viewer"])
    page.wait_for_selector("#live-status:has-text('on')")
    # A row that will not change, and a text selection in it, survive an update.
    page.evaluate("""() => { const tr = document.querySelector("tr[data-host='lab-01']"); tr.__kept = 1;
        const r = document.createRange(); r.selectNodeContents(tr.lastElementChild);
        getSelection().removeAllRanges(); getSelection().addRange(r); }""")
    selected = page.evaluate("getSelection().toString()")
    assert selected == "az=az3, role=lab"
    want = _cpu_allocation(fleet, "compute-02") + 3
    _allocate(fleet, "compute-02", want)
    _wait_allocation(page, "compute-02", want)
    assert page.evaluate("getSelection().toString()") == selected
    assert page.evaluate("document.querySelector(\"tr[data-host='lab-01']\").__kept") == 1

    # Text typed into the selector but not submitted is neither read nor lost.
    page.focus("#selector")
    page.keyboard.type("role=zz")
    url = page.url
    _allocate(fleet, "compute-02", want + 1)
    _wait_allocation(page, "compute-02", want + 1)
    assert page.url == url  # the view did not move
    assert page.evaluate("document.activeElement.id") == "selector"
    assert page.input_value("#selector") == "role=zz"
    assert page.locator(ROWS).count() == 7  # not the typed selector's (empty) answer
    assert page.evaluate("document.querySelector(\"tr[data-host='lab-01']\").__kept") == 1


def test_a_change_that_would_reorder_the_page_is_announced_not_applied(fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["viewer"], "/?sort=used:cpu")
    page.wait_for_selector("#live-status:has-text('on')")
    before = _names(page)
    last = before[-1]
    was = _cpu_allocation(fleet, last)
    try:
        _allocate(fleet, last, 990)
        page.wait_for_selector("#changes:has-text('would reorder this page')")
        assert re.search(r"\d+ changes? would reorder", page.inner_text("#changes"))
        assert _names(page) == before  # nothing jumped
        _wait_allocation(page, last, 990)  # its figures are current, in its old place
        page.click("#show-changes")
        page.wait_for_function(f"document.querySelector('{ROWS}').dataset.host === '{last}'")
        assert page.inner_text("#changes") == ""
    finally:
        _allocate(fleet, last, was)


def test_churn_is_shown_at_most_once_a_second(fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["viewer"])
    page.wait_for_selector("#live-status:has-text('on')")
    start = int(page.get_attribute("body", "data-redraws") or 0)
    base = _cpu_allocation(fleet, "compute-01")
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < 3.0:
        n += 1
        _allocate(fleet, "compute-01", base + n)
        time.sleep(0.02)
    elapsed = time.monotonic() - t0
    _wait_allocation(page, "compute-01", base + n)  # the last state arrives
    redraws = int(page.get_attribute("body", "data-redraws") or 0) - start
    assert n >= 20, "the churn was too slow to test coalescing"
    assert 1 <= redraws <= elapsed + 2, (n, redraws, elapsed)


def test_churn_off_the_page_leaves_the_table_alone(fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["viewer"], "/?q=compute")
    page.wait_for_selector("#live-status:has-text('on')")
    assert _names(page) == ["compute-01", "compute-02", "compute-03"]
    page.evaluate("""() => { window.__mutations = 0;
        new MutationObserver((l) => { window.__mutations += l.length; })
          .observe(document.getElementById('hosts'),
                   {subtree: true, childList: true, attributes: true, characterData: true}); }""")
    version = page.get_attribute("body", "data-version")
    base = _cpu_allocation(fleet, "lab-01")
    for i in range(5):
        _allocate(fleet, "lab-01", base + i + 1)
    # The totals follow (lab-01 counts in them) ...
    page.wait_for_function(f"document.body.dataset.version !== '{version}'")
    page.wait_for_timeout(1500)
    assert page.evaluate("window.__mutations") == 0  # ... the table is not touched


# -- finding hosts ----------------------------------------------------------------------------------

def test_search_by_name_prefix_first_then_substring_and_the_url_keeps_it(fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["viewer"], "/?q=comp")
    page.wait_for_selector("body[data-ready='1']")
    assert _names(page) == ["compute-01", "compute-02", "compute-03"]
    page.fill("#q", "e")
    page.press("#q", "Enter")
    page.wait_for_function("new URLSearchParams(location.search).get('q') === 'e'")
    page.wait_for_function(f"document.querySelector('{ROWS}').dataset.host === 'edge-01'")
    # Names that start with it first, then those that contain it (name order in each).
    assert _names(page) == ["edge-01", "bigmem-01", "compute-01", "compute-02", "compute-03"]
    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    assert _names(page) == ["edge-01", "bigmem-01", "compute-01", "compute-02", "compute-03"]
    assert page.input_value("#q") == "e"


def test_filter_by_state_and_synced_and_sort_by_state(fleet: Fleet, page: Any, stale_host: str) -> None:
    deadline = time.monotonic() + 10
    while True:  # the host just written reaches the dashboard through its watch
        feed = _feed(fleet)
        stale = [h["name"] for h in feed["hosts"] if h["readiness"]["state"] == "Stale"]
        if stale_host in stale or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert stale_host in stale
    login(page, fleet, fleet.tokens["viewer"])
    page.wait_for_selector("body[data-ready='1']")
    page.select_option("#state", "Stale")
    page.wait_for_function("new URLSearchParams(location.search).get('state') === 'Stale'")
    page.wait_for_function(f"document.querySelectorAll('{ROWS}').length === {len(stale)}")
    assert _names(page) == stale
    assert set(page.locator(f"{ROWS} .state").all_inner_texts()) == {"Stale"}

    unsynced = [h["name"] for h in feed["hosts"] if h["synced"]["state"] == "False"]
    page.goto(fleet.url + "/?state=NotSynced")
    page.wait_for_selector("body[data-ready='1']")
    assert _names(page) == unsynced

    rank = {"NotReady": 0, "Stale": 1, "Unknown": 2, "Maintenance": 3, "Ready": 4}
    page.goto(fleet.url + "/")
    page.wait_for_selector("body[data-ready='1']")
    page.click("th button[data-sort='state']")
    page.wait_for_function("new URLSearchParams(location.search).get('sort') === 'state'")
    page.wait_for_selector("th[aria-sort='ascending'] button[data-sort='state']")
    by_state = sorted(feed["hosts"], key=lambda h: (rank[h["readiness"]["state"]], h["name"]))
    assert _names(page) == [h["name"] for h in by_state]
    page.click("th button[data-sort='state']")  # again: the other way round
    page.wait_for_selector("th[aria-sort='descending'] button[data-sort='state']")
    assert _names(page) == [h["name"] for h in reversed(by_state)]


def test_page_size_jump_to_a_page_and_the_url_keeps_the_view(fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["viewer"], "/?perPage=2")
    page.wait_for_selector("body[data-ready='1']")
    assert "Page 1 of 4" in page.inner_text("#pager")
    page.fill("#jump", "3")
    page.press("#jump", "Enter")
    page.wait_for_function("document.getElementById('pager').textContent.includes('Page 3 of 4')")
    assert "page=3" in page.url and "perPage=2" in page.url
    shown = _names(page)
    assert shown == sorted(h["name"] for h in _feed(fleet)["hosts"])[4:6]
    page.click("#pager button:has-text('Last page')")
    page.wait_for_function("document.getElementById('pager').textContent.includes('Page 4 of 4')")
    page.go_back()  # the browser's history holds each view
    page.wait_for_function("document.getElementById('pager').textContent.includes('Page 3 of 4')")
    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    assert _names(page) == shown
    page.select_option("#perPage", "25")
    page.wait_for_function("document.getElementById('pager').textContent.includes('Page 1 of 1')")
    assert page.locator(ROWS).count() == 7


def test_totals_per_label_value_link_into_that_filtered_view(fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["viewer"])
    page.wait_for_selector("body[data-ready='1']")
    page.click("tr[data-group='az=az2'] th a")
    page.wait_for_selector("body[data-ready='1']")
    assert "selector=az%3Daz2" in page.url
    assert _names(page) == ["compute-03", "edge-01", "gpu-01"]
    assert page.input_value("#selector") == "az=az2"


def test_heat_map_grouped_by_a_label_read_on_hover_and_focus(fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["viewer"])
    headings, resources = heat_map_grouped_by_az(page)
    assert headings == ["az=az1: 3 hosts", "az=az2: 3 hosts", "az=az3: 1 host"]
    assert page.locator("#heat canvas").count() == resources * 3

    page.hover("#heat-0-1", position={"x": 1, "y": 1})  # the first tile of az2
    page.wait_for_selector("#heat-tip:not([hidden])")
    assert page.inner_text("#heat-tip").startswith("compute-03 (")

    page.focus("#heat-0-0")
    assert page.inner_text("#heat-cell").startswith("bigmem-01 (")
    page.keyboard.press("ArrowRight")
    assert page.inner_text("#heat-cell").startswith("compute-01 (")
    assert page.is_visible("#heat-tip") and page.inner_text("#heat-tip").startswith("compute-01 (")
    assert re.search(r"cpu (\d+\.\d% of effective capacity in use|no effective capacity)",
                     page.inner_text("#heat-cell"))
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*/hosts/compute-01$"))


def _luminance(rgb: str) -> float:
    def channel(v: float) -> float:
        v /= 255
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4
    r, g, b = (float(x) for x in re.findall(r"\d+", rgb)[:3])
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def test_heat_bands_differ_in_lightness_at_least_1_5_to_1(fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["viewer"])
    page.wait_for_selector("#heat canvas")
    legend = [page.eval_on_selector(f".key.h{i}", "e => getComputedStyle(e).backgroundColor")
              for i in range(5)]
    lum = [_luminance(c) for c in legend]
    ratios = [(a + 0.05) / (b + 0.05) for a, b in itertools.pairwise(lum)]
    assert all(r >= 1.5 for r in ratios), ratios
    # The canvas paints the legend's colours (a tile of every drawn band is one of them).
    drawn = page.evaluate("""() => { const d = document.getElementById('heat-0').getContext('2d')
        .getImageData(8, 8, 1, 1).data; return `rgb(${d[0]}, ${d[1]}, ${d[2]})`; }""")
    assert drawn in {*legend, "rgb(255, 255, 255)"}


# -- the fit page ----------------------------------------------------------------------------------

def test_fit_summarises_why_not_with_counts_and_links_hosts(fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["ops"], "/fit?go=1&cpu=100000&show=10")
    page.wait_for_selector("#fit-reasons")
    cli = json.loads(hvfleet("fit", "--cpu", "100000", "--why", "-o", "json", "--store",
                             fleet.store_url, check=False).stdout)
    want = [f"{n:,} × {words}" for n, words in reason_summary(cli["rejected"])]
    assert page.locator("#fit-reasons li").all_inner_texts() == want
    assert any("not enough cpu" in w for w in want)
    links = page.locator("table.rejected tbody a")
    assert links.count() == len(cli["rejected"])
    first = links.first.inner_text()
    assert links.first.get_attribute("href") == f"/hosts/{first}"
    links.first.click()
    page.wait_for_url(re.compile(rf".*/hosts/{first}$"))


def test_axe_finds_no_violation_in_the_new_controls(fleet: Fleet, page: Any, axe_js: str) -> None:
    login(page, fleet, fleet.tokens["viewer"])
    found = {}
    for path in ("/?group=az&q=o&sort=state", "/?perPage=2&page=2&state=Ready", "/fit?go=1&cpu=100000"):
        page.goto(fleet.url + path)
        page.wait_for_load_state("networkidle")
        page.add_script_tag(content=axe_js)
        result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
        bad = [f"{v['id']} ({v['impact']}): {v['help']}" for v in result["violations"]]
        if bad:
            found[path] = bad
    assert found == {}


# -- compression, the heat map's compact and delta forms, the event stream ----------------------------

def test_pages_and_feeds_are_gzipped_and_the_event_stream_is_not(fleet: Fleet) -> None:
    s = _session(fleet, fleet.tokens["viewer"])
    # (the heat map of 7 hosts is under GZipMiddleware's 500 bytes; test_overview_10k has it gzipped)
    for path in ("/", "/dashboard/overview.json", "/static/dashboard.js", "/hosts/compute-01", "/fit"):
        r = s.get(fleet.url + path, headers={"Accept-Encoding": "gzip"}, timeout=30)
        assert r.status_code == 200, path
        assert r.headers.get("Content-Encoding") == "gzip", path
    got: list[str] = []
    with s.get(fleet.url + "/dashboard/events", headers={"Accept-Encoding": "gzip"}, stream=True,
               timeout=30) as r:
        assert "Content-Encoding" not in r.headers
        t0 = time.monotonic()
        for line in r.iter_lines(decode_unicode=True):
            got.append(line)
            if line.startswith("data:"):
                break
        assert time.monotonic() - t0 < 5  # sent at once, not held by a compressor
    assert got[0] == "event: hello"


def test_heat_map_is_compact_and_sends_only_changed_tiles(fleet: Fleet) -> None:
    s = _session(fleet, fleet.tokens["viewer"])
    full = s.get(fleet.url + "/dashboard/heat.json", timeout=30).json()
    feed = _feed(fleet)
    assert full["names"] == [h["name"] for h in feed["hosts"]]
    j = full["resources"].index("cpu")
    for name, tile in zip(full["names"], full["tiles"], strict=True):
        use = next(h for h in feed["hosts"] if h["name"] == name)["resources"]["cpu"]["use"]
        assert tile[1 + j] == (-1 if use is None else round(use * 1000))
    quiet = s.get(fleet.url + "/dashboard/heat.json", params={"since": full["version"],
                                                               "layout": full["layout"]}, timeout=30).json()
    assert quiet["delta"] is True and quiet["changed"] == []
    _allocate(fleet, "compute-02", _cpu_allocation(fleet, "compute-02") + 1)
    deadline = time.monotonic() + 5
    while True:
        d = s.get(fleet.url + "/dashboard/heat.json", params={"since": full["version"],
                                                               "layout": full["layout"]}, timeout=30).json()
        if d["changed"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert [c[0] for c in d["changed"]] == [full["names"].index("compute-02")]
    # Another view (another layout) gets the whole map again.
    other = s.get(fleet.url + "/dashboard/heat.json", params={"since": full["version"], "layout": "x",
                                                               "group": "az"}, timeout=30).json()
    assert "delta" not in other and [g[0] for g in other["groups"]] == ["az1", "az2", "az3"]


def test_the_event_stream_coalesces_a_burst_into_one_event_a_second(fleet: Fleet) -> None:
    s = _session(fleet, fleet.tokens["viewer"])
    events: list[tuple[float, list[str]]] = []
    stop = threading.Event()

    def read() -> None:
        with s.get(fleet.url + "/dashboard/events", stream=True, timeout=30) as r:
            kind = ""
            for line in r.iter_lines(decode_unicode=True):
                if line.startswith("event:"):
                    kind = line.split(":", 1)[1].strip()
                elif line.startswith("data:") and kind == "change":
                    events.append((time.monotonic(), json.loads(line[5:])["hosts"]))
                if stop.is_set():
                    return

    t = threading.Thread(target=read, daemon=True)
    t.start()
    time.sleep(1.0)
    base = _cpu_allocation(fleet, "gpu-01")
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < 3.0:
        n += 1
        _allocate(fleet, "gpu-01" if n % 2 else "edge-01", base + n)
        time.sleep(0.02)
    time.sleep(1.5)
    stop.set()
    _allocate(fleet, "gpu-01", base)  # one more event lets the reader see `stop`
    t.join(10)
    during = [e for e in events if e[0] >= t0]
    assert during, "no change event"
    assert len(during) <= 3.0 + 2, (n, len(during))
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(during)]
    assert all(g >= 0.9 for g in gaps), gaps
    assert {"gpu-01", "edge-01"} <= {h for _, hosts in during for h in hosts}
