"""`hvfleet cpu baseline` and `hvfleet guest ...` end to end (files and store)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lxml import etree
from typer.testing import CliRunner, Result

import hvfleet.cli.guest  # noqa: F401  (registers the commands)
from hvfleet.cli.exit_codes import exit_code_of
from hvfleet.cli.main import app
from hvfleet.discovery.capabilities import parse_host_capabilities
from hvfleet.guests.check import NotEverywhere
from hvfleet.model import Hypervisor
from hvfleet.model.errors import InvalidInput
from hvfleet.store import open_store
from hvfleet.store.ownership import agent_manager

from .conftest import HOSTS

GROUPS = HOSTS / "groups"
HVFLEET = str(Path(sys.executable).with_name("hvfleet"))
runner = CliRunner()


def run(*args: str) -> Result:
    return runner.invoke(app, list(args))


def test_cpu_baseline_from_mixed_document_kinds() -> None:
    files = [
        str(HOSTS / "cpus" / "Skylake-Server.xml"),
        str(GROUPS / "intel-same" / "intel-a1.caps.xml"),
        str(GROUPS / "intel-mixed" / "icx-1.domcaps.xml"),
    ]
    r = run("cpu", "baseline", *files)
    assert r.exit_code == 0, r.output
    cpu = etree.fromstring(r.stdout.encode())
    assert cpu.get("mode") == "custom" and cpu.get("check") == "full"
    assert cpu.find("model").get("fallback") == "forbid"
    assert cpu.findtext("vendor") == "Intel"
    r = run("cpu", "baseline", "--expand", "-o", "json", *files)
    doc = json.loads(r.stdout)
    assert doc["hosts"] == 3 and "avx512f" in doc["features"] and "lm" in doc["features"]


def test_cpu_baseline_refuses_mixed_vendors_and_hostile_files(tmp_path: Path) -> None:
    r = run("cpu", "baseline", str(HOSTS / "cpus" / "EPYC.xml"), str(HOSTS / "cpus" / "Haswell.xml"))
    assert isinstance(r.exception, InvalidInput) and "different CPU vendors" in str(r.exception)
    evil = tmp_path / "evil.xml"
    evil.write_text('<!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/shadow">]><cpu>&e;</cpu>')
    r = run("cpu", "baseline", str(evil))
    assert isinstance(r.exception, InvalidInput) and "DOCTYPE" in str(r.exception)


def test_generate_writes_xml_and_explains(tmp_path: Path) -> None:
    out = tmp_path / "g.xml"
    r = run(
        "guest", "generate", "--os", "win11", "--name", "w", "--vcpus", "2", "--memory", "4Gi",
        "--disk", "kind=qcow2,source=/i/w.qcow2", "--nic", "network=default", "--secure-boot",
        "--caps-dir", str(GROUPS / "intel-mixed"), "--explain", "-o", str(out),
    )
    assert r.exit_code == 0, r.output
    dom = etree.fromstring(out.read_bytes())
    assert dom.find("os/type").get("machine") == "pc-q35-6.2"
    assert "hyperv" in r.stdout and "why:" in r.stdout


def test_explain_prints_the_table_without_xml() -> None:
    r = run("guest", "explain", "--policy", "2026.1", "--os", "rhel9.1",
            "--caps-dir", str(GROUPS / "amd-mixed"))
    assert r.exit_code == 0, r.output
    assert "<domain" not in r.stdout and "machine" in r.stdout and "osinfo rhel9.1" in r.stdout


def test_policies_lists_versions_with_changelog() -> None:
    r = run("guest", "policies")
    assert r.exit_code == 0 and r.stdout.startswith("2026.1: first release")
    assert "2026.2 (latest): " in r.stdout


def test_check_exit_0_on_own_group_and_3_with_reasons_elsewhere(tmp_path: Path) -> None:
    xml = tmp_path / "g.xml"
    r = run("guest", "generate", "--os", "win2k22", "--name", "w", "--vcpus", "2",
            "--memory", "4Gi", "--firmware", "efi", "--caps-dir", str(GROUPS / "intel-same"),
            "-o", str(xml))
    assert r.exit_code == 0, r.output
    r = run("guest", "check", str(xml), "--caps-dir", str(GROUPS / "intel-same"))
    assert r.exit_code == 0, r.output
    assert r.stdout.count(": ok") == 3

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for f in (GROUPS / "intel-mixed").glob("skl-1.*"):
        shutil.copy(f, mixed)
    for f in (GROUPS / "amd-mixed").glob("rome-1.*"):
        shutil.copy(f, mixed)
    (mixed / "blind.caps.xml").write_text((HOSTS / "real" / "embed-kvm.caps.xml").read_text())
    r = run("guest", "check", str(xml), "--caps-dir", str(mixed))
    # Raised for the CLI's error table to map (exit 3: not everywhere).
    assert isinstance(r.exception, NotEverywhere), r.output
    out = r.stdout
    assert "skl-1: NO" in out and "machine type pc-q35-7.2 absent" in out
    assert "rome-1: NO" in out and "CPU features missing:" in out and "CPU vendor Intel" in out
    assert "blind: NO" in out and "firmware EFI unknown" in out


def test_generate_exits_3_when_the_group_lacks_what_the_guest_needs(tmp_path: Path) -> None:
    # intel-a2 offers EFI without secure boot: a secure-boot guest runs on
    # intel-a1 only. Not bad input (the same request fits intel-same): the
    # group lacks something, which STYLE's exit 3 says ("not everywhere").
    for f in (GROUPS / "intel-same").glob("intel-a[12].*"):
        shutil.copy(f, tmp_path)
    domcaps = tmp_path / "intel-a2.domcaps.xml"
    text = domcaps.read_text()
    secure = '<enum name="secure">\n        <value>yes</value>\n        <value>no</value>'
    assert secure in text
    domcaps.write_text(text.replace(secure, '<enum name="secure">\n        <value>no</value>'))
    ask = ["guest", "generate", "--os", "win11", "--name", "w", "--vcpus", "2", "--memory", "4Gi",
           "--secure-boot", "--caps-dir"]
    r = subprocess.run([HVFLEET, *ask, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert r.stdout == "" and r.stderr.count("\n") == 1
    assert "secure boot" in r.stderr and "intel-a2" in r.stderr and "intel-a1" not in r.stderr
    assert isinstance(run(*ask, str(tmp_path)).exception, NotEverywhere)
    assert run(*ask, str(GROUPS / "intel-same")).exit_code == 0


def test_hosts_selector_reads_capabilities_from_the_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hv.db'}"
    with open_store(url) as store:
        for f in sorted((GROUPS / "intel-mixed").glob("*.caps.xml")):
            name = f.name.removesuffix(".caps.xml")
            caps = parse_host_capabilities(
                f.read_text(), (f.parent / f"{name}.domcaps.xml").read_text()
            )
            hv = Hypervisor.model_validate(
                {"metadata": {"name": name, "labels": {"group": "mixed"}},
                 "status": {"hostCapabilities": caps.to_dict()}}
            )
            store.create(hv, agent_manager(name))
    from_store = run("guest", "generate", "--os", "rhel9.1", "--name", "s", "--vcpus", "2",
                     "--memory", "2Gi", "--hosts", "group=mixed", "--store", url)
    assert from_store.exit_code == 0, from_store.output
    from_files = run("guest", "generate", "--os", "rhel9.1", "--name", "s", "--vcpus", "2",
                     "--memory", "2Gi", "--caps-dir", str(GROUPS / "intel-mixed"))
    assert from_store.stdout == from_files.stdout  # same inputs, same bytes
    r = run("cpu", "baseline", "--hosts", "group=mixed", "--store", url)
    assert r.exit_code == 0 and "Skylake-Server-IBRS" in r.stdout
    r = run("guest", "explain", "--os", "rhel9.1", "--hosts", "group=nothing", "--store", url)
    assert isinstance(r.exception, InvalidInput) and "no hypervisor matches" in str(r.exception)


@pytest.mark.parametrize(("edit", "said"), [
    (('<memory unit="KiB">', '<memory unit="furlongs">'), "unknown suffix 'furlongs'"),
    (("<name>c</name>", "<name>a/b</name>"), "cannot contain '/'"),
    (("</devices>", "<interface type='network'><source network='default'/>"
      "<mac address='01:00:5e:00:00:01'/></interface></devices>"), "expected unicast mac address"),
])
def test_check_says_no_where_libvirt_refuses_the_definition(
        tmp_path: Path, edit: tuple[str, str], said: str) -> None:
    """`guest check` answered "ok" on every host for XML libvirt's defineXML
    refuses (a unit, a name, a multicast MAC). libvirt's own parser now
    judges the definition first."""
    xml = tmp_path / "c.xml"
    r = run("guest", "generate", "--os", "rhel9.1", "--name", "c", "--vcpus", "1", "--memory", "1Gi",
            "--caps-dir", str(GROUPS / "intel-same"), "-o", str(xml))
    assert r.exit_code == 0, r.output
    text = xml.read_text()
    assert edit[0] in text
    xml.write_text(text.replace(edit[0], edit[1], 1))
    r = run("guest", "check", str(xml), "--caps-dir", str(GROUPS / "intel-same"))
    assert isinstance(r.exception, NotEverywhere), r.output
    assert r.stdout.count(": NO") == 3 and "libvirt refuses the definition" in r.stdout and said in r.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["guest", "generate", "--os", "win11", "--name", "x", "--vcpus", "1", "--memory", "1Gi"],
        ["guest", "generate", "--os", "nosuchos", "--name", "x", "--vcpus", "1",
         "--memory", "1Gi", "--caps-dir", str(GROUPS / "single")],
        ["guest", "generate", "--os", "rhel9.1", "--name", "x", "--vcpus", "1",
         "--memory", "lots", "--caps-dir", str(GROUPS / "single")],
        ["guest", "check", "/nonexistent.xml", "--caps-dir", str(GROUPS / "single")],
        # XML libvirt would refuse to define ("numerical overflow: value too large").
        ["guest", "generate", "--os", "rhel9.1", "--name", "x", "--vcpus", "1",
         "--memory", "8Ei", "--caps-dir", str(GROUPS / "single")],
        # A domain that defines and never starts: no interface has such a name.
        ["guest", "generate", "--os", "rhel9.1", "--name", "x", "--vcpus", "1", "--memory", "1Gi",
         "--nic", "bridge=br-with-a-long-name", "--caps-dir", str(GROUPS / "single")],
        ["guest", "generate", "--os", "rhel9.1", "--name", "x", "--vcpus", "1", "--memory", "1Gi",
         "--nic", "bridge=a b", "--caps-dir", str(GROUPS / "single")],
        ["guest", "generate", "--os", "rhel9.1", "--name", "x", "--vcpus", "1", "--memory", "1Gi",
         "--nic", "network=a/b", "--caps-dir", str(GROUPS / "single")],
    ],
    ids=["no-hosts", "unknown-os", "bad-memory", "missing-file", "memory-past-libvirt",
         "bridge-too-long", "bridge-with-space", "network-with-slash"],
)
def test_bad_input_is_invalid_input_with_one_line(args: list[str]) -> None:
    r = run(*args)
    assert isinstance(r.exception, InvalidInput), r.output
    assert "\n" not in str(r.exception) and exit_code_of(r.exception) == 2


def test_hostile_capabilities_in_a_caps_dir_are_refused_naming_the_host(tmp_path: Path) -> None:
    shutil.copy(GROUPS / "single" / "icx-solo.caps.xml", tmp_path / "good.caps.xml")
    (tmp_path / "evil.caps.xml").write_text(
        '<?xml version="1.0"?><!DOCTYPE c [<!ENTITY a "aaaaaaaaaa">'
        '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><capabilities>&b;</capabilities>'
    )
    r = run("guest", "explain", "--os", "rhel9.1", "--caps-dir", str(tmp_path))
    assert isinstance(r.exception, InvalidInput)
    assert "host evil" in str(r.exception) and "DOCTYPE or ENTITY" in str(r.exception)


def test_check_names_a_loader_path_the_host_lacks(tmp_path: Path) -> None:
    dom = tmp_path / "d.xml"
    dom.write_text(
        "<domain type='kvm'><name>x</name><memory>1048576</memory>"
        "<os><type arch='x86_64' machine='pc-q35-7.2'>hvm</type>"
        "<loader readonly='yes' type='pflash'>/opt/edk2/CODE.fd</loader></os></domain>"
    )
    r = run("guest", "check", str(dom), "--caps-dir", str(GROUPS / "single"))
    assert isinstance(r.exception, NotEverywhere)
    assert "firmware /opt/edk2/CODE.fd missing" in r.stdout
