"""A Hypervisor's scheduling annotations (`scheduling.hvfleet.io/min-unit.*`,
`step-size.*`), resource names that are a standard resource's Placement
class (`VCPU` for `cpu`) and names Placement can never have as a class
(`FOO`): refused where they are written (exit 2, the field named, nothing
written), so no later reader fails. A name stored before the check is left
out of every Placement view, its host otherwise served. An annotation stored
before the check (put in behind hvfleet's back) takes only its own host out:
`placement export` leaves it out with a warning, `fit` says why, and the
Placement API serves the rest of the fleet with that host disabled."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests

from hvfleet.model.errors import InvalidInput
from hvfleet.model.hypervisor import Hypervisor
from hvfleet.model.units import check_unit_annotations
from hvfleet.store import open_store
from hvfleet.store.sqlite import SqliteStore
from tests.placement.support import Placement, _served_sqlite, _uuid
from tests.store.poison import poison

Run = Callable[..., Any]
CONSUMER = "6f1d2c3a-0000-4000-8000-000000000301"

MANIFEST = """\
apiVersion: hvfleet.io/v1
kind: Hypervisor
metadata:
  name: {name}
  annotations:
    {key}: "{value}"
"""


def _revision(db_url: str) -> int:
    with open_store(db_url) as s:
        return s.revision()


def _hv(annotations: dict[str, str]) -> Hypervisor:
    return Hypervisor.model_validate({"metadata": {"name": "hv", "annotations": annotations}})


@pytest.mark.parametrize(("key", "value"), [
    ("min-unit.cpu", "abc"), ("step-size.cpu", "0"), ("step-size.memory", "-1Gi"),
    ("step-size.cpu", "nan"), ("step-size.cpu", "1e400"), ("min-unit.vgpu", "1"),
    ("step-size.cpu", "0.5"), ("min-unit.memory", "1500Ki"), ("min-unit.disk", "1.5Gi"),
])
def test_a_unit_annotation_that_is_no_whole_placement_unit_is_refused_naming_it(
        run: Run, db_url: str, tmp_path: Path, key: str, value: str) -> None:
    full = f"scheduling.hvfleet.io/{key}"
    with pytest.raises(InvalidInput, match="annotations"):
        check_unit_annotations(_hv({full: value}))
    path = tmp_path / "hv.yaml"
    path.write_text(MANIFEST.format(name="hv1", key=full, value=value))
    before = _revision(db_url)
    r = run("apply", "-f", str(path))
    assert r.code == 2, (r.code, r.err)
    assert full in r.err and "Traceback" not in r.err
    assert _revision(db_url) == before


@pytest.mark.parametrize(("key", "value"), [("min-unit.cpu", "2"), ("step-size.memory", "1Gi"),
                                            ("step-size.memory", "1536Mi"), ("min-unit.VGPU", "1")])
def test_whole_units_are_taken(run: Run, tmp_path: Path, key: str, value: str) -> None:
    check_unit_annotations(_hv({f"scheduling.hvfleet.io/{key}": value}))
    path = tmp_path / "hv.yaml"
    path.write_text(MANIFEST.format(name="hv1", key=f"scheduling.hvfleet.io/{key}", value=value))
    assert run("apply", "-f", str(path)).code == 0


def test_a_standard_placement_class_is_no_resource_name_of_its_own(run: Run, db_url: str,
                                                                    tmp_path: Path) -> None:
    """`VCPU=100` beside `cpu` was a second VCPU inventory: `placement export`
    kept one of the two, and a claim on the other vanished from it."""
    path = tmp_path / "hv.yaml"
    path.write_text(MANIFEST.format(name="hv1", key="a", value="b"))
    assert run("apply", "-f", str(path)).code == 0
    before = _revision(db_url)
    for args in (["extra-capacity", "set", "hv1", "VCPU=100"], ["overcommit", "set", "hv1", "MEMORY_MB=2"],
                 ["reserve", "hv1", "--resource", "DISK_GB=1", "--consumer", CONSUMER]):
        r = run(*args)
        assert r.code == 2, (args, r.code, r.err)
        assert "Placement's class of the resource" in r.err, r.err
    assert _revision(db_url) == before
    r = run("extra-capacity", "set", "hv1", "VGPU=2")
    assert r.code == 0, r.err


def _stored(url: str, name: str, section: str, values: dict[str, Any], replace: bool = False) -> None:
    """Values of a host's `section` (metadata.annotations: "metadata",
    "annotations"; spec: "spec") stored before the write-time check, behind
    hvfleet's back; `replace`: instead of the section's own."""
    with open_store(url) as s:
        host = s.get_hypervisor(name).to_dict()
    *parents, last = section.split(".")
    node = host
    for part in parents:
        node = node.setdefault(part, {})
    if replace:
        node[last] = dict(values)
    else:
        node.setdefault(last, {}).update(values)
    poison(url, "Hypervisor", name, host)


def _poisoned(url: str, name: str, annotations: dict[str, str]) -> None:
    _stored(url, name, "metadata.annotations", annotations, replace=True)


def _two_hosts(run: Run, tmp_path: Path) -> None:
    for name in ("hv1", "hv2"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(MANIFEST.format(name=name, key="a", value="b"))
        assert run("apply", "-f", str(path)).code == 0


def test_placement_export_leaves_out_a_host_with_an_annotation_stored_before_the_check(
        run: Run, db_url: str, tmp_path: Path) -> None:
    _two_hosts(run, tmp_path)
    _poisoned(db_url, "hv1", {"scheduling.hvfleet.io/step-size.cpu": "abc"})
    r = run("placement", "export")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert [p["name"] for p in doc["resource_providers"]] == ["hv2"]
    assert [s["name"] for s in doc["skipped"]] == ["hv1"]
    assert "warning: hypervisor hv1 left out" in r.err and "step-size.cpu" in r.err
    # Its agent's status writes carry the stored annotations: still taken.
    with open_store(db_url) as s:
        host = s.get_hypervisor("hv1")
        s.update(host.model_copy(update={"status": host.status.model_copy(update={
            "last_heartbeat_time": datetime.now(UTC)})}), "agent/hv1")


@pytest.fixture(scope="module")
def api() -> Iterator[Placement]:
    yield from _served_sqlite()


def test_the_placement_api_serves_the_fleet_with_that_host_disabled(api: Placement) -> None:
    """It answered every candidates query 400 and listed no provider at all."""
    assert isinstance(api.store, SqliteStore)
    url = f"sqlite:///{api.store.path}"
    _poisoned(url, "hv2", {"scheduling.hvfleet.io/min-unit.cpu": "abc"})
    hv1, hv2 = _uuid(api.store, "hv1"), _uuid(api.store, "hv2")
    r = api.call("GET", "/allocation_candidates?resources=VCPU:1")
    assert r.status_code == 200, r.text
    assert set(r.json()["provider_summaries"]) == {hv1, hv2}
    r = api.call("GET", "/allocation_candidates?resources=VCPU:1&required=!COMPUTE_STATUS_DISABLED")
    assert set(r.json()["provider_summaries"]) == {hv1}
    listed = api.call("GET", "/resource_providers").json()["resource_providers"]
    assert {p["uuid"] for p in listed} == {hv1, hv2}
    assert "COMPUTE_STATUS_DISABLED" in api.call("GET", f"/resource_providers/{hv2}/traits").json()["traits"]


def test_a_policy_update_naming_a_standard_class_is_refused_too(run: Run, db_url: str,
                                                                tmp_path: Path) -> None:
    """The check ran on the policy as it was stored, not as the update wrote it."""
    policy = ("apiVersion: hvfleet.io/v1\nkind: OvercommitPolicy\nmetadata:\n  name: p\n"
              "spec:\n  overcommit: {{{ratios}}}\n")
    path = tmp_path / "p.yaml"
    path.write_text(policy.format(ratios="cpu: 2"))
    assert run("apply", "-f", str(path)).code == 0
    before = _revision(db_url)
    path.write_text(policy.format(ratios="cpu: 2, VCPU: 3"))
    r = run("apply", "-f", str(path))
    assert r.code == 2 and "Placement's class of the resource 'cpu'" in r.err, r.err
    assert _revision(db_url) == before


@pytest.mark.parametrize("args", [
    ["extra-capacity", "set", "hv1", "FOO=2"], ["reserved", "set", "hv1", "FOO=1"],
    ["overcommit", "set", "hv1", "FOO=2"], ["reserve", "hv1", "--resource", "FOO=1", "--consumer", CONSUMER],
    ["fit", "--resource", "FOO=1"], ["extra-capacity", "set", "hv1", "CUSTOMNIC=1"],
])
def test_a_name_placement_can_never_have_as_a_class_is_refused_where_it_is_written(
        run: Run, db_url: str, tmp_path: Path, args: list[str]) -> None:
    """`FOO` was taken and shown as a Placement inventory class, which
    Placement refuses (`PUT /resource_classes/FOO` is 400)."""
    path = tmp_path / "hv.yaml"
    path.write_text(MANIFEST.format(name="hv1", key="a", value="b"))
    assert run("apply", "-f", str(path)).code == 0
    before = _revision(db_url)
    r = run(*args)
    assert r.code == 2, (r.code, r.err)
    assert "can never be a Placement resource class" in r.err and "CUSTOM_" in r.err, r.err
    assert "Traceback" not in r.err
    assert _revision(db_url) == before


def test_standard_and_custom_placement_classes_are_taken(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "hv.yaml"
    path.write_text(MANIFEST.format(name="hv1", key="a", value="b"))
    assert run("apply", "-f", str(path)).code == 0
    for args in (["extra-capacity", "set", "hv1", "VGPU=2", "PCI_DEVICE=1", "CUSTOM_NIC_VF=4"],
                 ["reserved", "set", "hv1", "CUSTOM_NIC_VF=1"], ["overcommit", "set", "hv1", "NUMA_CORE=2"]):
        r = run(*args)
        assert r.code == 0, (args, r.err)


def test_a_policy_naming_a_name_placement_can_never_have_is_refused(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("apiVersion: hvfleet.io/v1\nkind: OvercommitPolicy\nmetadata:\n  name: p\n"
                    "spec:\n  overcommit: {cpu: 2, FOO: 3}\n")
    r = run("apply", "-f", str(path))
    assert r.code == 2 and "spec.overcommit.FOO" in r.err and "Placement resource class" in r.err, r.err


def _stored_spec(url: str, name: str, **spec: Any) -> None:
    """A spec value stored before the write-time check (behind hvfleet's back)."""
    _stored(url, name, "spec", spec)


def test_a_name_stored_before_the_check_is_left_out_of_placement_and_the_host_stays_writable(
        run: Run, db_url: str, tmp_path: Path) -> None:
    _two_hosts(run, tmp_path)
    _stored_spec(db_url, "hv1", extraCapacity={"FOO": "2", "CUSTOM_NIC_VF": "4"})
    r = run("placement", "export")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert [p["name"] for p in doc["resource_providers"]] == ["hv1", "hv2"]
    assert set(doc["resource_providers"][0]["inventories"]) == {"CUSTOM_NIC_VF"}
    assert doc["omitted"] == [{"name": "hv1", "resource": "FOO", "reason": doc["omitted"][0]["reason"]}]
    assert "warning: hypervisor hv1: FOO can never be a Placement resource class" in r.err, r.err
    # Stored, it stays: another change of the spec is taken, a new such name is not.
    assert run("overcommit", "set", "hv1", "cpu=2").code == 0
    assert run("extra-capacity", "set", "hv1", "CUSTOM_NIC_VF=8").code == 0
    assert run("extra-capacity", "set", "hv1", "BAR=1").code == 2
    with open_store(db_url) as s:
        extra = {str(r): str(q) for r, q in s.get_hypervisor("hv1").spec.extra_capacity.items()}
    assert extra == {"FOO": "2", "CUSTOM_NIC_VF": "8"}


def test_the_placement_api_leaves_a_stored_name_placement_cannot_have_out_and_refuses_a_new_one(
        api: Placement) -> None:
    assert isinstance(api.store, SqliteStore)
    url = f"sqlite:///{api.store.path}"
    _stored_spec(url, "hv1", extraCapacity={"FOO": "2"})
    hv1 = _uuid(api.store, "hv1")
    inv = api.call("GET", f"/resource_providers/{hv1}/inventories").json()["inventories"]
    assert "FOO" not in inv and "VCPU" in inv
    classes = [c["name"] for c in api.call("GET", "/resource_classes").json()["resource_classes"]]
    assert "FOO" not in classes
    r = api.call("GET", "/allocation_candidates?resources=VCPU:1")
    assert r.status_code == 200 and hv1 in r.json()["provider_summaries"]
    # The Kubernetes-shaped API refuses a new one: 422 naming the field.
    patched = requests.patch(
        f"{api.url}/apis/hvfleet.io/v1/hypervisors/hv2", verify=str(api.ca), timeout=30,
        headers={"Authorization": f"Bearer {api.tokens['admin']}",
                 "Content-Type": "application/merge-patch+json"},
        data=json.dumps({"spec": {"extraCapacity": {"FOO": "2"}}}))
    assert patched.status_code == 422, patched.text
    assert "spec.extraCapacity.FOO" in patched.text and "CUSTOM_" in patched.text


def test_values_stored_before_the_checks_leave_edits_of_anything_else_alone(
        run: Run, db_url: str, tmp_path: Path) -> None:
    """Probe 14: a host with a stored `extraCapacity.VCPU` (an alias refused
    since), or a stored `step-size.cpu: 500m`, could not be drained, given
    another ratio or another annotation; a policy with a stored `VCPU` ratio
    could not even be labelled. Each check judges only what a write gives anew."""
    _two_hosts(run, tmp_path)
    _stored_spec(db_url, "hv1", extraCapacity={"VCPU": "2"})
    # Placement's view leaves the alias out, named (it was a second VCPU inventory, silently).
    r = run("placement", "export")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert "VCPU" not in doc["resource_providers"][0]["inventories"]
    assert [(o["name"], o["resource"]) for o in doc["omitted"]] == [("hv1", "VCPU")]
    assert "Placement's class of 'cpu'" in r.err
    assert run("overcommit", "set", "hv1", "memory=2").code == 0
    assert run("reserved", "set", "hv1", "cpu=1").code == 0
    # A new alias beside the stored one is still refused.
    refused = run("overcommit", "set", "hv1", "MEMORY_MB=2")
    assert refused.code == 2 and "MEMORY_MB" in refused.err
    _poisoned(db_url, "hv2", {"scheduling.hvfleet.io/step-size.cpu": "500m"})
    path = tmp_path / "hv2-note.yaml"
    path.write_text(MANIFEST.format(name="hv2", key="scheduling.hvfleet.io/step-size.cpu", value="500m")
                    + '    note: "hi"\n')
    r = run("apply", "-f", str(path))
    assert r.code == 0, r.err
    with open_store(db_url) as s:
        assert s.get_hypervisor("hv2").metadata.annotations["note"] == "hi"
    bad = tmp_path / "hv2-bad.yaml"
    bad.write_text(MANIFEST.format(name="hv2", key="scheduling.hvfleet.io/min-unit.cpu", value="abc"))
    assert run("apply", "-f", str(bad)).code == 2
    policy = {"apiVersion": "hvfleet.io/v1", "kind": "OvercommitPolicy",
              "metadata": {"name": "legacy", "labels": {}},
              "spec": {"selector": {"matchLabels": {"az": "b"}}, "overcommit": {"VCPU": 2}}}
    poison(db_url, "OvercommitPolicy", "legacy", policy)
    policy["metadata"]["labels"] = {"team": "a"}
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy))
    r = run("apply", "-f", str(path))
    assert r.code == 0, r.err


def test_a_restore_refused_for_one_object_names_that_object(run: Run, tmp_path: Path) -> None:
    """Probe 14: `export | apply` into a new store stopped at the first value
    refused since, with a line naming the field but not the object among the
    manifests (`error: spec.reserved.memory: 100M is not a whole number …`)."""
    path = tmp_path / "fleet.yaml"
    second = MANIFEST.format(name="hv2", key="a", value="b") + "spec:\n  reserved:\n    memory: 100M\n"
    path.write_text(MANIFEST.format(name="hv1", key="a", value="b") + "---\n" + second)
    r = run("apply", "-f", str(path))
    assert r.code == 2
    assert r.err.startswith("error: Hypervisor hv2: spec.reserved.memory: 100M is not a whole number"), r.err
