"""The resource commands as a user types them, against a real SQLite store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hvfleet.model import Quantity
from hvfleet.store import open_store

from .conftest import Run

MANIFEST = """\
apiVersion: hvfleet.io/v1
kind: Hypervisor
metadata:
  name: node-a1
  labels: {az: a}
spec:
  overcommit: {cpu: 4}
  reserved: {memory: 4Gi}
---
apiVersion: hvfleet.io/v1
kind: Hypervisor
metadata:
  name: node-b1
  labels: {az: b}
spec:
  extraCapacity: {VGPU: 2}
"""


@pytest.fixture
def fleet(run: Run, tmp_path: Path, db_url: str) -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(MANIFEST)
    assert run("apply", "-f", str(path)).code == 0
    # Give node-a1 an observed status, written as its agent would.
    with open_store(db_url) as s:
        def observe(h):  # type: ignore[no-untyped-def]
            status = h.status.model_copy(update={
                "capacity": {"cpu": Quantity(16), "memory": Quantity.parse("64Gi")},
                "allocation": {"cpu": Quantity(10), "memory": Quantity.parse("20Gi")},
            })
            return h.model_copy(update={"status": status})
        s.update_hypervisor("node-a1", observe, "agent/node-a1")
    return db_url


def snapshot(db_url: str) -> list[tuple[str, str | None]]:
    with open_store(db_url) as s:
        return [(h.name, h.metadata.resource_version) for h in s.list_hypervisors()]


@pytest.mark.parametrize(("args", "message"), [
    (["overcommit", "set", "node-a1", "gpu=2"], "unknown resource 'gpu'"),
    (["overcommit", "set", "node-a1", "cpu=abc"], "overcommit.cpu: 'abc' is not a number"),
    (["overcommit", "set", "node-a1", "cpu=0"], "overcommit.cpu: 0.0 must be greater than 0"),
    (["overcommit", "set", "node-a1", "cpu=-1"], "overcommit.cpu: -1.0 must be greater than 0"),
    (["overcommit", "set", "node-a1", "cpu=nan"], "overcommit.cpu: nan is not finite"),
    (["overcommit", "set", "node-a1", "cpu=inf"], "overcommit.cpu: inf is not finite"),
    (["overcommit", "set", "node-a1", "cpu"], "expected RESOURCE=VALUE"),
    (["reserved", "set", "node-a1", "memory=4Gb"], "reserved.memory: '4Gb' is not a quantity"),
    (["reserved", "set", "node-a1", "memory=-1Gi"], "must not be negative"),
    (["get", "flavors"], "unknown kind 'flavors'"),
    (["get", "hypervisors", "-l", "az in ("], "selector"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(
    run: Run, fleet: str, args: list[str], message: str
) -> None:
    before = snapshot(fleet)
    r = run(*args)
    assert r.code == 2
    assert message in r.err
    assert r.err.count("\n") == 1
    assert snapshot(fleet) == before


@pytest.mark.parametrize(("doc", "message"), [
    ("apiVersion: v1\nkind: Hypervisor\nmetadata: {name: x}\n", "apiVersion: expected 'hvfleet.io/v1'"),
    ("apiVersion: hvfleet.io/v1\nkind: Flavor\nmetadata: {name: x}\n", "kind: expected one of"),
    ("apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata: {name: x\n", "malformed YAML (line"),
    ("apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata: {name: x}\nspec: {overcommit: {cpu: .nan}}\n",
     "spec.overcommit: overcommit.cpu: nan is not finite"),
    ("apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata: {name: x}\nspec: {reserved: {gpu: 1}}\n",
     "unknown resource 'gpu'"),
    ("apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata: {name: Bad_Name}\n", "metadata.name"),
    ("apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata: {name: x}\nspec: {maintenance: manual}\n",
     "maintenanceReason is required"),
    ("apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata: {name: x}\nspec: {bogus: 1}\n", "spec.bogus"),
    ("- just\n- a list\n", "expected a mapping"),
])
def test_bad_manifests_are_refused_before_any_write(
    run: Run, fleet: str, tmp_path: Path, doc: str, message: str
) -> None:
    # A valid first document must not be written when a later one is bad.
    path = tmp_path / "bad.yaml"
    path.write_text("apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata: {name: new-ok}\n---\n" + doc)
    before = snapshot(fleet)
    r = run("apply", "-f", str(path))
    assert r.code == 2, r.err
    assert message in r.err
    assert r.err.count("\n") == 1
    assert snapshot(fleet) == before


def test_stale_resource_version_in_manifest_is_refused(run: Run, fleet: str, tmp_path: Path) -> None:
    path = tmp_path / "stale.yaml"
    path.write_text("apiVersion: hvfleet.io/v1\nkind: Hypervisor\n"
                    "metadata: {name: node-b1, resourceVersion: '1'}\nspec: {overcommit: {cpu: 3}}\n")
    before = snapshot(fleet)
    r = run("apply", "-f", str(path))
    assert r.code == 4
    assert "resourceVersion 1 is stale" in r.err
    assert snapshot(fleet) == before


def test_ownership_conflict_names_the_owner_and_force_takes_over(run: Run, fleet: str) -> None:
    assert run("overcommit", "set", "node-a1", "cpu=8", "--manager", "cortex").code == 4
    r = run("overcommit", "set", "node-a1", "memory=1.5", "--manager", "cortex")
    assert r.code == 0
    r = run("overcommit", "set", "node-a1", "memory=2")
    assert r.code == 4 and "owned by manager 'cortex'" in r.err
    assert run("overcommit", "set", "node-a1", "memory=2", "--force").code == 0
    doc = json.loads(run("get", "hypervisor", "node-a1", "-o", "json").out)
    assert doc["spec"]["overcommit"] == {"cpu": 4.0, "memory": 2.0}


def test_overcommit_set_reports_effective_capacity(run: Run, fleet: str) -> None:
    r = run("overcommit", "set", "node-a1", "cpu=3", "memory=1.5")
    assert r.code == 0
    # cpu 16 × 3 = 48; memory (64 − 4) Gi × 1.5 = 90 Gi
    assert "cpu=48" in r.out and "memory=90Gi" in r.out
    assert run("overcommit", "unset", "node-a1", "memory").code == 0
    doc = yaml.safe_load(run("get", "hypervisor", "node-a1", "-o", "yaml").out)
    assert doc["spec"]["overcommit"] == {"cpu": 3.0}
    assert run("reserved", "unset", "node-a1", "memory").code == 0
    assert run("extra-capacity", "set", "node-a1", "CUSTOM_NIC_VF=8").code == 0
    doc = yaml.safe_load(run("get", "hypervisor", "node-a1", "-o", "yaml").out)
    assert doc["spec"]["reserved"] == {} and doc["spec"]["extraCapacity"] == {"CUSTOM_NIC_VF": "8"}


def test_get_lists_with_selector_and_formats(run: Run, fleet: str) -> None:
    r = run("get", "hypervisors", "-l", "az=a")
    assert r.code == 0
    assert "node-a1" in r.out and "node-b1" not in r.out
    assert "10/64" in r.out  # cpu allocated / effective (16 × 4)
    doc = json.loads(run("get", "hypervisors", "-o", "json").out)
    assert doc["kind"] == "List" and [i["metadata"]["name"] for i in doc["items"]] == ["node-a1", "node-b1"]
    wide = run("get", "hypervisors", "-o", "wide").out
    assert "cpu=4" in wide and "az=b" in wide
    assert run("get", "hypervisor", "missing").code == 1


def test_describe_shows_the_capacity_table(run: Run, fleet: str) -> None:
    out = run("describe", "hypervisor", "node-a1").out
    cpu = next(line for line in out.splitlines() if line.startswith("cpu "))
    # capacity 16, overcommit 4, effective 64, allocated 10, free 54, max unit 16
    assert cpu.split() == ["cpu", "16", "-", "-", "4", "64", "10", "54", "16"]
    mem = next(line for line in out.splitlines() if line.startswith("memory "))
    # 64Gi − 4Gi reserved = 60Gi effective and max unit; 20Gi allocated; 40Gi free
    assert mem.split() == ["memory", "64Gi", "-", "4Gi", "1", "60Gi", "20Gi", "40Gi", "60Gi"]


def test_capacity_has_a_total_row(run: Run, fleet: str) -> None:
    doc = json.loads(run("capacity", "-o", "json").out)
    assert doc["total"]["free"] == {"VGPU": "2", "cpu": "54", "memory": "40Gi"}
    table = run("capacity").out
    assert "TOTAL" in table and "overcommitted" not in table
    # Shrink the ratio below what is allocated: the host shows as overcommitted.
    run("overcommit", "set", "node-a1", "cpu=0.5")
    assert "-2 (overcommitted)" in run("capacity").out


def test_export_then_apply_round_trips(run: Run, fleet: str, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    exported = run("export").out
    path = tmp_path / "export.yaml"
    path.write_text(exported)
    monkeypatch.setenv("HVFLEET_STORE", f"sqlite:///{tmp_path}/other.db")
    assert run("apply", "-f", str(path)).code == 0
    assert run("export").out == exported
    # Applying the same manifests again changes nothing.
    before = snapshot(f"sqlite:///{tmp_path}/other.db")
    again = run("apply", "-f", str(path)).out
    assert again.split()[1::2] == ["unchanged"] * (len(again.split()) // 2) and again, again
    assert snapshot(f"sqlite:///{tmp_path}/other.db") == before


def test_apply_removes_fields_the_applier_dropped_but_keeps_others(
    run: Run, fleet: str, tmp_path: Path
) -> None:
    assert run("overcommit", "set", "node-b1", "memory=2", "--manager", "cortex").code == 0
    path = tmp_path / "b.yaml"
    path.write_text("apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata: {name: node-b1}\n"
                    "spec: {overcommit: {cpu: 2}}\n")
    assert run("apply", "-f", str(path)).code == 0
    doc = json.loads(run("get", "hypervisor", "node-b1", "-o", "json").out)
    assert doc["spec"]["overcommit"] == {"cpu": 2.0, "memory": 2.0}  # cortex's memory stays
    assert doc["spec"]["extraCapacity"] == {}  # the applier dropped its own VGPU
    assert doc["metadata"]["labels"] == {}


def test_crd_is_structural(run: Run) -> None:
    docs = list(yaml.safe_load_all(run("crd").out))
    kinds = ["Hypervisor", "Reservation", "Lease", "OvercommitPolicy"]
    assert [d["spec"]["names"]["kind"] for d in docs] == kinds

    def check(node: object, path: str) -> None:
        assert isinstance(node, dict), path
        assert "$ref" not in node and "$defs" not in node, path
        assert "type" in node or node.get("x-kubernetes-int-or-string"), path
        assert not ("properties" in node and "additionalProperties" in node), path
        for key, sub in node.get("properties", {}).items():
            check(sub, f"{path}.{key}")
        if isinstance(node.get("additionalProperties"), dict):
            check(node["additionalProperties"], f"{path}.*")
        if "items" in node:
            check(node["items"], f"{path}[]")

    for d in docs:
        version = d["spec"]["versions"][0]
        # A Lease has no status, as coordination.k8s.io's has none.
        want = {} if d["spec"]["names"]["kind"] == "Lease" else {"status": {}}
        assert version["subresources"] == want
        check(version["schema"]["openAPIV3Schema"], d["spec"]["names"]["kind"])


def test_apply_cannot_create_a_reservation_around_the_capacity_check(
    run: Run, fleet: str, tmp_path: Path
) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("apiVersion: hvfleet.io/v1\nkind: Reservation\nmetadata: {name: r1}\n"
                    "spec: {hypervisor: node-a1, consumer: c1, resources: {cpu: 1000}}\n")
    r = run("apply", "-f", str(path))
    assert r.code == 2
    assert "hvfleet reserve" in r.err
    assert run("get", "reservations", "-o", "json").out.count('"name"') == 0


def test_get_leases_and_ready_follow_the_agents_lease(
    run: Run, fleet: str, db_url: str, tmp_path: Path
) -> None:
    with open_store(db_url) as s:
        s.keepalive("node-a1", 30)
        s.keepalive("node-b1", 1)
        s.release("node-b1")
    out = run("get", "leases").out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:] if line.strip()}
    assert rows["node-a1"][1:3] == ["agent/node-a1", "True"]
    assert rows["node-b1"][1:3] == ["-", "False"]
    hv = {line.split()[0]: line.split()[1] for line in run("get", "hypervisors").out.splitlines()[1:]
          if line.strip()}
    assert hv["node-b1"] == "NotReady"  # released: whatever its status says
    # Nobody but the host's agent writes its Lease, through apply either.
    path = tmp_path / "lease.yaml"
    path.write_text("apiVersion: hvfleet.io/v1\nkind: Lease\n"
                    "metadata: {name: node-a1}\nspec: {holderIdentity: agent/node-a1}\n")
    r = run("apply", "-f", str(path))
    assert r.code != 0 and "written only by 'agent/node-a1'" in r.err, r


def test_user_text_is_printed_as_written_never_as_markup_or_terminal_control(
        run: Run, fleet: str, tmp_path: Path) -> None:
    """A maintenance reason or label anyone with write access sets reached the
    operator's terminal raw: ESC ] retitled it, ESC [2J cleared it, and Rich
    read `[bold]` as its markup. Each control character is now shown as its
    escape and markup as written (`describe` here; tables and `fit --why`
    print through the same `shown`)."""
    reason = "\x1b]0;pwned\x07\x1b[2J [bold]ticket[/bold] a"
    doc = {"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor",
           "metadata": {"name": "node-b1", "labels": {"az": "b", "note": "x"}},
           "spec": {"maintenance": "manual", "maintenanceReason": reason, "extraCapacity": {"VGPU": 2}}}
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    assert run("apply", "-f", str(path)).code == 0
    r = run("describe", "hypervisor", "node-b1")
    assert r.code == 0, r.err
    assert "\x1b" not in r.out and "\x07" not in r.out, r.out
    assert "manual (\\x1b]0;pwned\\x07\\x1b[2J [bold]ticket[/bold] a)" in r.out, r.out


def test_a_wide_table_to_a_pipe_is_never_cut(run: Run, fleet: str, tmp_path: Path) -> None:
    """Past 250 columns Rich cut every cell (`NA…`, `comput…`); kubectl never
    truncates what goes to a pipe."""
    labels = {f"k{i}": f"value-{i}-" + "x" * 50 for i in range(5)}
    doc = {"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor",
           "metadata": {"name": "node-b1", "labels": {"az": "b", **labels}},
           "spec": {"extraCapacity": {"VGPU": 2}}}
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    assert run("apply", "-f", str(path)).code == 0
    out = run("get", "hypervisors", "-o", "wide").out
    assert "…" not in out
    line = next(x for x in out.splitlines() if x.startswith("node-b1"))
    assert all(f"{k}={v}" in line for k, v in labels.items()) and len(line) > 300


def test_apply_reads_empty_maps_of_a_templated_manifest_as_absent(run: Run, db_url: str,
                                                                   tmp_path: Path) -> None:
    path = tmp_path / "nulls.yaml"
    path.write_text("apiVersion: hvfleet.io/v1\nkind: OvercommitPolicy\nmetadata:\n  name: p\n"
                    "  labels:\nspec:\n  selector:\n  overcommit: {cpu: 2}\n")
    r = run("apply", "-f", str(path))
    assert r.code == 0, r.err
    with open_store(db_url) as s:
        assert s.get("OvercommitPolicy", "p").spec.overcommit == {"cpu": 2.0}


def test_export_of_a_released_claim_applies_back(run: Run, db_url: str, tmp_path: Path) -> None:
    """The export carries no status, and apply read that as a reset to
    Pending: "Released -> Pending would hold more than its claim checked".
    (It is "configured": the applier now co-owns the spec, as in Kubernetes.)"""
    from datetime import UTC, datetime

    from tests.scheduling.sched_fleet import host, put_host

    with open_store(db_url) as s:
        put_host(s, host("hv1", {"cpu": 8, "memory": "8Gi"}, beat=datetime.now(UTC)))
    made = run("reserve", "hv1", "--cpu", "1", "--consumer", "6f1d2c3a-0000-4000-8000-000000000501")
    assert made.code == 0, made.err
    name = made.out.strip()
    assert run("release", name).code == 0
    path = tmp_path / "res.yaml"
    path.write_text(run("export", "--kind", "reservations").out)
    r = run("apply", "-f", str(path))
    assert r.code == 0, r.err
    with open_store(db_url) as s:
        assert s.get("Reservation", name).status.phase == "Released"


def test_get_o_name_prints_kubectls_kind_group_slash_name(run: Run, fleet: str) -> None:
    r = run("get", "hypervisors", "-o", "name")
    assert r.code == 0, r.err
    assert r.out == "hypervisor.hvfleet.io/node-a1\nhypervisor.hvfleet.io/node-b1\n"
    assert run("get", "hypervisor", "node-b1", "-o", "name").out == "hypervisor.hvfleet.io/node-b1\n"


def test_a_resource_given_twice_in_a_spec_edit_is_refused(run: Run, fleet: str) -> None:
    """`overcommit set node-a1 cpu=2 cpu=3` took the last silently; `fit` refuses it."""
    before = snapshot(fleet)
    r = run("overcommit", "set", "node-a1", "cpu=2", "cpu=3")
    assert r.code == 2 and "cpu is given twice" in r.err, r.err
    assert snapshot(fleet) == before
