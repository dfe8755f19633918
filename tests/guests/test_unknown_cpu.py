"""Hosts whose CPU libvirt does not identify (the test driver's) are refused by
`cpu baseline` and `guest generate`, or left out of a baseline when asked."""

from __future__ import annotations

import json
from pathlib import Path

import libvirt
import pytest
from lxml import etree
from typer.testing import CliRunner, Result

import hvfleet.cli.guest  # noqa: F401  (registers the commands)
from hvfleet.cli.exit_codes import exit_code_of
from hvfleet.cli.main import app
from hvfleet.discovery.capabilities import parse_host_capabilities
from hvfleet.guests.check import check_domain
from hvfleet.guests.cpu import UnknownHostCPU, baseline_cpu
from hvfleet.guests.generate import generate
from hvfleet.guests.request import GuestRequest, HostGroup
from hvfleet.model import Hypervisor
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import HostCapabilities
from hvfleet.store import open_store
from hvfleet.store.ownership import agent_manager

from .conftest import HOSTS

GROUPS = HOSTS / "groups"
runner = CliRunner()


def run(*args: str) -> Result:
    return runner.invoke(app, list(args))


@pytest.fixture
def test_driver_caps(test_conn: libvirt.virConnect) -> HostCapabilities:
    """What the agent stores for a test-driver host: no CPU model, no vendor."""
    caps = parse_host_capabilities(test_conn.getCapabilities(), None)
    assert not caps.cpu.model
    return caps


def _store(tmp_path: Path, hosts: dict[str, HostCapabilities]) -> str:
    url = f"sqlite:///{tmp_path / 'hv.db'}"
    with open_store(url) as store:
        for name, caps in hosts.items():
            hv = Hypervisor.model_validate(
                {"metadata": {"name": name, "labels": {"group": "g"}},
                 "status": {"hostCapabilities": caps.to_dict()}}
            )
            store.create(hv, agent_manager(name))
    return url


def _known(name: str) -> HostCapabilities:
    return parse_host_capabilities(
        (GROUPS / "intel-mixed" / f"{name}.caps.xml").read_text(),
        (GROUPS / "intel-mixed" / f"{name}.domcaps.xml").read_text(),
    )


def test_cpu_baseline_over_unknown_cpus_is_refused_naming_them(
    tmp_path: Path, test_driver_caps: HostCapabilities
) -> None:
    url = _store(tmp_path, {"test-1": test_driver_caps, "test-2": test_driver_caps})
    r = run("cpu", "baseline", "--hosts", "group=g", "--store", url)
    assert isinstance(r.exception, InvalidInput), r.output
    assert exit_code_of(r.exception) == 2
    msg = str(r.exception)
    assert "test-1" in msg and "test-2" in msg and "unknown" in msg
    assert "--skip-unknown" in msg and "\n" not in msg
    assert "486" not in r.stdout


def test_cpu_baseline_skips_unknown_cpus_when_asked_with_a_warning(
    tmp_path: Path, test_driver_caps: HostCapabilities
) -> None:
    url = _store(tmp_path, {"test-1": test_driver_caps, "skl-1": _known("skl-1"),
                            "clx-1": _known("clx-1")})
    r = run("cpu", "baseline", "--hosts", "group=g", "--store", url, "--skip-unknown",
            "-o", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["hosts"] == 2 and doc["skipped"] == ["test-1"]
    assert doc["model"] == "Skylake-Server-IBRS"
    assert "warning" in r.stderr and "test-1" in r.stderr
    r = run("cpu", "baseline", "--hosts", "group=g", "--store", url, "--skip-unknown")
    assert r.exit_code == 0
    assert etree.fromstring(r.stdout.encode()).findtext("model") == "Skylake-Server-IBRS"
    # Nothing known left: still an error, not 486.
    (tmp_path / "alone").mkdir()
    only = _store(tmp_path / "alone", {"test-1": test_driver_caps})
    r = run("cpu", "baseline", "--hosts", "group=g", "--store", only, "--skip-unknown")
    assert isinstance(r.exception, InvalidInput) and exit_code_of(r.exception) == 2
    assert "test-1" in str(r.exception)


def test_cpu_baseline_files_follow_the_same_rule(tmp_path: Path) -> None:
    blank = tmp_path / "blank.xml"
    blank.write_text("<cpu><arch>i686</arch></cpu>")
    known = str(HOSTS / "cpus" / "Haswell.xml")
    r = run("cpu", "baseline", str(blank), known)
    assert isinstance(r.exception, InvalidInput) and str(blank) in str(r.exception)
    r = run("cpu", "baseline", str(blank), known, "--skip-unknown", "-o", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["model"] == "Haswell"


def test_core_names_the_field_and_lists_what_it_left_out(
    test_driver_caps: HostCapabilities,
) -> None:
    hosts = [("t", test_driver_caps.cpu), ("clx-1", _known("clx-1").cpu)]
    with pytest.raises(UnknownHostCPU) as exc:
        baseline_cpu(hosts)
    assert exc.value.hosts == ("t",) and "skip_unknown" in str(exc.value)
    assert "--" not in str(exc.value)
    d = baseline_cpu(hosts, skip_unknown=True)
    assert d.value.skipped == ("t",) and d.value.model == "Cascadelake-Server"
    assert any("t" in e and "unknown" in e for e in d.evidence)


@pytest.mark.parametrize("mode", ["intersection", "software", "none"])
def test_guest_generate_over_unknown_cpus_is_refused_naming_them(
    test_driver_caps: HostCapabilities, mode: str
) -> None:
    # The test driver's CPU on an otherwise capable host (the test driver
    # itself has no q35 machine type, which is refused before the CPU).
    blind = _known("clx-1").model_copy(update={"cpu": test_driver_caps.cpu, "cpu_models": None})
    group = HostGroup((("test-1", blind), ("clx-1", _known("clx-1"))))
    req = GuestRequest(os="rhel9.1", name="g", vcpus=1, memory=1 << 30, mode=mode)
    with pytest.raises(UnknownHostCPU, match="test-1") as exc:
        generate(req, group)
    # A guest must run on every host of its group: no leaving hosts out here.
    assert "skip_unknown" not in str(exc.value)


def test_check_reports_an_unknown_cpu_as_unknown_not_missing(
    test_driver_caps: HostCapabilities,
) -> None:
    group = HostGroup((("clx-1", _known("clx-1")),))
    xml, _ = generate(GuestRequest(os="rhel9.1", name="g", vcpus=1, memory=1 << 30), group)
    verdict = check_domain(etree.fromstring(xml.encode()),
                           HostGroup((("test-1", test_driver_caps),)))[0]
    assert not any("CPU features missing" in p for p in verdict.problems), verdict.problems
    assert any("CPU" in w and "unknown" in w for w in verdict.warnings), verdict.warnings
