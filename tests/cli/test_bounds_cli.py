"""The CLI path of issue 16 §1: `apply -f` and the spec edits refuse a value
past a field's bound (exit 2, the field named, nothing written), and `hvfleet
get` shows an object that does not decode as Unknown, with why on stderr."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hvfleet.store import open_store
from tests.store.poison import HUGE, hypervisor_doc, poison

Run = Callable[..., Any]

MANIFEST = """\
apiVersion: hvfleet.io/v1
kind: Hypervisor
metadata:
  name: hv1
spec:
  extraCapacity:
    VGPU: {value}
"""


def _revision(db_url: str) -> int:
    with open_store(db_url) as s:
        return s.revision()


@pytest.mark.parametrize("value", [HUGE, "1e90", '"1e30"', '"0.0000000001"'])
def test_apply_of_a_quantity_past_its_bound_names_the_field_and_writes_nothing(
    run: Run, db_url: str, tmp_path: Path, value: str
) -> None:
    path = tmp_path / "hv.yaml"
    path.write_text(MANIFEST.format(value=value))
    before = _revision(db_url)
    r = run("apply", "-f", str(path))
    assert r.code == 2, r.err
    assert "spec.extraCapacity.VGPU" in r.err and len(r.err) < 2000
    assert _revision(db_url) == before


def test_spec_edits_past_a_bound_name_the_field_and_write_nothing(
    run: Run, db_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "hv.yaml"
    path.write_text(MANIFEST.format(value="1"))
    assert run("apply", "-f", str(path)).code == 0
    before = _revision(db_url)
    r = run("extra-capacity", "set", "hv1", "VGPU=1e30")
    assert r.code == 2 and ".VGPU: " in r.err and "out of range" in r.err, r.err
    r = run("overcommit", "set", "hv1", "cpu=1e9")
    assert r.code == 2 and "overcommit" in r.err, r.err
    assert _revision(db_url) == before


def test_get_shows_an_object_that_does_not_decode_as_unknown(
    run: Run, db_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "hv.yaml"
    path.write_text(MANIFEST.format(value="1"))
    assert run("apply", "-f", str(path)).code == 0
    poison(db_url, "Hypervisor", "bad", hypervisor_doc("bad"))
    r = run("get", "hypervisors")
    assert r.code == 0, r.err
    rows = {line.split()[0]: line.split() for line in r.out.splitlines()[1:]}
    assert sorted(rows) == ["bad", "hv1"]
    assert rows["bad"][1] == "Unknown"
    assert "Hypervisor bad" in r.err and "status.capacity.cpu" in r.err
    one = run("get", "hypervisor", "bad")
    assert one.code == 0 and "Unknown" in one.out
    assert run("get", "hypervisor", "bad", "-o", "json").code == 1
    assert run("delete", "hypervisor", "bad").code == 0
    assert "bad" not in run("get", "hypervisors").out


def test_a_hypervisor_name_its_agent_could_not_write_under_is_refused_naming_why(
    run: Run, db_url: str, tmp_path: Path
) -> None:
    """An agent writes as `agent/<name>`, and a field manager is at most 128
    characters (as in Kubernetes): a Hypervisor named longer than 122 could
    be created, and then no agent could ever report it (its writes failed with
    "manager: must be a printable name of 1 to 128 characters")."""
    name = "h" * 123
    path = tmp_path / "hv.yaml"
    path.write_text(MANIFEST.format(value="1").replace("name: hv1", f"name: {name}"))
    before = _revision(db_url)
    r = run("apply", "-f", str(path))
    assert r.code == 2 and "metadata.name" in r.err and "122" in r.err, r.err
    r = run("agent", "--connect", "test:///default", "--name", name, "--once")
    assert r.code == 2 and "--name" in r.err and "122" in r.err and "manager:" not in r.err, r.err
    r = run("token", "create", "--role", "agent", "--hypervisor", name)
    assert r.code == 2 and "122" in r.err, r.err
    assert _revision(db_url) == before
    ok = "h" * 122
    path.write_text(MANIFEST.format(value="1").replace("name: hv1", f"name: {ok}"))
    assert run("apply", "-f", str(path)).code == 0
    r = run("agent", "--connect", "test:///default", "--name", ok, "--once")
    assert r.code == 0, r.err
