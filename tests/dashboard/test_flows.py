"""Flows that don't lose work (issue 19), in Chromium against the real `hvfleet
serve`: an ended session says so and brings the person back to the form they
sent, filled in; every action answers with a redirect, so a reload sends
nothing; drain and manual maintenance ask first, naming the host and its
instances; a role is offered only what the server's Authorizer allows it;
every bad field of a form is shown; a reservation's consumer is a UUID; a
phone sees the pages without sideways scrolling; the history charts have
axes, units, a legend and a data table, and axe-core finds nothing."""

from __future__ import annotations

from typing import Any

from hvfleet.store import open_store
from hvfleet.store.tokens import revoke_token
from tests.dashboard.fleet import Fleet, hvfleet, login


def _get(fleet: Fleet, name: str) -> Any:
    with open_store(fleet.store_url) as s:
        return s.get_hypervisor(name)


def _set_ratio(page: Any, ratio: str) -> None:
    page.fill("#ocs-resource", "cpu")
    page.fill("#ocs-ratio", ratio)
    page.click("form.action:has(#ocs-ratio) button[type=submit]")
    page.wait_for_load_state()


def test_an_ended_session_says_so_and_brings_back_the_form_filled_in(fleet: Fleet, page: Any) -> None:
    short = fleet.token("operator", "ops-short")
    login(page, fleet, short, "/hosts/lab-01")
    before = _get(fleet, "lab-01").metadata.resource_version
    with open_store(fleet.store_url) as s:
        revoke_token(s, short, "test-setup")
    page.wait_for_timeout(1500)  # the server's token cache (1 s)
    _set_ratio(page, "3")
    assert page.url.startswith(fleet.url + "/login?")
    ended = page.inner_text("p.ended")
    assert "Your session has ended" in ended and "/hosts/lab-01" in ended and "nothing was saved" in ended
    assert _get(fleet, "lab-01").metadata.resource_version == before
    page.fill("#token", fleet.tokens["ops"])
    page.click("form.login button[type=submit]")
    page.wait_for_load_state()
    assert "/hosts/lab-01?" in page.url  # the page, not the form's POST-only address (no 405)
    assert page.get_attribute("#ocs-ratio", "value") == "3"
    assert "nothing was written" in page.inner_text("p.notice")
    page.click("form.action:has(#ocs-ratio) button[type=submit]")
    page.wait_for_selector("p.notice:has-text('set to 3')")
    assert _get(fleet, "lab-01").spec.overcommit["cpu"] == 3.0
    hvfleet("overcommit", "unset", "lab-01", "cpu", "--manager", "ops", "--store", fleet.store_url)
    # Never logged in: the plain login page, no "ended".
    page.context.clear_cookies()
    page.goto(fleet.url + "/hosts/lab-01")
    assert page.url.startswith(fleet.url + "/login?") and page.locator("p.ended").count() == 0


def test_every_action_redirects_so_a_reload_sends_nothing(fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["ops"], "/hosts/lab-01")
    methods: list[str] = []
    page.on("request", lambda r: methods.append(r.method) if r.is_navigation_request() else None)
    _set_ratio(page, "lots")  # a field error
    assert "is not a number" in page.inner_text("#ocs-ratio-error")
    assert methods == ["POST", "GET"]
    methods.clear()
    page.reload()
    assert methods == ["GET"]
    assert page.locator("#ocs-ratio-error").count() == 0  # shown once, with the redirect
    _set_ratio(page, "2")
    page.wait_for_selector("p.notice")
    version = _get(fleet, "lab-01").metadata.resource_version
    methods.clear()
    page.reload()
    assert methods == ["GET"] and _get(fleet, "lab-01").metadata.resource_version == version
    hvfleet("overcommit", "unset", "lab-01", "cpu", "--manager", "ops", "--store", fleet.store_url)


def test_drain_asks_first_naming_the_host_and_its_instances(fleet: Fleet, page: Any) -> None:
    host = _get(fleet, "compute-03")
    assert host.status.instances
    login(page, fleet, fleet.tokens["ops"], "/hosts/compute-03")
    page.select_option("#mt-mode", "drain")
    page.click("form.action:has(#mt-mode) button[type=submit]")
    asked = page.inner_text("section.confirm")
    assert "compute-03" in asked and f"{len(host.status.instances)} instances" in asked
    assert all(i.name in asked for i in host.status.instances)
    assert _get(fleet, "compute-03").spec.maintenance == ""
    page.click("section.confirm a:has-text('Cancel')")
    assert _get(fleet, "compute-03").spec.maintenance == ""
    page.select_option("#mt-mode", "manual")
    page.fill("#mt-reason", "firmware")
    page.click("form.action:has(#mt-mode) button[type=submit]")
    assert "firmware" in page.inner_text("section.confirm")
    page.click("section.confirm button")
    page.wait_for_selector("p.notice:has-text('maintenance: manual')")
    assert _get(fleet, "compute-03").spec.maintenance == "manual"
    page.select_option("#mt-mode", "")  # back in service: nothing to confirm
    page.click("form.action:has(#mt-mode) button[type=submit]")
    page.wait_for_selector("p.notice:has-text('maintenance: none')")
    assert _get(fleet, "compute-03").spec.maintenance == ""


def test_a_scheduler_is_not_offered_a_force_it_may_not_use(fleet: Fleet, page: Any) -> None:
    sched = fleet.token("scheduler", "sched")
    hvfleet("overcommit", "set", "edge-01", "memory=1.5", "--manager", "ops2", "--store", fleet.store_url)
    login(page, fleet, sched, "/hosts/edge-01")
    page.fill("#ocs-resource", "memory")
    page.fill("#ocs-ratio", "2")
    page.click("form.action:has(#ocs-ratio) button[type=submit]")
    conflict = page.inner_text("section.conflict")
    assert "owned by ops2" in conflict and "may not take over" in conflict
    assert page.locator("section.conflict button").count() == 0
    # An operator may force: the button is there.
    login(page, fleet, fleet.tokens["ops"], "/hosts/edge-01")
    page.fill("#ocs-resource", "memory")
    page.fill("#ocs-ratio", "2")
    page.click("form.action:has(#ocs-ratio) button[type=submit]")
    assert page.locator("section.conflict button:has-text('force')").count() == 1
    hvfleet("overcommit", "unset", "edge-01", "memory", "--manager", "ops2", "--store", fleet.store_url)


def test_every_bad_field_is_shown_and_the_consumer_must_be_a_uuid(fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["admin"], "/hosts/gpu-01")
    page.fill("#rs-cpu", "lots")
    page.fill("#rs-memory", "much")
    page.fill("#rs-consumer", "web-1")
    page.fill("#rs-ttl", "soon")
    page.click("form.action:has(#rs-cpu) button[type=submit]")
    page.wait_for_selector("#rs-ttl-error")
    for name in ("cpu", "memory", "consumer", "ttl"):
        assert page.get_attribute(f"#rs-{name}", "aria-invalid") == "true", name
    assert "is not a UUID" in page.inner_text("#rs-consumer-error")
    assert page.get_attribute("#rs-consumer", "value") == "web-1"
    page.fill("#rs-cpu", "1")
    page.fill("#rs-memory", "")
    page.fill("#rs-ttl", "10m")
    page.click("form.action:has(#rs-cpu) button[type=submit]")
    assert "is not a UUID" in page.inner_text("#rs-consumer-error")
    assert page.locator("#rs-cpu-error").count() == 0
    with open_store(fleet.store_url) as s:
        assert not s.list_reservations()
    page.fill("#ocs-resource", "nothing like a resource")
    page.fill("#ocs-ratio", "many")
    page.click("form.action:has(#ocs-ratio) button[type=submit]")
    assert page.locator("#ocs-resource-error").count() == 1 and page.locator("#ocs-ratio-error").count() == 1


def test_a_phone_sees_the_pages_without_sideways_scrolling(fleet: Fleet, browser: Any) -> None:
    ctx = browser.new_context(ignore_https_errors=True, viewport={"width": 390, "height": 844},
                              is_mobile=True, has_touch=True)
    try:
        page = ctx.new_page()
        login(page, fleet, fleet.tokens["ops"])
        for path in ("/", "/hosts/compute-01", "/history", "/fit?go=1&cpu=4"):
            page.goto(fleet.url + path)
            page.wait_for_load_state("networkidle")
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, (path, width)
    finally:
        ctx.close()


def test_history_charts_have_axes_units_a_legend_a_table_and_pass_axe(fleet: Fleet, page: Any,
                                                                       axe_js: str) -> None:
    login(page, fleet, fleet.tokens["ops"], "/history?series=label%3Arole%3Dcompute&range=day")
    section = page.locator("section.history")
    assert section.get_attribute("data-series") == "label:role=compute"
    assert "last day" in page.inner_text("section.history h2")  # the page's own heading level
    assert page.locator("section.history nav.ranges a[aria-current]").inner_text() == "last day"
    assert page.locator("figure.chart svg[role=img] title").count() == 2  # cpu and memory
    assert "memory (bytes, binary units)" in page.inner_text("figure.chart[data-resource=memory] figcaption")
    assert page.locator("figure.chart[data-resource=memory] .axis.y text").count() >= 3
    assert page.locator("figure.chart .axis.x text:has-text('time (UTC)')").count() == 2
    legend = page.inner_text("section.history p.legend")
    assert "allocated" in legend and "held by reservations" in legend and "effective capacity" in legend
    page.click("figure.chart[data-resource=cpu] summary")
    assert page.locator("figure.chart[data-resource=cpu] table.history-data tbody tr").count() >= 1
    assert page.locator("nav.series a:has-text('Hosts with role=compute')").count() == 1
    found: dict[str, list[str]] = {}
    for path in ("/history?range=week", "/hosts/compute-01?range=hour", "/"):
        page.goto(fleet.url + path)
        page.wait_for_load_state("networkidle")
        page.add_script_tag(content=axe_js)
        result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
        if result["violations"]:
            found[path] = [f"{v['id']} ({v['impact']}): {[n['target'] for n in v['nodes']][:3]}"
                           for v in result["violations"]]
    assert found == {}
