"""Fleet-wide spec edits (`overcommit set -l role=compute cpu=4`): every matching
host or none, with each host's field ownership checked as for one host; on a
real SQLite store, through the real entry point and the core `edit_hosts`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from hvfleet.model import Hypervisor, Quantity, Resource, ResourceName
from hvfleet.model.errors import Conflict
from hvfleet.model.spec_edits import SpecEdit
from hvfleet.scheduling.fleet_edit import edit_hosts
from hvfleet.store import open_store
from hvfleet.store.base import OwnershipConflict, Write
from hvfleet.store.sqlite import SqliteStore

from .conftest import Run

CPU = ResourceName("cpu")
FLEET = "\n---\n".join(
    f"apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata: {{name: {name}, labels: {{role: {role}}}}}\n"
    f"spec: {{overcommit: {{memory: 1.5}}}}"
    for name, role in [("c-1", "compute"), ("c-2", "compute"), ("c-3", "compute"), ("g-1", "gpu")]
)


@pytest.fixture
def fleet(run: Run, tmp_path: Path, db_url: str) -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    assert run("apply", "-f", str(path)).code == 0
    with open_store(db_url) as s:
        for h in s.list_hypervisors():

            def observe(h: Hypervisor) -> Hypervisor:
                status = h.status.model_copy(update={"capacity": {CPU: Quantity(8)}})
                return h.model_copy(update={"status": status})

            s.update_hypervisor(h.name, observe, f"agent/{h.name}")
    return db_url


def ratios(db_url: str) -> dict[str, dict[str, float]]:
    with open_store(db_url) as s:
        return {h.name: {str(r): v for r, v in h.spec.overcommit.items()} for h in s.list_hypervisors()}


def versions(db_url: str) -> dict[str, str | None]:
    with open_store(db_url) as s:
        return {h.name: h.metadata.resource_version for h in s.list_hypervisors()}


def test_overcommit_set_with_a_selector_sets_every_matching_host(run: Run, fleet: str) -> None:
    r = run("overcommit", "set", "-l", "role=compute", "cpu=4")
    assert r.code == 0, r.err
    assert [line.split()[0] for line in r.out.splitlines()] == [
        "hypervisor/c-1",
        "hypervisor/c-2",
        "hypervisor/c-3",
    ]
    assert "cpu=32" in r.out
    assert ratios(fleet) == {
        "c-1": {"cpu": 4.0, "memory": 1.5},
        "c-2": {"cpu": 4.0, "memory": 1.5},
        "c-3": {"cpu": 4.0, "memory": 1.5},
        "g-1": {"memory": 1.5},
    }
    # Setting it again changes nothing: no write, no new generation.
    before = versions(fleet)
    assert run("overcommit", "set", "-l", "role=compute", "cpu=4").code == 0
    assert versions(fleet) == before
    assert run("overcommit", "unset", "-l", "role in (compute,gpu)", "memory").code == 0
    assert ratios(fleet) == {"c-1": {"cpu": 4.0}, "c-2": {"cpu": 4.0}, "c-3": {"cpu": 4.0}, "g-1": {}}
    # The single-host form is unchanged.
    assert run("overcommit", "set", "g-1", "cpu=2").code == 0
    assert ratios(fleet)["g-1"] == {"cpu": 2.0}


def test_a_field_another_manager_owns_on_one_host_leaves_every_host_untouched(run: Run, fleet: str) -> None:
    assert run("overcommit", "set", "c-2", "cpu=2", "--manager", "cortex").code == 0
    before = versions(fleet)
    r = run("overcommit", "set", "-l", "role=compute", "cpu=4")
    assert r.code == 4
    assert "Hypervisor c-2: spec.overcommit.cpu is owned by manager 'cortex'" in r.err
    assert versions(fleet) == before
    r = run("overcommit", "set", "-l", "role=compute", "cpu=4", "--force")
    assert r.code == 0, r.err
    assert {n: v.get("cpu") for n, v in ratios(fleet).items()} == {
        "c-1": 4.0,
        "c-2": 4.0,
        "c-3": 4.0,
        "g-1": None,
    }
    with open_store(fleet) as s:
        owners = [
            e.manager for e in s.get_hypervisor("c-2").metadata.managed_fields if "f:spec" in e.fields_v1
        ]
    assert "hvfleet-cli" in owners


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["-l", "role=compute", "cpu=0"], 2, "overcommit.cpu: 0.0 must be greater than 0"),
        (["-l", "role=nothing", "cpu=2"], 1, "no hypervisor matches selector 'role=nothing'"),
        (["-l", "role=compute"], 2, "Missing argument"),
        (["cpu=2"], 2, "give a hypervisor NAME and at least one entry, or -l SELECTOR"),
        (["-l", "role in (", "cpu=2"], 2, "selector: cannot parse"),
    ],
)
def test_fleet_wide_set_refuses_bad_input_and_writes_nothing(
    run: Run, fleet: str, args: list[str], code: int, message: str
) -> None:
    before = versions(fleet)
    r = run("overcommit", "set", *args)
    assert (r.code, message in r.err) == (code, True), r.err
    assert versions(fleet) == before


def test_reserved_and_extra_capacity_take_a_selector_too(run: Run, fleet: str) -> None:
    assert run("reserved", "set", "-l", "role=compute", "cpu=1").code == 0
    assert run("extra-capacity", "set", "-l", "role=gpu", "VGPU=4").code == 0
    doc = json.loads(run("get", "hypervisors", "-o", "json").out)
    by_name = {h["metadata"]["name"]: h["spec"] for h in doc["items"]}
    assert [n for n, spec in by_name.items() if spec.get("reserved")] == ["c-1", "c-2", "c-3"]
    assert by_name["g-1"]["extraCapacity"] == {"VGPU": "4"}


class RacingStore(SqliteStore):
    """A real SQLite store that, just before its first `races` batch writes, lets
    another connection to the same file write host `target` first, as a
    concurrent operator would (`race` decides what it writes)."""

    def __init__(self, path: str, target: str, race: SpecEdit, manager: str, races: int = 1) -> None:
        super().__init__(path)
        self.target, self.race, self.race_manager, self.races = target, race, manager, races
        self.batches = 0

    def write_all(self, writes: Sequence[Write], manager: str, *, force: bool = False) -> list[Resource]:
        self.batches += 1
        if self.races > 0:
            self.races -= 1
            with SqliteStore(self.path) as other:
                edit_hosts(other, self.race, self.race_manager, name=self.target)
        return super().write_all(writes, manager, force=force)


def test_a_concurrent_write_is_retried_from_a_fresh_read(fleet: str) -> None:
    path = fleet.removeprefix("sqlite:///")
    with RacingStore(path, "c-2", SpecEdit("reserved", {CPU: Quantity(1)}), "someone") as s:
        out = edit_hosts(s, SpecEdit("overcommit", {CPU: 4.0}), "hvfleet-cli", selector="role=compute")
        assert s.batches == 2
    assert [h.spec.overcommit[CPU] for h in out] == [4.0, 4.0, 4.0]
    # The other writer's change survives: the edit re-read c-2 instead of overwriting it.
    assert out[1].spec.reserved == {CPU: Quantity(1)}


def test_a_concurrent_owner_change_fails_the_whole_edit_with_nothing_written(fleet: str) -> None:
    """Between the read and the write, cortex takes c-2's cpu ratio: the batch is
    stale, the edit re-reads, and now c-2's field is cortex's: no host changes."""
    path = fleet.removeprefix("sqlite:///")
    race = SpecEdit("overcommit", {CPU: 2.0})
    with RacingStore(path, "c-2", race, "cortex") as s, pytest.raises(OwnershipConflict, match="'cortex'"):
        edit_hosts(s, SpecEdit("overcommit", {CPU: 4.0}), "hvfleet-cli", selector="role=compute")
    assert {n: v.get("cpu") for n, v in ratios(fleet).items()} == {
        "c-1": None,
        "c-2": 2.0,
        "c-3": None,
        "g-1": None,
    }
    assert issubclass(OwnershipConflict, Conflict)
