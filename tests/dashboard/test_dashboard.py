"""The dashboard in a real headless Chromium against the real `hvfleet serve`
(TLS, SQLite, agents on the libvirt test driver, real tokens and roles)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from hvfleet.model.hypervisor import Hypervisor
from hvfleet.store import open_store
from hvfleet.store.ownership import owners
from tests.dashboard.fleet import FLEET, Fleet, agent_once, hvfleet, login


def _get(fleet: Fleet, name: str) -> Hypervisor:
    with open_store(fleet.store_url) as s:
        return s.get_hypervisor(name)


def _overview_figures(page: Any) -> dict[str, dict[str, dict[str, str]]]:
    return page.evaluate("""() => {
        const out = {};
        for (const tr of document.querySelectorAll('table.hosts tbody tr')) {
            const res = {};
            for (const d of tr.querySelectorAll('.res')) {
                res[d.dataset.resource] = {effective: d.dataset.effective, allocation: d.dataset.allocation,
                                           free: d.dataset.free};
            }
            out[tr.dataset.host] = res;
        }
        return out;
    }""")


def test_login_keeps_the_token_in_an_httponly_strict_secure_cookie(fleet: Fleet, page: Any,
                                                                    context: Any) -> None:
    page.goto(fleet.url + "/")
    assert page.url.startswith(fleet.url + "/login")
    page.fill("#token", "hvf_0000000000000000_wrong")
    page.click("form.login button[type=submit]")
    assert "unknown, expired or revoked" in page.inner_text("#token-error")
    assert page.get_attribute("#token", "aria-invalid") == "true"
    assert context.cookies() == []

    login(page, fleet, fleet.tokens["ops"])
    page.wait_for_selector("body[data-ready='1']")
    cookies = {c["name"]: c for c in context.cookies()}
    assert set(cookies) == {"hvfleet_session", "hvfleet_seen"}  # seen: the login can say a session ended
    for cookie in cookies.values():
        assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict"
    assert page.evaluate("document.cookie") == ""  # not readable by scripts
    assert page.inner_text(".who") == "Logged in as ops (role operator)"

    # The API takes bearer tokens only: the dashboard's cookie opens nothing there.
    r = page.request.get(fleet.url + "/apis/hvfleet.io/v1/hypervisors")
    assert r.status == 401

    page.click("form.logout button")
    page.wait_for_url(re.compile(r".*/login$"))
    assert context.cookies() == []
    page.goto(fleet.url + "/hosts/lab-01")
    assert "/login" in page.url


def test_overview_numbers_equal_hvfleet_capacity_json(fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["viewer"], "/?perPage=1000")
    page.wait_for_selector("body[data-ready='1']")
    shown = _overview_figures(page)
    cli = json.loads(hvfleet("capacity", "-o", "json", "--store", fleet.store_url).stdout)
    assert sorted(shown) == sorted(h["name"] for h in cli["hosts"])
    for h in cli["hosts"]:
        for r, eff in h["effective"].items():
            assert shown[h["name"]][r] == {"effective": eff, "allocation": h["allocation"].get(r, "0"),
                                           "free": h["free"][r]}, (h["name"], r)
    total = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#total-bars .res')]
        .map(d => [d.dataset.resource, {effective: d.dataset.effective, free: d.dataset.free}]))""")
    for r, eff in cli["total"]["effective"].items():
        assert total[r] == {"effective": eff, "free": cli["total"]["free"][r]}
    # Readiness as text, not colour alone.
    states = page.locator("table.hosts .state").all_inner_texts()
    assert states and set(states) == {h["readiness"]["state"] for h in cli["hosts"]}


def test_totals_per_label_filter_and_sort(fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["viewer"])
    page.wait_for_selector("body[data-ready='1']")
    cli = json.loads(hvfleet("capacity", "-o", "json", "-l", "az=az2", "--store", fleet.store_url).stdout)
    group = page.locator("tr[data-group='az=az2'] .res[data-resource='cpu']")
    assert group.get_attribute("data-free") == cli["total"]["free"]["cpu"]
    assert group.get_attribute("data-effective") == cli["total"]["effective"]["cpu"]

    page.fill("#selector", "az=az2")
    page.press("#selector", "Enter")
    page.wait_for_function("document.querySelectorAll('table.hosts tbody tr').length === 3")
    assert page.locator("#total-bars .res[data-resource='cpu']").get_attribute("data-free") == \
        cli["total"]["free"]["cpu"]

    page.select_option("#sort", "free:cpu")
    page.wait_for_function("new URLSearchParams(location.search).get('sort') === 'free:cpu'")
    page.wait_for_function("document.querySelector('table.hosts caption').textContent.includes('free:cpu')")
    names = page.locator("table.hosts tbody tr").evaluate_all("rows => rows.map(r => r.dataset.host)")
    by_free = sorted(cli["hosts"], key=lambda h: (-int(h["free"]["cpu"]), h["name"]))
    assert names == [h["name"] for h in by_free]

    page.fill("#selector", "az in (")
    page.press("#selector", "Enter")
    page.wait_for_selector("#selector-error")
    assert "selector" in page.inner_text("#selector-error").lower() or page.inner_text("#selector-error")
    assert page.get_attribute("#selector", "aria-invalid") == "true"


def test_an_agents_change_and_another_managers_overcommit_show_within_2s(fleet: Fleet, page: Any,
                                                                          tmp_path: Path) -> None:
    login(page, fleet, fleet.tokens["viewer"])
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_selector("#live-status:has-text('on')")
    cell = "tr[data-host='compute-02'] .res[data-resource='cpu']"
    before = page.get_attribute(cell, "data-allocation")

    # The agent of compute-02 sees one domain fewer (its node file changed).
    text = (FLEET / "compute-02.xml").read_text()
    first = text.index("<domain ")
    end = text.index("</domain>", first) + len("</domain>")
    node = tmp_path / "compute-02.xml"
    node.write_text(text[:first] + text[end:])
    agent_once(fleet.store_url, node, "compute-02")
    t0 = time.monotonic()
    expected = _get(fleet, "compute-02").status.allocation
    page.wait_for_function(f"document.querySelector(\"{cell}\").dataset.allocation === '{expected['cpu']}'",
                           timeout=2000)
    assert page.get_attribute(cell, "data-allocation") != before
    assert time.monotonic() - t0 < 2.0

    # Another manager sets an overcommit ratio with the CLI.
    hvfleet("overcommit", "set", "compute-03", "cpu=4", "--manager", "someone-else",
            "--store", fleet.store_url)
    t0 = time.monotonic()
    eff = json.loads(hvfleet("capacity", "-o", "json", "-l", "az=az2", "--store", fleet.store_url).stdout)
    want = next(h for h in eff["hosts"] if h["name"] == "compute-03")["effective"]["cpu"]
    page.wait_for_function(
        f"document.querySelector(\"tr[data-host='compute-03'] .res[data-resource='cpu']\").dataset.effective"
        f" === '{want}'", timeout=2000)
    assert time.monotonic() - t0 < 2.5  # includes the CLI run above
    assert "×4" in page.inner_text("tr[data-host='compute-03'] .res[data-resource='cpu']")


def test_host_page_shows_owners_cells_conditions_and_follows_the_watch(fleet: Fleet, page: Any,
                                                                        tmp_path: Path) -> None:
    hvfleet("overcommit", "set", "bigmem-01", "memory=1.5", "--manager", "capacity-planner",
            "--store", fleet.store_url)
    login(page, fleet, fleet.tokens["viewer"], "/hosts/bigmem-01")
    page.wait_for_selector("body[data-ready='1']")
    assert page.inner_text("h1") == "Hypervisor bigmem-01"
    spec = page.inner_text("table.spec")
    assert "spec.overcommit.memory" in spec and "capacity-planner" in spec
    h = _get(fleet, "bigmem-01")
    assert len(h.status.cells) > 0
    assert page.locator("text=cell 0 cpu").count() >= 1
    for c in h.status.conditions:
        assert c.type in page.inner_text("#live")
    for i in h.status.instances:
        assert i.uuid in page.inner_text("#live")
    # A new agent report of this host shows on the open page, without a reload.
    text = (FLEET / "bigmem-01.xml").read_text()
    first = text.index("<domain ")
    end = text.index("</domain>", first) + len("</domain>")
    node = tmp_path / "bigmem-01.xml"
    node.write_text(text[:first] + text[end:])
    agent_once(fleet.store_url, node, "bigmem-01")
    page.wait_for_selector("table.recent:has-text('agent/bigmem-01')", timeout=2000)


def test_viewer_sees_no_actions_and_the_server_refuses_them(fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["viewer"], "/hosts/gpu-01")
    assert page.locator("section.actions").count() == 0
    assert page.locator("form[action$='/actions']").count() == 0
    csrf = page.get_attribute("form.logout input[name=csrf]", "value")
    before = _get(fleet, "gpu-01").metadata.resource_version
    r = page.request.post(f"{fleet.url}/hosts/gpu-01/actions", headers={"Origin": fleet.url},
                          form={"csrf": csrf, "action": "overcommit-set", "resource": "cpu", "ratio": "2"})
    assert r.status == 403
    assert _get(fleet, "gpu-01").metadata.resource_version == before


def test_operator_sees_actions_a_conflict_names_the_owner_and_force_takes_over(fleet: Fleet,
                                                                               page: Any) -> None:
    hvfleet("overcommit", "set", "edge-01", "cpu=2", "--manager", "ops2", "--store", fleet.store_url)
    login(page, fleet, fleet.tokens["ops"], "/hosts/edge-01")
    assert page.locator("section.actions form").count() >= 3
    page.fill("#ocs-resource", "cpu")
    page.fill("#ocs-ratio", "3")
    page.click("form.action:has(#ocs-ratio) button[type=submit]")
    page.wait_for_selector("section.conflict")
    assert "spec.overcommit.cpu is owned by ops2" in page.inner_text("section.conflict")
    h = _get(fleet, "edge-01")
    assert h.spec.overcommit["cpu"] == 2.0  # nothing written yet
    page.click("section.conflict button")
    page.wait_for_selector("p.notice")
    h = _get(fleet, "edge-01")
    assert h.spec.overcommit["cpu"] == 3.0
    assert owners(h)[("spec", "overcommit", "cpu")] == "ops"
    # Unset and maintenance by the same operator.
    page.fill("#ocu-resource", "cpu")
    page.click("form.action:has(#ocu-resource) button[type=submit]")
    page.wait_for_selector("p.notice:has-text('unset')")
    assert "cpu" not in _get(fleet, "edge-01").spec.overcommit
    page.select_option("#mt-mode", "manual")
    page.fill("#mt-reason", "disk swap")
    page.click("form.action:has(#mt-mode) button[type=submit]")
    page.click("section.confirm button")  # maintenance asks first (test_flows.py)
    page.wait_for_selector("p.notice:has-text('maintenance')")
    assert _get(fleet, "edge-01").spec.maintenance == "manual"
    # A notice is the server's own, carried signed: one in a link anyone can
    # write is not shown (it showed any text as this server's success words).
    page.goto(fleet.url + "/hosts/edge-01?notice=Your+token+was+revoked.+Log+in+at+evil.example")
    assert page.locator("p.notice").count() == 0 and "evil.example" not in page.content()
    page.goto(fleet.url + "/?selector=role%3Dedge")
    page.wait_for_selector("tr[data-host='edge-01'] .state:has-text('Maintenance')")


def test_bad_form_input_gives_a_message_by_the_field_and_writes_nothing(fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["ops"], "/hosts/lab-01")
    before = _get(fleet, "lab-01").metadata.resource_version
    page.fill("#ocs-resource", "cpu")
    page.fill("#ocs-ratio", "lots")
    page.click("form.action:has(#ocs-ratio) button[type=submit]")
    page.wait_for_selector("#ocs-ratio-error")
    assert "'lots' is not a number" in page.inner_text("#ocs-ratio-error")
    assert page.get_attribute("#ocs-ratio", "aria-invalid") == "true"
    assert page.get_attribute("#ocs-ratio", "value") == "lots"  # what was typed is kept
    page.fill("#ocs-resource", "not a resource")
    page.fill("#ocs-ratio", "2")
    page.click("form.action:has(#ocs-ratio) button[type=submit]")
    page.wait_for_selector("#ocs-resource-error")
    page.fill("#ocs-resource", "cpu")
    page.fill("#ocs-ratio", "-1")
    page.click("form.action:has(#ocs-ratio) button[type=submit]")
    assert "greater than 0" in page.inner_text("#ocs-ratio-error")
    page.select_option("#mt-mode", "manual")
    page.click("form.action:has(#mt-mode) button[type=submit]")
    assert "required" in page.inner_text("#mt-reason-error")
    assert _get(fleet, "lab-01").metadata.resource_version == before

    page.goto(fleet.url + "/fit?go=1&cpu=2&memory=lots")
    assert "memory" in page.inner_text("#memory-error")
    page.goto(fleet.url + "/fit?go=1&cpu=2&resources=VGPU")
    assert "RESOURCE=QUANTITY" in page.inner_text("#resources-error")
    page.goto(fleet.url + "/fit?go=1&cpu=2&selector=az+in+%28")
    assert "cannot parse" in page.inner_text("#selector-error")
    # Digits str.isdigit takes and int() refuses ('²', 5000 of them) were a 500.
    for count in ("%C2%B2", "9" * 5000, "%D9%A3"):
        answer = page.goto(fleet.url + f"/fit?go=1&cpu=2&count={count}")
        assert answer is not None and answer.status == 422
        assert "whole number" in page.inner_text("#count-error")
    answer = page.goto(fleet.url + "/guests?go=1&os=rhel9.1&name=vm&memory=1Gi&selector=az%3Daz1"
                                   "&vcpus=%C2%B2")
    assert answer is not None and answer.status == 422
    assert "whole number" in page.inner_text("#g-vcpus-error")
    page.goto(fleet.url + "/guests")
    page.fill("#c-selector", "az=az1")
    page.fill("#c-domain", "<domain><name>broken")
    page.click("#check-form button[type=submit]")
    assert page.locator("p.error[role=alert], #c-domain-error").count() >= 1
    assert page.locator("#check-verdict").count() == 0


def test_writes_need_the_sessions_csrf_token_and_this_origin(fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["ops"], "/hosts/lab-01")
    csrf = page.get_attribute("form.action input[name=csrf]", "value")
    before = _get(fleet, "lab-01").metadata.resource_version
    url = f"{fleet.url}/hosts/lab-01/actions"
    body = {"action": "overcommit-set", "resource": "cpu", "ratio": "2"}
    assert page.request.post(url, headers={"Origin": fleet.url}, form=body).status == 403
    wrong = {**body, "csrf": "0" * 64}
    assert page.request.post(url, headers={"Origin": fleet.url}, form=wrong).status == 403
    assert page.request.post(url, headers={"Origin": "https://evil.example"},
                             form={**body, "csrf": csrf}).status == 403
    assert _get(fleet, "lab-01").metadata.resource_version == before
    r = page.request.post(url, headers={"Origin": fleet.url}, form={**body, "csrf": csrf}, max_redirects=0)
    assert r.status == 303
    assert _get(fleet, "lab-01").spec.overcommit["cpu"] == 2.0
    hvfleet("overcommit", "unset", "lab-01", "cpu", "--manager", "ops", "--store", fleet.store_url)


def test_fit_form_answers_as_hvfleet_fit_why(fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["viewer"], "/fit?go=1&cpu=1")
    assert "role viewer reads and watches only" in page.inner_text("main")  # the role table's answer
    login(page, fleet, fleet.tokens["ops"], "/fit")
    page.fill("#cpu", "8")
    page.fill("#memory", "64Gi")
    page.select_option("#weigher", "spread")
    page.click("form.fit button[type=submit]")
    page.wait_for_selector("#fit-summary")
    cli = json.loads(hvfleet("fit", "--cpu", "8", "--memory", "64Gi", "--weigher", "spread", "--why",
                             "-o", "json", "--store", fleet.store_url).stdout)
    names = page.locator("table.candidates tbody tr td:nth-child(2)").all_inner_texts()
    assert names == [c["name"] for c in cli["candidates"]]
    rejected = dict(zip(page.locator("table.rejected tbody td:nth-child(1)").all_inner_texts(),
                        page.locator("table.rejected tbody td:nth-child(2)").all_inner_texts(), strict=True))
    # A heartbeat's age moves between the page's answer and the CLI's ("218s ago"
    # then "224s ago" on a loaded machine): compared without the seconds.
    def aged(text: str) -> str:
        return re.sub(r"\d+s ago", "Ns ago", text)
    assert {n: aged(m) for n, m in rejected.items()} == {
        n: aged("; ".join(r["message"] for r in found)) for n, found in cli["rejected"].items()}
    assert rejected, "some host must not fit 8 cpu + 64Gi (lab-01, edge-01)"


def test_pages_run_under_their_content_security_policy(fleet: Fleet, browser: Any) -> None:
    """Without the tests' CSP bypass: every page's scripts run, none is refused."""
    ctx = browser.new_context(ignore_https_errors=True)
    try:
        page = ctx.new_page()
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        login(page, fleet, fleet.tokens["ops"])
        page.wait_for_selector("body[data-ready='1']")
        page.wait_for_selector("#heat canvas")
        r = page.request.get(fleet.url + "/")
        assert "script-src 'self'" in r.headers["content-security-policy"]
        for path in ("/hosts/compute-01", "/fit?go=1&cpu=1", "/guests"):
            page.goto(fleet.url + path)
            page.wait_for_load_state("networkidle")
        assert problems == []
    finally:
        ctx.close()


GROUPS = Path(__file__).resolve().parents[2] / "examples" / "hosts" / "groups"


def _group_in_store(fleet: Fleet, group: str) -> list[str]:
    from hvfleet.discovery.capabilities import parse_host_capabilities
    from hvfleet.store.ownership import agent_manager

    names = []
    with open_store(fleet.store_url) as s:
        for f in sorted((GROUPS / group).glob("*.caps.xml")):
            name = f.name.removesuffix(".caps.xml")
            caps = parse_host_capabilities(f.read_text(), (f.parent / f"{name}.domcaps.xml").read_text())
            hv = Hypervisor.model_validate({"metadata": {"name": name, "labels": {"group": group}},
                                            "status": {"hostCapabilities": caps.to_dict()}})
            s.create(hv, agent_manager(name))
            names.append(name)
    return names


def test_guest_generate_download_and_check_answer_as_the_cli(fleet: Fleet, page: Any,
                                                              tmp_path: Path) -> None:
    names = _group_in_store(fleet, "intel-mixed")
    login(page, fleet, fleet.tokens["viewer"], "/guests")
    page.fill("#g-selector", "group=intel-mixed")
    page.fill("#g-os", "rhel9.1")
    page.fill("#g-name", "s")
    page.fill("#g-vcpus", "2")
    page.fill("#g-memory", "2Gi")
    page.click("form.guests button[type=submit]")
    page.wait_for_selector("#xml")
    cli = hvfleet("guest", "generate", "--os", "rhel9.1", "--name", "s", "--vcpus", "2", "--memory", "2Gi",
                  "--hosts", "group=intel-mixed", "--explain", "--store", fleet.store_url)
    assert page.inner_text("#xml") + "\n" == cli.stdout or page.inner_text("#xml") == cli.stdout
    assert page.locator("#xml").text_content() == cli.stdout  # byte for byte
    assert page.locator("#explain").text_content() == cli.stderr  # every decision and why
    with page.expect_download() as got:
        page.click("#download")
    assert Path(got.value.path()).read_text() == cli.stdout
    assert got.value.suggested_filename == "s.xml"

    domain = tmp_path / "s.xml"
    domain.write_text(cli.stdout)
    page.fill("#c-selector", "group=intel-mixed")
    page.set_input_files("#c-file", str(domain))
    page.wait_for_function("document.getElementById('c-domain').value.length > 100")
    page.click("#check-form button[type=submit]")
    page.wait_for_selector("#check-verdict")
    assert "runs on every host" in page.inner_text("#check-verdict")
    shown = page.locator("table.verdicts tbody td:nth-child(1)").all_inner_texts()
    checked = hvfleet("guest", "check", str(domain), "--hosts", "group=intel-mixed", "--store",
                      fleet.store_url)
    assert sorted(shown) == sorted(names) == sorted(
        line.split(":")[0] for line in checked.stdout.splitlines() if line.endswith(": ok"))

    # Bad input: a message by the field, from the same core as the CLI.
    page.goto(fleet.url + "/guests?go=1&selector=group%3Dintel-mixed&os=no-such-os&name=s&vcpus=2&memory=2Gi")
    assert "no-such-os" in page.inner_text("#g-os-error")
    page.goto(fleet.url + "/guests?go=1&selector=group%3Dnothing&os=rhel9.1&name=s&vcpus=2&memory=2Gi")
    assert "no hypervisor matches" in page.inner_text("#g-selector-error")
    page.goto(fleet.url + "/guests?go=1&selector=group%3Dintel-mixed&os=rhel9.1&name=s&vcpus=two&memory=2Gi")
    assert "whole number" in page.inner_text("#g-vcpus-error")
    with open_store(fleet.store_url) as s:
        for n in names:
            s.delete("Hypervisor", n)


def test_axe_finds_no_violations(fleet: Fleet, page: Any, axe_js: str) -> None:
    login(page, fleet, fleet.tokens["ops"])
    found: dict[str, list[str]] = {}
    for path in ("/", "/hosts/compute-01", "/fit?go=1&cpu=4&memory=8Gi", "/guests", "/login",
                 "/hosts/lab-01/actions"):
        if path.endswith("/actions"):  # a form answered with a field error
            page.goto(fleet.url + "/hosts/lab-01")
            page.fill("#ocs-ratio", "x")
            page.click("form.action:has(#ocs-ratio) button[type=submit]")
            page.wait_for_selector("#ocs-ratio-error")
        else:
            page.goto(fleet.url + path)
        page.wait_for_load_state("networkidle")
        page.add_script_tag(content=axe_js)
        result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
        bad = [f"{v['id']} ({v['impact']}): {v['help']} — {[n['target'] for n in v['nodes']][:3]}"
               for v in result["violations"]]
        if bad:
            found[path] = bad
    assert found == {}


def test_stale_host_highlighted_pagination_and_heat_map_by_keyboard(fleet: Fleet, page: Any) -> None:
    from datetime import UTC, datetime, timedelta

    from hvfleet.store.ownership import agent_manager

    old = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    with open_store(fleet.store_url) as s:
        s.create(Hypervisor.model_validate({
            "metadata": {"name": "aaa-stale", "labels": {"az": "az9"}},
            "status": {"capacity": {"cpu": 4, "memory": "8Gi"}, "allocation": {"cpu": 1},
                       "conditions": [{"type": "Ready", "status": "True"}], "lastHeartbeatTime": old}}),
            agent_manager("aaa-stale"))
    try:
        login(page, fleet, fleet.tokens["viewer"], "/?perPage=3")
        page.wait_for_selector("tr[data-host='aaa-stale']")
        row = page.locator("tr[data-host='aaa-stale']")
        assert row.locator(".state").inner_text() == "Stale"  # the word, not only a colour
        assert "older than 180s" in (row.locator(".state").get_attribute("title") or "")
        assert "row-Stale" in (row.get_attribute("class") or "")
        assert page.locator("table.hosts tbody tr").count() == 3
        first = page.locator("table.hosts tbody tr").first.get_attribute("data-host")
        page.click("#pager button:has-text('Next page')")
        page.wait_for_function(f"document.querySelector('table.hosts tbody tr').dataset.host !== '{first}'")
        assert "Page 2 of" in page.inner_text("#pager")

        page.wait_for_selector("#heat canvas")
        page.focus("#heat-0")
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowLeft")
        assert "aaa-stale (Stale): cpu 25.0% of effective capacity in use" in page.inner_text("#heat-cell")
        page.keyboard.press("Enter")
        page.wait_for_url(re.compile(r".*/hosts/aaa-stale$"))
    finally:
        with open_store(fleet.store_url) as s:
            s.delete("Hypervisor", "aaa-stale")


def test_reserve_form_claims_space_and_shows_phase_and_expiry(fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["ops"], "/hosts/gpu-01")
    assert page.locator("#rs-cpu").count() == 0  # operators do not create reservations (role table)
    login(page, fleet, fleet.tokens["admin"], "/hosts/gpu-01")
    page.fill("#rs-cpu", "lots")
    page.fill("#rs-consumer", "7b0c1d1e-0000-4000-8000-000000000001")
    page.click("form.action:has(#rs-cpu) button[type=submit]")
    assert "lots" in page.inner_text("#rs-cpu-error")
    with open_store(fleet.store_url) as s:
        assert s.list_reservations() == []
    page.fill("#rs-cpu", "2")
    page.fill("#rs-memory", "4Gi")
    page.fill("#rs-consumer", "7b0c1d1e-0000-4000-8000-000000000001")
    page.fill("#rs-ttl", "1h")
    page.click("form.action:has(#rs-cpu) button[type=submit]")
    page.wait_for_selector("p.notice:has-text('Active')")
    with open_store(fleet.store_url) as s:
        [r] = s.list_reservations()
    # The host's live section follows the watch: it shows the claim moments later.
    page.wait_for_selector(f"#live:has-text('{r.name}')", timeout=5000)
    live = page.inner_text("#live")
    assert r.name in live and "Active" in live and r.spec.expires_at is not None
    assert r.spec.expires_at.isoformat() in live
    cell = page.locator(".bars .res").first.inner_text()
    assert "+ 2 held" in cell  # held by the reservation, shown in the host's bar
    # Too much: the claim does not fit; the message says why and nothing is written.
    page.fill("#rs-cpu", "100000")
    page.fill("#rs-consumer", "7b0c1d1e-0000-4000-8000-000000000002")
    page.click("form.action:has(#rs-cpu) button[type=submit]")
    assert "does not fit on gpu-01" in page.inner_text("main")
    with open_store(fleet.store_url) as s:
        assert [x.name for x in s.list_reservations()] == [r.name]
        s.delete("Reservation", r.name)


def test_an_overcommit_policy_moves_the_overview_as_capacity_json(fleet: Fleet, page: Any) -> None:
    from hvfleet.model.hypervisor import OvercommitPolicy

    login(page, fleet, fleet.tokens["viewer"], "/?selector=role%3Dgpu")
    page.wait_for_selector("tr[data-host='gpu-01']")
    policy = OvercommitPolicy.model_validate({
        "metadata": {"name": "gpu-cpu"},
        "spec": {"selector": {"matchLabels": {"role": "gpu"}}, "overcommit": {"cpu": 3}}})
    with open_store(fleet.store_url) as s:
        s.create(policy, "capacity-planner")
    try:
        cli = json.loads(hvfleet("capacity", "-o", "json", "-l", "role=gpu", "--store",
                                 fleet.store_url).stdout)
        want = cli["hosts"][0]["effective"]["cpu"]
        page.wait_for_function(
            "document.querySelector(\"tr[data-host='gpu-01'] .res[data-resource='cpu']\").dataset.effective"
            f" === '{want}'", timeout=2000)
        assert _overview_figures(page)["gpu-01"]["cpu"]["free"] == cli["hosts"][0]["free"]["cpu"]
    finally:
        with open_store(fleet.store_url) as s:
            s.delete("OvercommitPolicy", "gpu-cpu")
