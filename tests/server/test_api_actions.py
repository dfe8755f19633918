"""The fleet verbs over HTTP answer exactly what the CLI answers for the same
store (both call the same core functions), and are served warm."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hvfleet.discovery.capabilities import parse_host_capabilities
from hvfleet.guests.cpumap import load_cpu_map
from hvfleet.guests.osinfo import load_os_database
from hvfleet.model.hypervisor import Hypervisor
from hvfleet.store.ownership import agent_manager
from tests.server.conftest import Api
from tests.server.objects import RES, ready_host, reservation, status_of

GV = "/apis/hvfleet.io/v1"
GROUPS = Path(__file__).resolve().parents[2] / "examples" / "hosts" / "groups"


def store_url(api: Api) -> str:
    return api.store.url


def test_fit_answers_as_hvfleet_fit(api: Api, run: Callable[..., Any]) -> None:
    for name, cpu in (("hv1", "8"), ("hv2", "4"), ("hv3", "2")):
        ready_host(api, name, cpu=cpu)
    r = api.client("sched-token").post(f"{GV}/fit", json={"resources": {"cpu": "3", "memory": "1Gi"},
                                                           "why": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["kind"] == "FitResult"
    cli = run("fit", "--cpu", "3", "--memory", "1Gi", "-o", "json", "--why", "--store", store_url(api))
    assert cli.code == 0, cli.err
    expected = json.loads(cli.out)
    assert body == expected  # the one document, apiVersion and kind included
    assert [c["name"] for c in body["candidates"]] == ["hv2", "hv1"]  # binpack: fullest first
    assert "hv3" in body["rejected"]
    # Unknown fields and bad values are refused like any body.
    r = api.client("sched-token").post(f"{GV}/fit", json={"resources": {"cpu": "1"}, "cpus": 2})
    status_of(400, "BadRequest", r.json())
    r = api.client("sched-token").post(f"{GV}/fit", json={"resources": {"cpu": "-1"}})
    status_of(422, "Invalid", r.json())
    r = api.client("sched-token").post(f"{GV}/fit", json={"resources": {"cpu": "2", "VGPU": "x"}})
    status_of(422, "Invalid", r.json())
    assert r.json()["details"]["causes"][0]["field"] == "resources.VGPU"
    # A boolean is no amount, count or limit, and "yes" no flag (stored objects agree).
    for sent, field in (({"resources": {"cpu": True}}, "resources.cpu"), ({"cpu": True}, "cpu"),
                        ({"cpu": "1", "count": True}, "count"), ({"cpu": "1", "limit": True}, "limit"),
                        ({"cpu": "1", "why": "yes"}, "why")):
        r = api.client("sched-token").post(f"{GV}/fit", json=sent)
        status_of(422, "Invalid", r.json())
        assert r.json()["details"]["causes"][0]["field"] == field, sent
    r = api.client("sched-token").post(f"{GV}/fit", json={"cpu": 3, "memory": 1073741824.0})
    assert r.status_code == 200 and r.json()["request"]["resources"] == body["request"]["resources"]


def test_release_gives_space_back(api: Api) -> None:
    ready_host(api, "hv1", cpu="4")
    c = api.client("sched-token")
    assert c.post(RES, json=reservation("r1", "4")).status_code == 201
    status_of(409, "Conflict", c.post(RES, json=reservation("r2", "1", consumer="vm-2")).json())
    r = c.post(f"{GV}/reservations/r1/release")
    assert r.status_code == 200, r.text
    assert r.json()["status"]["phase"] == "Released"
    assert c.post(RES, json=reservation("r2", "1", consumer="vm-2")).status_code == 201
    status_of(404, "NotFound", c.post(f"{GV}/reservations/nope/release").json())


def test_placement_export_answers_as_the_cli(api: Api, run: Callable[..., Any]) -> None:
    ready_host(api, "hv1", cpu="8")
    r = api.client("viewer-token").post(f"{GV}/placement", json={})
    assert r.status_code == 200, r.text
    cli = run("placement", "export", "--store", store_url(api))
    assert cli.code == 0, cli.err
    assert r.json() == json.loads(cli.out)


def group_in_store(api: Api, group: str) -> None:
    for f in sorted((GROUPS / group).glob("*.caps.xml")):
        name = f.name.removesuffix(".caps.xml")
        caps = parse_host_capabilities(f.read_text(), (f.parent / f"{name}.domcaps.xml").read_text())
        hv = Hypervisor.model_validate({"metadata": {"name": name, "labels": {"group": group}},
                                        "status": {"hostCapabilities": caps.to_dict()}})
        api.store.create(hv, agent_manager(name))


def test_cpu_baseline_and_guest_generate_check_answer_as_the_cli(api: Api, run: Callable[..., Any],
                                                                  tmp_path: Path) -> None:
    group_in_store(api, "intel-mixed")
    url = store_url(api)
    c = api.client("viewer-token")
    misses = (load_os_database.cache_info().misses, load_cpu_map.cache_info().misses)

    r = c.post(f"{GV}/cpubaseline", json={"labelSelector": "group=intel-mixed"})
    assert r.status_code == 200, r.text
    cli = run("cpu", "baseline", "--hosts", "group=intel-mixed", "-o", "json", "--store", url)
    assert cli.code == 0, cli.err
    assert {k: r.json()[k] for k in json.loads(cli.out)} == json.loads(cli.out)
    xml = run("cpu", "baseline", "--hosts", "group=intel-mixed", "--store", url).out
    assert r.json()["xml"] == xml

    ask = {"os": "rhel9.1", "name": "s", "vcpus": 2, "memory": "2Gi", "labelSelector": "group=intel-mixed"}
    r = c.post(f"{GV}/guests/generate", json=ask)
    assert r.status_code == 200, r.text
    cli = run("guest", "generate", "--os", "rhel9.1", "--name", "s", "--vcpus", "2", "--memory", "2Gi",
              "--hosts", "group=intel-mixed", "--store", url)
    assert cli.code == 0, cli.err
    assert r.json()["xml"] == cli.out  # same inputs, same bytes

    domain = tmp_path / "s.xml"
    domain.write_text(cli.out)
    r = c.post(f"{GV}/guests/check", json={"domain": cli.out, "labelSelector": "group=intel-mixed"})
    assert r.status_code == 200, r.text
    assert r.json()["ok"] is True
    assert sorted(h["host"] for h in r.json()["hosts"]) == ["clx-1", "icx-1", "skl-1"]
    cli = run("guest", "check", str(domain), "--hosts", "group=intel-mixed", "--store", url)
    assert cli.code == 0 and all(f"{h}: ok" in cli.out for h in ("clx-1", "icx-1", "skl-1"))

    r = c.post(f"{GV}/guests/generate", json={**ask, "os": "no-such-os"})
    status_of(422, "Invalid", r.json())
    r = c.post(f"{GV}/guests/generate", json={**ask, "labelSelector": "group=nothing"})
    status_of(422, "Invalid", r.json())
    # A group that lacks what the guest needs (EFI, on a host whose libvirt does
    # not say): not bad input but not everywhere, 409 as the CLI's exit 3.
    blind = parse_host_capabilities((GROUPS.parent / "real" / "embed-kvm.caps.xml").read_text(), None)
    api.store.create(Hypervisor.model_validate({"metadata": {"name": "blind", "labels": {"group": "blind"}},
                                                "status": {"hostCapabilities": blind.to_dict()}}),
                     agent_manager("blind"))
    r = c.post(f"{GV}/guests/generate", json={**ask, "firmware": "efi", "labelSelector": "group=blind"})
    status_of(409, "Conflict", r.json())
    assert "EFI needed" in r.json()["message"] and "blind" in r.json()["message"]
    cli = run("guest", "generate", "--os", "rhel9.1", "--name", "s", "--vcpus", "2", "--memory", "2Gi",
              "--firmware", "efi", "--hosts", "group=blind", "--store", url)
    assert cli.code == 3 and "EFI needed" in cli.err, (cli.code, cli.err)
    # Warm: the OS database and cpu_map were loaded at start-up, not per request.
    assert (load_os_database.cache_info().misses, load_cpu_map.cache_info().misses) == misses
