"""The dashboard behind the API's guard, over HTTP against the real `hvfleet
serve`: every page and feed answers what the role table lets the caller list
(an agent sees its own host at most), event streams are capped per token and
end with their token, forms are read with a size limit before anyone is
known, query numbers are bounded, and data embedded in a page cannot end its
script element."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import given
from hypothesis import strategies as st

from hvfleet.model.meta import Condition
from hvfleet.model.token import split_token
from hvfleet.server.dashboard.html import script_json
from hvfleet.store import open_store
from hvfleet.store.ownership import agent_manager
from hvfleet.store.tokens import issue_token, revoke_token
from tests.dashboard.fleet import LABELS, Fleet, hvfleet, report_fleet, serving

ALL = sorted(LABELS)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("dashboard-guard")
    store_url = f"sqlite:///{tmp}/hvfleet.db"
    report_fleet(store_url)
    with serving(tmp, store_url) as f:
        f.token("viewer", "viewer")
        f.tokens["agent"] = agent_token(f, "compute-01")
        yield f


def agent_token(fleet: Fleet, host: str) -> str:
    with open_store(fleet.store_url) as s:
        _, text = issue_token(s, "agent", manager="test-setup", now=datetime.now(UTC),
                              ttl=timedelta(hours=2), hypervisor=host)
    return text


def session(fleet: Fleet, token: str) -> requests.Session:
    s = fleet.http()
    s.cookies.set("hvfleet_session", token)
    return s


def initial_json(page_html: str) -> Any:
    m = re.search(r'<script type="application/json" id="initial">(.*?)</script>', page_html, re.S)
    assert m is not None, page_html[:500]
    return json.loads(m[1])


# -- roles -------------------------------------------------------------------------------------------

def test_an_agent_sees_only_its_own_host_on_every_feed_and_page(fleet: Fleet) -> None:
    agent = session(fleet, fleet.tokens["agent"])
    viewer = session(fleet, fleet.tokens["viewer"])
    u = fleet.url

    assert [h["name"] for h in viewer.get(u + "/dashboard/overview.json?perPage=1000").json()["hosts"]] == ALL
    doc = agent.get(u + "/dashboard/overview.json").json()
    assert [h["name"] for h in doc["hosts"]] == ["compute-01"] and doc["count"] == 1
    assert doc["total"]["hosts"] == 1
    assert doc["total"]["resources"]["cpu"]["effective"] == doc["hosts"][0]["resources"]["cpu"]["effective"]
    assert all(sum(g["hosts"] for g in by_value.values()) == 1 for by_value in doc["groups"].values())
    assert "compute-02" not in json.dumps(doc)

    assert agent.get(u + "/dashboard/heat.json").json()["names"] == ["compute-01"]
    assert viewer.get(u + "/dashboard/heat.json").json()["names"] == ALL
    assert initial_json(agent.get(u + "/").text)["count"] == 1

    assert agent.get(u + "/dashboard/history.json?host=compute-01").status_code == 200
    for path in ("/dashboard/history.json?host=compute-02", "/dashboard/history.json",
                 "/dashboard/events?host=compute-02", "/hosts/compute-02"):
        r = agent.get(u + path, timeout=10)
        assert r.status_code == 403, (path, r.status_code, r.text[:200])
        assert "compute-02" not in r.text or path.endswith("compute-02")
    assert viewer.get(u + "/dashboard/history.json?host=compute-02").status_code == 200
    assert viewer.get(u + "/dashboard/history.json").status_code == 200


def _events(s: requests.Session, url: str, out: list[str], started: threading.Event,
            ended: list[float], stop_after: int = 0) -> None:
    with s.get(url, stream=True, timeout=60) as r:
        out.append(f"status {r.status_code}")
        if r.status_code != 200:
            started.set()
            return
        for line in r.iter_lines(decode_unicode=True):
            if line.startswith("event: hello"):
                started.set()
            if line:
                out.append(line)
            if stop_after and sum(x.startswith("data:") for x in out) > stop_after:
                return
    ended.append(time.monotonic())


def test_an_agents_event_stream_names_no_other_host(fleet: Fleet) -> None:
    agent = session(fleet, fleet.tokens["agent"])
    lines: list[str] = []
    started = threading.Event()
    t = threading.Thread(target=_events, args=(agent, fleet.url + "/dashboard/events", lines, started,
                                               [], 1), daemon=True)
    t.start()
    assert started.wait(10)
    for host in ("compute-02", "compute-01"):
        hvfleet("overcommit", "set", host, "memory=1.5", "--manager", "guard-test", "--store",
                fleet.store_url)
        time.sleep(0.5)
    t.join(10)
    changes = [json.loads(x.removeprefix("data:")) for x in lines if x.startswith("data:") and "hosts" in x]
    assert changes and changes[0]["hosts"] == ["compute-01"], lines
    assert not any("compute-02" in x for x in lines), lines
    for host in ("compute-02", "compute-01"):
        hvfleet("overcommit", "unset", host, "memory", "--manager", "guard-test", "--store", fleet.store_url)


# -- streams per token, and their end --------------------------------------------------------------

def test_event_streams_per_token_are_capped_like_api_watches(fleet: Fleet) -> None:
    token = fleet.token("viewer", "many-tabs")
    responses = []
    try:
        for _ in range(16):
            r = session(fleet, token).get(fleet.url + "/dashboard/events", stream=True, timeout=10)
            assert r.status_code == 200
            responses.append(r)
        r = session(fleet, token).get(fleet.url + "/dashboard/events", stream=True, timeout=10)
        assert r.status_code == 429, r.text[:200]
        assert "at most 16" in r.json()["message"]
        # The slots are the API's too: no watch either.
        api = fleet.http(token).get(fleet.url + "/apis/hvfleet.io/v1/hypervisors?watch=true", timeout=10)
        assert api.status_code == 429
        # Another token is not affected.
        other = session(fleet, fleet.tokens["viewer"]).get(fleet.url + "/dashboard/events", stream=True,
                                                          timeout=10)
        assert other.status_code == 200
        other.close()
    finally:
        for r in responses:
            r.close()
    deadline = time.monotonic() + 10
    while True:  # closed streams give their slots back
        r = session(fleet, token).get(fleet.url + "/dashboard/events", stream=True, timeout=10)
        code = r.status_code
        r.close()
        if code == 200:
            break
        assert time.monotonic() < deadline, "closed streams kept their slots"
        time.sleep(0.5)


def test_a_revoked_token_ends_its_event_stream_within_seconds(fleet: Fleet) -> None:
    token = fleet.token("viewer", "revoked-later")
    lines: list[str] = []
    ended: list[float] = []
    started = threading.Event()
    t = threading.Thread(target=_events, args=(session(fleet, token), fleet.url + "/dashboard/events",
                                               lines, started, ended), daemon=True)
    t.start()
    assert started.wait(10)
    with open_store(fleet.store_url) as s:
        revoke_token(s, split_token(token)[0], "test-setup")
    revoked = time.monotonic()
    t.join(15)
    assert ended, f"the stream kept going after the revoke: {lines}"
    assert ended[0] - revoked < 6
    assert "event: ended" in lines and "revoked" in lines[-1], lines


# -- bodies and numbers before and after a login ------------------------------------------------------

def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_huge_login_form_is_refused_without_being_held_in_memory(fleet: Fleet) -> None:
    assert fleet.process is not None
    before = _rss_kib(fleet.process.pid)
    chunk = b"token=" + b"a" * (1024 * 1024 - 6)

    def body() -> Iterator[bytes]:  # chunked: no Content-Length to refuse it by
        for _ in range(96):
            yield chunk

    try:
        r = fleet.http().post(fleet.url + "/login", data=body(), timeout=60,
                              headers={"Content-Type": "application/x-www-form-urlencoded",
                                       "Origin": fleet.url})
        assert r.status_code == 413, r.text[:300]
    except requests.ConnectionError:
        pass  # the server answered and closed before the client finished sending
    assert _rss_kib(fleet.process.pid) - before < 40 * 1024
    assert fleet.http().get(fleet.url + "/healthz", timeout=5).status_code == 200


def test_a_form_sent_after_its_session_ended_is_read_no_further_than_a_login(fleet: Fleet) -> None:
    """A host action POSTed with no session is read to fill the form again
    after the login; it was read as far as the API's 1 MiB, before anyone was
    known. Now as far as a login form (16 KiB): a small one still comes back
    filled in, a larger one is not read (the login, without the fields)."""
    page = f"{fleet.url}/hosts/lab-01"
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Referer": page,
               "Host": fleet.url.split("://", 1)[1]}
    small = fleet.http().post(f"{page}/actions", data="action=maintenance&mode=drain&reason=r",
                              headers=headers, allow_redirects=False, timeout=30)
    assert small.status_code == 303 and "resume%3D1" in small.headers["location"], small.headers
    big = fleet.http().post(f"{page}/actions",
                            data="action=maintenance&mode=drain&reason=r&csrf=" + "x" * (20 * 1024),
                            headers=headers, allow_redirects=False, timeout=30)
    assert big.status_code == 303, big.text[:200]
    assert "resume" not in big.headers["location"] and "lab-01" in big.headers["location"]


def test_overlong_numbers_in_dashboard_queries_are_refused_naming_the_parameter(fleet: Fleet) -> None:
    viewer = session(fleet, fleet.tokens["viewer"])
    for name in ("page", "perPage"):
        r = viewer.get(f"{fleet.url}/dashboard/overview.json?{name}={'9' * 5000}")
        assert r.status_code == 422 and r.json()["field"] == name, r.text[:200]
        assert viewer.get(f"{fleet.url}/?{name}={'9' * 5000}").status_code == 200  # the form says why


# -- embedded data ---------------------------------------------------------------------------------------

def test_markup_in_a_readiness_message_cannot_break_the_overview(fleet: Fleet) -> None:
    message = "<!--<script></script>&amp; </script><b>"
    with open_store(fleet.store_url) as s:
        h = s.get_hypervisor("lab-01")
        cond = Condition(type="Ready", status="False", reason="Test", message=message)
        status = h.status.model_copy(update={"conditions": [cond]})
        s.update(h.model_copy(update={"status": status}), agent_manager("lab-01"))
    viewer = session(fleet, fleet.tokens["viewer"])
    deadline = time.monotonic() + 10
    while message not in viewer.get(fleet.url + "/dashboard/overview.json?perPage=1000").text:
        assert time.monotonic() < deadline, "the dashboard never saw the new message"
        time.sleep(0.3)
    page_html = viewer.get(fleet.url + "/?perPage=1000").text
    m = re.search(r'<script type="application/json" id="initial">(.*?)</script>', page_html, re.S)
    assert m is not None
    embedded = m[1]
    assert not set("<>&") & set(embedded), embedded[:200]
    doc = json.loads(embedded)
    lab = next(x for x in doc["hosts"] if x["name"] == "lab-01")
    assert message in lab["readiness"]["message"]
    # Nothing of the message leaked out of the element: the page goes on intact.
    assert page_html.count("<script") == page_html.count("</script>")
    assert page_html.rstrip().endswith("</html>")


@given(st.recursive(st.none() | st.text() | st.integers(),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                    max_leaves=10))
def test_script_json_never_spells_markup_and_reads_back_the_same(doc: Any) -> None:
    text = script_json(doc)
    assert not set("<>&") & set(text)
    assert json.loads(text) == doc


def test_a_host_at_every_bound_leaves_each_page_small_and_answering(tmp_path: Path) -> None:
    """A host whose status holds the most the model accepts (10**21 of each
    resource, 10**21 one-GiB huge pages: 10**30 bytes), known before the
    server's first history sample: every page, feed and reader answers, and
    the overview is kilobytes (its charts once had 954,000 ticks: 118 MB for
    two hosts)."""
    from tests.scheduling.sched_fleet import host, put_host

    store_url = f"sqlite:///{tmp_path}/hvfleet.db"
    huge = 10**21
    with open_store(store_url) as s:
        put_host(s, host("small", {"cpu": 8, "memory": "16Gi"}, beat=datetime.now(UTC)))
        put_host(s, host("huge", {"cpu": huge, "memory": huge, "disk": huge, "hugepages-1Gi": huge},
                         allocation={"cpu": huge, "memory": huge}, extra={"VGPU": huge},
                         reserved={"memory": huge}, overcommit={"cpu": 1000.0, "memory": 0.001},
                         beat=datetime.now(UTC), labels={"az": "x"}))
    with serving(tmp_path, store_url) as f:
        viewer = session(f, f.token("viewer", "viewer"))
        for path in ("/", "/hosts/huge", "/history", "/dashboard/overview.json?perPage=1000",
                     "/dashboard/heat.json", "/dashboard/history.json", "/dashboard/history.json?host=huge"):
            r = viewer.get(f.url + path, timeout=30)
            assert r.status_code == 200, (path, r.text[:300])
            assert len(r.content) < 100_000, (path, len(r.content))
        assert "huge" in viewer.get(f.url + "/", timeout=30).text
