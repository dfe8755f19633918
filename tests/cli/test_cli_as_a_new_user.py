"""The CLI against its README, tried as a new user would (issue 19): global
options before or after the command, usage lines and help texts that say
what a flag does, no-op writes that say "unchanged", `--consumer` a UUID,
reservations selected by their own or their host's labels, and a host in
maintenance whose agent went quiet shown as Maintenance with its staleness."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hvfleet.cli.entry import command_of
from hvfleet.model import Condition, Quantity
from hvfleet.store import open_store

from .conftest import Run

FLEET = """\
apiVersion: hvfleet.io/v1
kind: Hypervisor
metadata: {name: c-1, labels: {role: compute}}
spec: {overcommit: {cpu: 4}}
---
apiVersion: hvfleet.io/v1
kind: Hypervisor
metadata: {name: c-2, labels: {role: compute}}
---
apiVersion: hvfleet.io/v1
kind: Hypervisor
metadata: {name: e-1, labels: {role: edge}}
spec: {maintenance: manual, maintenanceReason: "disk swap"}
"""


def _observed(db_url: str, name: str, beat: datetime) -> None:
    with open_store(db_url) as s:
        def observe(h):  # type: ignore[no-untyped-def]
            status = h.status.model_copy(update={
                "capacity": {"cpu": Quantity(16), "memory": Quantity.parse("64Gi")},
                "conditions": [Condition(type="Ready", status="True", reason="Reconciled")],
                "last_heartbeat_time": beat,
                "observed_generation": h.metadata.generation,
            })
            return h.model_copy(update={"status": status})
        s.update_hypervisor(name, observe, f"agent/{name}")


@pytest.fixture
def fleet(run: Run, db_url: str, tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    assert run("apply", "-f", str(path)).code == 0
    for name in ("c-1", "c-2", "e-1"):
        _observed(db_url, name, datetime.now(UTC))
    return path


def _column(out: str, host: str, index: int) -> str:
    line = next(line for line in out.splitlines() if line.startswith(host + " "))
    return line.split()[index]


def test_global_options_go_before_or_after_the_command(run: Run, fleet: Path, tmp_path: Path) -> None:
    other = f"sqlite:///{tmp_path}/other.db"
    assert run("crd", "--store", other).code == 0  # the README: every command takes --store
    assert run("crd", "--store-prefix", "/x", "--token", "t").code == 0
    empty = run("--store", other, "get", "hypervisors")
    assert empty.code == 0 and "No hypervisors found" in empty.err
    after = run("get", "hypervisors", "--store", other)
    assert after.code == 0 and "No hypervisors found" in after.err
    assert run("--store-prefix", "/x", "get", "hypervisors").code == 0
    assert command_of(["--store", "sqlite:///get.db", "--token", "x", "capacity"]) == "capacity"
    assert command_of(["--store-prefix", "/p", "--help"]) is None


def test_usage_lines_and_help_say_what_each_argument_and_flag_is(run: Run) -> None:
    usage = run("overcommit", "set", "--help").out
    assert "overcommit set [OPTIONS] [NAME] RESOURCE=VALUE...\n" in usage
    assert "{" not in usage.splitlines()[0]
    assert "describe [OPTIONS] KIND NAME\n" in run("describe", "--help").out
    serve = run("serve", "--help").out
    assert "--store" in serve and not any(f in serve for f in ("--token", "--ca", "--kubeconfig"))
    sync = " ".join(run("placement", "sync", "--help").out.split())
    assert "Placement's token" in sync and "not hvfleet's" in sync
    listing = " ".join(run("reservations", "--help").out.split())
    assert "the reservation's own labels" in listing
    assert "--hypervisor-selector" in listing and "labels of the host" in listing


def test_no_op_writes_say_unchanged(run: Run, fleet: Path) -> None:
    edit = run("overcommit", "set", "-l", "role=compute", "cpu=4")
    assert edit.code == 0, edit.err
    assert "hypervisor/c-1 unchanged (generation 1)" in edit.out
    assert "hypervisor/c-2 updated (generation 2)" in edit.out
    again = run("overcommit", "set", "-l", "role=compute", "cpu=4")
    assert again.out.count(" unchanged ") == 2 and " updated " not in again.out
    exported = fleet.with_name("export.yaml")
    exported.write_text(run("export").out)
    applied = run("apply", "-f", str(exported))
    assert applied.code == 0, applied.err
    assert sorted(applied.out.split()) == sorted(
        ["hypervisor/c-1", "hypervisor/c-2", "hypervisor/e-1"] + ["unchanged"] * 3)
    changed = exported.read_text().replace("cpu: 4", "cpu: 5", 1)
    exported.write_text(changed)
    assert " configured" in run("apply", "-f", str(exported)).out


def test_consumer_must_be_a_uuid(run: Run, fleet: Path) -> None:
    bad = run("reserve", "c-1", "--cpu", "1", "--consumer", "vm-1")
    assert bad.code == 2
    assert bad.err.startswith("error: --consumer: 'vm-1' is not a UUID") and bad.err.count("\n") == 1
    assert run("get", "reservations", "-o", "json").out.count('"name"') == 0
    made = run("reserve", "c-1", "--cpu", "1", "--consumer", str(uuid.uuid4()).upper())
    assert made.code == 0, made.err


def test_reservations_select_by_their_own_labels_or_their_hosts(run: Run, fleet: Path) -> None:
    on_compute = run("reserve", "c-2", "--cpu", "1", "--consumer", str(uuid.uuid4())).out.strip()
    on_edge_host = run("reserve", "c-1", "--cpu", "1", "--consumer", str(uuid.uuid4())).out.strip()
    assert on_compute and on_edge_host
    by_host = run("reservations", "--hypervisor-selector", "role=compute").out
    assert on_compute in by_host and on_edge_host in by_host
    none = run("reservations", "--hypervisor-selector", "role=edge")
    assert none.code == 0 and on_compute not in none.out and on_edge_host not in none.out
    own = run("reservations", "-l", "hvfleet.io/hypervisor=c-2").out
    assert on_compute in own and on_edge_host not in own


def test_a_host_in_maintenance_whose_heartbeat_aged_shows_maintenance_and_its_staleness(
    run: Run, fleet: Path, db_url: str
) -> None:
    _observed(db_url, "e-1", datetime.now(UTC) - timedelta(hours=2))
    _observed(db_url, "c-2", datetime.now(UTC) - timedelta(hours=2))
    got = run("get", "hypervisors").out
    assert _column(got, "e-1", 1) == "Maintenance,Stale"
    assert _column(got, "c-2", 1) == "Stale"
    assert _column(run("capacity").out, "e-1", 1) == "Maintenance,Stale"
    described = " ".join(run("describe", "hypervisor", "e-1").out.split())
    assert ("Readiness: Maintenance (Maintenance): in maintenance (manual) (disk swap); "
            "last heartbeat 72") in described


def test_guest_generate_on_test_driver_hosts_gives_cpu_baselines_reason(run: Run, db_url: str) -> None:
    node = Path(__file__).resolve().parents[2] / "examples" / "fleet" / "compute-01.xml"
    assert run("agent", "--connect", f"test://{node}", "--once").code == 0
    baseline = run("cpu", "baseline", "--hosts", "role!=none")
    generate = run("guest", "generate", "--os", "rhel9.1", "--name", "vm", "--vcpus", "2",
                   "--memory", "4Gi", "--hosts", "role!=none")
    reason = "the CPU of compute-01 is unknown (libvirt reported no CPU model, as its test driver does)"
    assert (baseline.code, generate.code) == (2, 2)
    assert reason in baseline.err and reason in generate.err and "machine type" not in generate.err
