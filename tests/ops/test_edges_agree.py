"""Every edge gives the same answer for the same store and the same request
(issue 17, "Done when"): the CLI on the store (`--store sqlite:///…`), the
CLI over https:// against a real `hvfleet serve`, the API's JSON and the
dashboard's pages, for fit (hosts, order, quantities), CPU baseline, guest
generate and guest check, over random fleets and requests (hypothesis).

One `hvfleet serve` (a real process, TLS with its own CA) over one SQLite
store per module. Each example writes its own hosts, labelled `run=N`, and
every request selects `run=N`, so examples never see each other's hosts.
The CLI runs in this process through its real entry point (`cli.main.main`:
options, error table, exit code); one test runs the `hvfleet` process itself
for the exit code of a fit that finds nothing.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from lxml import html as lxml_html

from hvfleet.cli.main import main as cli_main
from hvfleet.discovery.capabilities import parse_host_capabilities
from hvfleet.model import Condition, Hypervisor, Quantity
from hvfleet.model.hostcaps import HostCapabilities
from hvfleet.model.resources import ResourceName
from hvfleet.ops.quantities import readable
from hvfleet.store import Store, open_store
from tests.dashboard.fleet import HVFLEET, Fleet, serving

REPO = Path(__file__).resolve().parents[2]
GROUPS = REPO / "examples" / "hosts" / "groups"
CAPS = {f"{g}/{p.name.removesuffix('.caps.xml')}": p
        for g in ("intel-same", "intel-mixed", "amd-mixed", "single")
        for p in sorted((GROUPS / g).glob("*.caps.xml"))}
API = "/apis/hvfleet.io/v1"
RUNS = itertools.count(1)
ERRORS = '//*[contains(concat(" ", normalize-space(@class), " "), " error ")]'


@dataclass
class Edges:
    fleet: Fleet
    store: Store
    token: str
    ca: Path
    web: requests.Session
    http: requests.Session
    caps: dict[str, HostCapabilities]

    def api(self, path: str, body: dict[str, Any]) -> requests.Response:
        return self.http.post(self.fleet.url + API + path, json=body, timeout=60)

    def cli(self, *args: str, remote: bool = False) -> tuple[int, str, str]:
        """`hvfleet ARGS` through the CLI's entry point in this process, on the
        store itself or over https:// with the admin token."""
        where = (["--store", self.fleet.url, "--token", self.token, "--ca", str(self.ca)] if remote
                 else ["--store", self.fleet.store_url])
        out, err = io.StringIO(), io.StringIO()
        saved = dict(os.environ)
        code = 0
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli_main([*args, *where])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            finally:
                os.environ.clear()
                os.environ.update(saved)  # --token/--ca export themselves
        return code, out.getvalue(), err.getvalue()

    def page(self, path: str, **params: str) -> lxml_html.HtmlElement:
        r = self.web.get(self.fleet.url + path, params=params, timeout=60)
        assert r.status_code in (200, 422), r.text[:500]
        return lxml_html.fromstring(r.text)


@pytest.fixture(scope="module")
def edges(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edges]:
    tmp = tmp_path_factory.mktemp("edges")
    store_url = f"sqlite:///{tmp}/hvfleet.db"
    with open_store(store_url):
        pass
    with serving(tmp, store_url) as fleet, open_store(store_url) as store:
        token = fleet.token("admin", "admin")
        ca = tmp / "data" / "tls" / "ca.crt"
        web, http = fleet.http(), fleet.http(token)
        web.verify = http.verify = str(ca)
        r = web.post(fleet.url + "/login", data={"token": token, "next": "/"},
                     headers={"Origin": fleet.url}, timeout=60)
        assert r.status_code == 200 and "hvfleet_session" in web.cookies, r.text[:300]
        caps = {k: parse_host_capabilities(p.read_text(),
                                           p.with_name(p.name.replace(".caps.", ".domcaps.")).read_text())
                for k, p in CAPS.items()}
        yield Edges(fleet, store, token, ca, web, http, caps)


# -- random fleets ---------------------------------------------------------------------------

GiB = 2**30
hosts_st = st.lists(
    st.fixed_dictionaries({
        "cpu": st.integers(1, 128),
        "memory": st.integers(1, 512 * 4).map(lambda n: n * GiB // 4 + st_noise(n)),
        "cpu_used": st.integers(0, 64),
        "memory_used": st.integers(0, 256 * GiB),
        "role": st.sampled_from(["a", "b"]),
        "ratio": st.sampled_from([None, 1.0, 2.0, 4.0]),
        "caps": st.sampled_from(sorted(CAPS)),
        "vgpu": st.sampled_from([0, 0, 2, 4]),
    }),
    min_size=1, max_size=6)


def st_noise(n: int) -> int:
    # Some hosts report memory that is no whole number of KiB or MiB.
    return (n * 7919) % 3 * 1536 + (n % 5 == 0) * 333


def write_fleet(e: Edges, hosts: list[dict[str, Any]]) -> str:
    """The hosts as their agents report them, labelled run=N; returns N."""
    run = str(next(RUNS))
    for i, h in enumerate(hosts):
        name = f"r{run}-h{i}"
        spec: dict[str, Any] = {"overcommit": {"cpu": h["ratio"]}} if h["ratio"] else {}
        if h["vgpu"]:
            spec["extraCapacity"] = {"VGPU": str(h["vgpu"])}
        e.store.create(Hypervisor.model_validate({
            "metadata": {"name": name, "labels": {"run": run, "role": h["role"]}}, "spec": spec}),
            "operator")

        def observed(old: Hypervisor, h: dict[str, Any] = h) -> Hypervisor:
            status = old.status.model_copy(update={
                "capacity": {ResourceName("cpu"): Quantity(h["cpu"]),
                             ResourceName("memory"): Quantity(h["memory"], "binary")},
                "allocation": {ResourceName("cpu"): Quantity(min(h["cpu_used"], h["cpu"])),
                               ResourceName("memory"): Quantity(min(h["memory_used"], h["memory"]),
                                                                "binary")},
                "conditions": [Condition(type="Ready", status="True")],
                "last_heartbeat_time": datetime.now(UTC),
                "host_capabilities": e.caps[h["caps"]],
                "observed_generation": old.metadata.generation})
            return old.model_copy(update={"status": status})

        e.store.update_hypervisor(name, observed, f"agent/{name}")
        e.store.keepalive(name, 600)
    return run


requests_st = st.fixed_dictionaries({
    "cpu": st.sampled_from([None, "1", "2", "8", "64"]),
    "memory": st.sampled_from([None, "512Mi", "4Gi", "8Gi", "100Gi", "3000000000"]),
    "vgpu": st.sampled_from([None, "1", "2"]),
    "count": st.integers(1, 3),
    "role": st.sampled_from([None, "a", "b"]),
    "weigher": st.sampled_from(["binpack", "spread"]),
    "limit": st.sampled_from([None, 1, 3]),
}).filter(lambda r: r["cpu"] or r["memory"] or r["vgpu"])


def selector(run: str, role: str | None) -> str:
    return f"run={run}" + (f",role={role}" if role else "")


# -- fit -------------------------------------------------------------------------------------

def _cli_fit_args(req: dict[str, Any], sel: str) -> list[str]:
    args = ["fit", "-o", "json", "--why", "-l", sel, "--count", str(req["count"]),
            "--weigher", req["weigher"]]
    for flag, key in (("--cpu", "cpu"), ("--memory", "memory")):
        if req[key]:
            args += [flag, req[key]]
    if req["vgpu"]:
        args += ["--resource", f"VGPU={req['vgpu']}"]
    if req["limit"]:
        args += ["--limit", str(req["limit"])]
    return args


def _api_fit_body(req: dict[str, Any], sel: str) -> dict[str, Any]:
    resources = {k: req[k] for k in ("cpu", "memory") if req[k]}
    if req["vgpu"]:
        resources["VGPU"] = req["vgpu"]
    return {"resources": resources, "count": req["count"], "labelSelector": sel,
            "weigher": req["weigher"], "limit": req["limit"], "why": True}


def _page_fit(e: Edges, req: dict[str, Any], sel: str) -> list[tuple[str, str]]:
    """(host, free) per row of the dashboard's fit page, best first."""
    params = {"go": "1", "count": str(req["count"]), "selector": sel, "weigher": req["weigher"],
              "cpu": req["cpu"] or "", "memory": req["memory"] or "",
              "resources": f"VGPU={req['vgpu']}" if req["vgpu"] else ""}
    doc = e.page("/fit", **params)
    assert not doc.xpath(ERRORS), lxml_html.tostring(doc)[:2000]
    return [(tr[1].text_content(), tr[3].text_content())
            for tr in doc.xpath('//table[@class="candidates"]/tbody/tr')]


@given(hosts=hosts_st, req=requests_st)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
def test_fit_gives_the_same_hosts_order_and_quantities_on_every_edge(
        edges: Edges, hosts: list[dict[str, Any]], req: dict[str, Any]) -> None:
    run = write_fleet(edges, hosts)
    sel = selector(run, req["role"])
    r = edges.api("/fit", _api_fit_body(req, sel))
    assert r.status_code == 200, r.text
    api = r.json()
    assert (api["apiVersion"], api["kind"]) == ("hvfleet.io/v1", "FitResult")

    code, out, err = edges.cli(*_cli_fit_args(req, sel))
    assert json.loads(out) == api, err
    # Nothing fits: the answer still printed, and exit 3 (a scheduler tries elsewhere).
    assert code == (0 if api["candidates"] else 3), err
    assert ("no host fits" in err) == (not api["candidates"])

    code, out, err = edges.cli(*_cli_fit_args(req, sel), remote=True)
    assert json.loads(out) == api, err
    assert code == (0 if api["candidates"] else 3)

    # The page shows the same hosts in the same order, each free amount the
    # human form of the API's exact one.
    expected = [(c["name"], ", ".join(f"{k}={readable(ResourceName(k), Quantity.parse(v))}"
                                      for k, v in c["free"].items()))
                for c in api["candidates"]]
    page = _page_fit(edges, req, sel)  # the page has no limit: every fitting host
    assert page[:len(expected)] == expected
    assert len(page) == api["fitting"]

    # JSON quantities are exact and canonical: bytes in the largest exact binary unit.
    for c in api["candidates"]:
        for k, v in c["free"].items():
            r_name = ResourceName(k)
            assert str(r_name.quantity(Quantity.parse(v))) == v
            if r_name.counts_bytes and Quantity.parse(v).value % 1024 == 0 and Quantity.parse(v) > 0:
                assert v[-2:] in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), v


def test_the_cli_process_exits_3_when_nothing_fits(edges: Edges) -> None:
    run = write_fleet(edges, [{"cpu": 4, "memory": 8 * GiB, "cpu_used": 0, "memory_used": 0, "role": "a",
                               "ratio": None, "caps": "single/icx-solo", "vgpu": 0}])
    out = subprocess.run([HVFLEET, "fit", "--cpu", "64", "-l", f"run={run}", "--store",
                          edges.fleet.store_url], capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, (out.stdout, out.stderr)
    assert out.stderr.strip() == "error: no host fits cpu=64"
    out = subprocess.run([HVFLEET, "fit", "--cpu", "2", "-l", f"run={run}", "--store",
                          edges.fleet.store_url], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("HOST"), out.stderr
    # The table's memory in human form, the same string the page and the JSON's exact form give.
    assert f"r{run}-h0" in out.stdout and "8Gi" in out.stdout


# -- CPU baseline and guests -----------------------------------------------------------------

groups_st = st.lists(st.sampled_from(sorted(CAPS)), min_size=1, max_size=4)


def _group_fleet(e: Edges, caps: list[str]) -> str:
    return write_fleet(e, [{"cpu": 16, "memory": 64 * GiB, "cpu_used": 0, "memory_used": 0, "role": "a",
                            "ratio": None, "caps": c, "vgpu": 0} for c in caps])


@given(caps=groups_st, expand=st.booleans())
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                HealthCheck.too_slow])
def test_cpu_baseline_gives_the_same_document_on_every_edge(edges: Edges, caps: list[str],
                                                             expand: bool) -> None:
    run = _group_fleet(edges, caps)
    r = edges.api("/cpubaseline", {"labelSelector": f"run={run}", "expand": expand})
    if len({c.startswith("amd-") for c in caps}) == 1:
        assert r.status_code == 200, r.text  # one vendor: every example host's CPU is known
    flags = ["--expand"] if expand else []
    for remote in (False, True):
        code, out, err = edges.cli("cpu", "baseline", "--hosts", f"run={run}", "-o", "json", *flags,
                                   remote=remote)
        if r.status_code != 200:
            assert code == 2 and r.json()["reason"] == "Invalid", (r.text, err)
            assert r.json()["message"].split(": ", 1)[-1] in err
            continue
        api = r.json()
        assert api.pop("kind") == "CPUBaseline" and api.pop("apiVersion")
        assert code == 0 and json.loads(out) == api, err


GUEST = {"os": "rhel9.1", "name": "vm1", "vcpus": 2, "memory": "4Gi", "firmware": "efi"}


def _page_guest(e: Edges, sel: str) -> tuple[str | None, str]:
    doc = e.page("/guests", go="1", selector=sel, **{k: str(v) for k, v in GUEST.items()})
    xml = doc.xpath('//*[@id="xml"]')
    errors = " ".join(x.text_content() for x in doc.xpath(ERRORS))
    return (xml[0].text_content() if xml else None), errors


def _page_check(e: Edges, sel: str, domain: str) -> dict[str, Any] | str:
    form = e.page("/guests")
    csrf = form.xpath('//form[@class="check"]//input[@type="hidden"]')[0]
    r = e.web.post(e.fleet.url + "/guests/check", timeout=60, headers={"Origin": e.fleet.url},
                   data={csrf.get("name"): csrf.get("value"), "selector": sel, "domain": domain})
    doc = lxml_html.fromstring(r.text)
    if r.status_code != 200:
        return " ".join(x.text_content() for x in doc.xpath(ERRORS))
    rows = doc.xpath('//table[@class="verdicts"]/tbody/tr')
    return {"ok": "runs on every host" in doc.xpath('//*[@id="check-verdict"]')[0].text_content(),
            "hosts": [{"host": tr[0].text_content(), "ok": tr[1].text_content() == "ok",
                       "problems": [] if tr[2].text_content() == "-" else tr[2].text_content().split("; "),
                       "warnings": [] if tr[3].text_content() == "-" else tr[3].text_content().split("; ")}
                      for tr in rows]}


@given(made_for=groups_st, checked_on=groups_st)
@example(made_for=["intel-same/intel-a1", "intel-same/intel-a2"],
         checked_on=["intel-same/intel-a3", "amd-mixed/rome-1"])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                HealthCheck.too_slow])
def test_guest_generate_and_check_give_the_same_documents_on_every_edge(
        edges: Edges, tmp_path_factory: pytest.TempPathFactory, made_for: list[str],
        checked_on: list[str]) -> None:
    run = _group_fleet(edges, made_for)
    sel = f"run={run}"
    r = edges.api("/guests/generate", {**GUEST, "labelSelector": sel})
    if all(c.startswith("intel-same/") for c in made_for):
        assert r.status_code == 200, r.text  # a group a guest is made for
    args = ["guest", "generate", "--hosts", sel, *itertools.chain.from_iterable(
        (f"--{k}", str(v)) for k, v in GUEST.items())]
    page_xml, page_errors = _page_guest(edges, sel)
    for remote in (False, True):
        code, out, err = edges.cli(*args, remote=remote)
        if r.status_code != 200:
            detail = r.json()["message"].split(": ", 1)[-1]
            assert code == 2 and detail in err, (r.text, err)
            assert page_xml is None and detail in page_errors
            continue
        doc = r.json()
        assert code == 0 and out == doc["xml"], err
        assert [line.removeprefix("warning: ") for line in err.splitlines()] == doc["warnings"]
        assert page_xml == doc["xml"]
    if r.status_code != 200:
        return
    domain = r.json()["xml"]
    run2 = _group_fleet(edges, checked_on)
    sel2 = f"run={run2}"
    path = tmp_path_factory.mktemp("check") / "vm1.xml"
    path.write_text(domain)
    c = edges.api("/guests/check", {"domain": domain, "labelSelector": sel2})
    assert c.status_code == 200, c.text
    check = c.json()
    assert check.pop("kind") == "GuestCheck" and check.pop("apiVersion")
    assert _page_check(edges, sel2, domain) == check
    for remote in (False, True):
        code, out, err = edges.cli("guest", "check", str(path), "--hosts", sel2, remote=remote)
        assert code == (0 if check["ok"] else 3), err
        shown = re.findall(r"^(\S+): (ok|NO)$", out, re.M)
        assert shown == [(h["host"], "ok" if h["ok"] else "NO") for h in check["hosts"]]
        for h in check["hosts"]:
            for p in h["problems"]:
                assert f"  - {p}\n" in out
