"""A Hypervisor's scheduling annotations (`scheduling.hvfleet.io/min-unit.*`,
`step-size.*`) and resource names that are a standard resource's Placement
class (`VCPU` for `cpu`): refused where they are written (exit 2, the field
named, nothing written), so no later reader fails. An annotation stored
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


def _poisoned(url: str, name: str, annotations: dict[str, str]) -> None:
    with open_store(url) as s:
        host = s.get_hypervisor(name).to_dict()
    host["metadata"]["annotations"] = annotations
    poison(url, "Hypervisor", name, host)


def test_placement_export_leaves_out_a_host_with_an_annotation_stored_before_the_check(
        run: Run, db_url: str, tmp_path: Path) -> None:
    for name in ("hv1", "hv2"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(MANIFEST.format(name=name, key="a", value="b"))
        assert run("apply", "-f", str(path)).code == 0
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
