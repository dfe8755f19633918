"""The dashboard's feeds over HTTP against the real `hvfleet serve`: /metrics
gauges equal `hvfleet capacity -o json`, the history (in the store) gains the
host's new figures, the event stream names a changed host, and the feeds need a
session (the API's bearer tokens do not open them; the cookie does not open the API)."""

from __future__ import annotations

import json
import threading
import time
from fractions import Fraction

from prometheus_client.parser import text_string_to_metric_families

from hvfleet.model.quantity import Quantity
from hvfleet.model.readable import human
from tests.dashboard.fleet import Fleet, hvfleet


def _session(fleet: Fleet, name: str) -> object:
    s = fleet.http()
    s.cookies.set("hvfleet_session", fleet.tokens[name])
    return s


def test_metrics_equal_capacity_json_and_need_a_token(fleet: Fleet) -> None:
    assert fleet.http().get(fleet.url + "/metrics").status_code == 401
    r = fleet.http(fleet.tokens["viewer"]).get(fleet.url + "/metrics")
    assert r.status_code == 200, r.text
    got: dict[tuple[str, str, str], float] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            if fam.name in ("hvfleet_effective_capacity", "hvfleet_free_capacity", "hvfleet_allocation"):
                got[(fam.name, s.labels["hypervisor"], s.labels["resource"])] = s.value
    cli = json.loads(hvfleet("capacity", "-o", "json", "--store", fleet.store_url).stdout)
    for h in cli["hosts"]:
        for r, v in h["effective"].items():
            assert got[("hvfleet_effective_capacity", h["name"], r)] == float(Quantity.parse(v).value)
            assert got[("hvfleet_free_capacity", h["name"], r)] == float(Quantity.parse(h["free"][r]).value)
        for r, v in h["allocation"].items():
            assert got[("hvfleet_allocation", h["name"], r)] == float(Fraction(Quantity.parse(v).value))


def test_feeds_need_the_session_and_the_api_ignores_it(fleet: Fleet) -> None:
    anonymous = fleet.http(fleet.tokens["viewer"])  # a bearer token, no cookie
    assert anonymous.get(fleet.url + "/dashboard/overview.json").status_code == 401
    s = _session(fleet, "viewer")
    assert s.get(fleet.url + "/dashboard/overview.json").status_code == 200  # type: ignore[attr-defined]
    assert s.get(fleet.url + "/apis/hvfleet.io/v1/hypervisors").status_code == 401  # type: ignore[attr-defined]
    r = s.get(fleet.url + "/dashboard/overview.json?perPage=0")  # type: ignore[attr-defined]
    assert r.status_code == 422 and r.json()["field"] == "perPage"


def test_event_stream_names_the_changed_host_and_history_keeps_a_sample(fleet: Fleet) -> None:
    s = _session(fleet, "viewer")
    seen: list[str] = []
    seen_at: list[float] = []
    started = threading.Event()

    def listen() -> None:
        with s.get(fleet.url + "/dashboard/events", stream=True, timeout=30) as r:  # type: ignore[attr-defined]
            for line in r.iter_lines(decode_unicode=True):
                if line.startswith("event: hello"):
                    started.set()
                if line.startswith("data:") and "compute-01" in line:
                    seen.append(line)
                    seen_at.append(time.monotonic())
                    return

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    assert started.wait(10)
    hvfleet("overcommit", "set", "compute-01", "memory=1.25", "--manager", "feeds-test", "--store",
            fleet.store_url)
    written = time.monotonic()  # the CLI has returned: its write is in the store
    t.join(5)
    assert seen, "no change event for compute-01"
    assert seen_at[0] - written < 3  # the event follows the write within seconds (the CLI's start-up aside)
    cli = json.loads(hvfleet("capacity", "-o", "json", "--store", fleet.store_url).stdout)
    now = next(h for h in cli["hosts"] if h["name"] == "compute-01")
    deadline = time.monotonic() + 5  # the fixture's server samples every second
    while True:
        doc = s.get(fleet.url + "/dashboard/history.json?series=host:compute-01&range=hour").json()  # type: ignore[attr-defined]
        latest = {r: x["effective"]["text"][-1] for r, x in doc["resources"].items()} if doc["t"] else {}
        if latest.get("memory") == human("memory", Quantity.parse(now["effective"]["memory"])):
            break
        assert time.monotonic() < deadline, doc
        time.sleep(0.2)
    assert doc["resources"]["memory"]["unit"] == "bytes"
    assert doc["resources"]["cpu"]["allocated"]["text"][-1] == now["allocation"]["cpu"]
    hvfleet("overcommit", "unset", "compute-01", "memory", "--manager", "feeds-test", "--store",
            fleet.store_url)
