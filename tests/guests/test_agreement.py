"""`guest generate` and `guest check` agree: what is generated for a group passes
the check on every host of that group, whatever the group's QEMUs know."""

from __future__ import annotations

import re
import shutil
from functools import cache
from pathlib import Path

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from lxml import etree
from typer.testing import CliRunner

import hvfleet.cli.guest  # noqa: F401  (registers the commands)
from hvfleet.cli.main import app
from hvfleet.guests.check import check_domain
from hvfleet.guests.cpu import MODES
from hvfleet.guests.errors import NotEverywhere
from hvfleet.guests.generate import generate
from hvfleet.guests.hosts import load_caps_dir
from hvfleet.guests.policy import POLICIES
from hvfleet.guests.request import DiskSpec, GuestRequest, HostGroup, NicSpec
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import CPUModelInfo

from .conftest import HOSTS

GROUP_DIRS = {p.name: p for p in sorted((HOSTS / "groups").iterdir())} | {"real": HOSTS / "real"}
# Windows client and server, old Windows, several Linux, a BSD, and generic ids.
OSES = ("win11", "win10", "win2k22", "win2k19", "win7", "winxp", "rhel9.1", "rhel7.9",
        "ubuntu22.04", "debian11", "fedora37", "linux2022", "linux2016", "freebsd13.0",
        "centos-stream9", "alpinelinux3.17")


@cache
def example_group(name: str) -> HostGroup:
    return load_caps_dir(str(GROUP_DIRS[name]))


def _drop_models(group: HostGroup, drop: frozenset[str]) -> HostGroup:
    """The group as if every host's QEMU predated the models in `drop`."""
    hosts = []
    for name, caps in group.hosts:
        if caps.cpu_models is not None:
            kept: list[CPUModelInfo] = [m for m in caps.cpu_models if m.name not in drop]
            caps = caps.model_copy(update={"cpu_models": kept})
        hosts.append((name, caps))
    return HostGroup(tuple(hosts))


def _failures(xml: str, group: HostGroup) -> list[tuple[str, list[str]]]:
    verdicts = check_domain(etree.fromstring(xml.encode()), group)
    return [(v.host, v.problems) for v in verdicts if not v.ok]


def _drop_from_files(src: Path, dst: Path, model: str) -> None:
    """Copy a caps dir, deleting `model` from each domcapabilities model list."""
    shutil.copytree(src, dst)
    line = re.compile(rf"^\s*<model usable=[^>]*>{re.escape(model)}</model>\n", re.M)
    for p in dst.glob("*.domcaps.xml"):
        text = p.read_text()
        new = line.sub("", text)
        assert new != text, f"{p.name} lists no {model}"
        p.write_text(new)


def test_a_model_no_host_qemu_knows_is_never_chosen(tmp_path: Path) -> None:
    # The repro: intel-mixed with Skylake-Server-IBRS gone from every
    # host's domcapabilities model list, as for QEMUs that predate it.
    group_dir = tmp_path / "intel-mixed"
    _drop_from_files(GROUP_DIRS["intel-mixed"], group_dir, "Skylake-Server-IBRS")
    out = tmp_path / "g.xml"
    runner = CliRunner()
    r = runner.invoke(app, ["guest", "generate", "--os", "rhel9.1", "--name", "g",
                            "--vcpus", "2", "--memory", "4Gi", "--caps-dir", str(group_dir),
                            "-o", str(out)])
    assert r.exit_code == 0, r.output
    cpu = etree.parse(str(out)).find("cpu")
    model = cpu.findtext("model")
    assert model != "Skylake-Server-IBRS"
    # An older model every host knows and can use, plus features.
    for _, caps in load_caps_dir(str(group_dir)).hosts:
        assert caps.cpu_models is not None
        assert model in {m.name for m in caps.cpu_models if m.usable}
    assert cpu.findall("feature[@policy='require']")
    r = runner.invoke(app, ["guest", "check", str(out), "--caps-dir", str(group_dir)])
    assert r.exit_code == 0, r.output


def test_a_model_unusable_on_a_host_is_only_chosen_with_its_blockers_disabled() -> None:
    # Cascadelake-Server is what intel-same shares; mark it unusable on one host.
    g = example_group("intel-same")
    name, caps = g.hosts[0]
    assert caps.cpu_models is not None
    models = [m.model_copy(update={"usable": False}) if m.name == "Cascadelake-Server" else m
              for m in caps.cpu_models]
    # Without blockers, what blocks it is what the host CPU lacks of the
    # model: the guest disables that, and check warns that it could only
    # compare features.
    blind = HostGroup(((name, caps.model_copy(update={"cpu_models": models})), *g.hosts[1:]))
    xml, plan = generate(GuestRequest(os="rhel9.1", name="g", vcpus=2, memory=2 << 30), blind)
    assert not _failures(xml, blind)
    verdict = check_domain(etree.fromstring(xml.encode()), blind)[0]
    assert any("lists no blockers" in w for w in verdict.warnings), verdict.warnings
    # With blockers the guest does not have, it is usable as the guest asks for it.
    blocked = [m.model_copy(update={"blockers": ["avx512vnni"]}) if m.name == "Cascadelake-Server"
               else m for m in models]
    ok = HostGroup(((name, caps.model_copy(update={"cpu_models": blocked})), *g.hosts[1:]))
    xml, plan = generate(GuestRequest(os="rhel9.1", name="g", vcpus=2, memory=2 << 30), ok)
    assert not _failures(xml, ok)
    assert "avx512vnni" not in plan.cpu.value.features
    # check refuses a guest that needs a blocker.
    dom = etree.fromstring(xml.encode())
    cpu = dom.find("cpu")
    cpu.find("model").text = "Cascadelake-Server"
    for f in cpu.findall("feature"):
        if f.get("name") == "avx512vnni":
            cpu.remove(f)
    problems = dict((v.host, v.problems) for v in check_domain(dom, ok))[name]
    assert any("Cascadelake-Server" in p and "avx512vnni" in p for p in problems), problems


@st.composite
def generated_case(draw: st.DrawFn) -> tuple[GuestRequest, HostGroup, str]:
    gname = draw(st.sampled_from(sorted(GROUP_DIRS)))
    group = example_group(gname)
    known = sorted({m.name for _, c in group.hosts for m in c.cpu_models or []})
    drop = frozenset(draw(st.lists(st.sampled_from(known), max_size=8))) if known else frozenset()
    if drop:
        group = _drop_models(group, drop)
    firmware = draw(st.sampled_from(("auto", "bios", "efi")))
    req = GuestRequest(
        os=draw(st.sampled_from(OSES)),
        name="p",
        vcpus=draw(st.integers(1, 64)),
        memory=draw(st.integers(16, 64 << 10)) << 20,
        disks=(DiskSpec.parse("kind=qcow2,source=/i/a.qcow2"),),
        nics=(NicSpec.parse("network=default"),),
        firmware=firmware,
        secure_boot=firmware != "bios" and draw(st.booleans()),
        tpm=draw(st.booleans()),
        mode=draw(st.sampled_from(MODES)),
        policy=draw(st.sampled_from(sorted(POLICIES))),
        drivers=draw(st.sampled_from([(), ("virtio-win",)])),
    )
    return req, group, f"{gname} without {sorted(drop)}"


_GENERATED: list[str] = []


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=generated_case())
def test_a_generated_guest_passes_check_on_every_host_of_its_group(
    case: tuple[GuestRequest, HostGroup, str],
) -> None:
    req, group, label = case
    note(label)
    try:
        xml, _ = generate(req, group)
    except (InvalidInput, NotEverywhere):
        return  # refused with a reason (mixed vendors in intersection mode, ...)
    _GENERATED.append(label)
    assert not _failures(xml, group)


def test_the_property_test_really_generated_guests() -> None:
    # Refusals are allowed above; make sure most cases were real guests.
    test_a_generated_guest_passes_check_on_every_host_of_its_group()
    assert len(_GENERATED) > 100


def test_domcapabilities_blockers_are_read_per_model() -> None:
    from hvfleet.discovery.capabilities import parse_host_capabilities

    real = HOSTS / "real"
    dom = (real / "embed-tcg.domcaps.xml").read_text()
    marker = "<model usable='no' vendor='Intel'>Skylake-Server</model>"
    assert marker in dom
    dom = dom.replace(marker, marker + "<blockers model='Skylake-Server'>"
                      "<feature name='avx512f'/><feature name='pku'/></blockers>")
    caps = parse_host_capabilities((real / "embed-tcg.caps.xml").read_text(), dom)
    assert caps.cpu_models is not None
    by_name = {m.name: m for m in caps.cpu_models}
    assert by_name["Skylake-Server"].blockers == ["avx512f", "pku"]
    assert by_name["Skylake-Server"].usable is False
    # Not listed is unknown, not "nothing blocks it".
    assert by_name["Broadwell"].blockers is None
    # An unlisted blocker list leaves the stored form (and the inputs digest) as it was.
    assert "blockers" not in caps.to_dict()["cpuModels"][0]


def test_cpu_baseline_of_domcapabilities_files_uses_only_models_their_qemu_knows(
    tmp_path: Path,
) -> None:
    group_dir = tmp_path / "intel-mixed"
    _drop_from_files(GROUP_DIRS["intel-mixed"], group_dir, "Skylake-Server-IBRS")
    files = sorted(str(p) for p in group_dir.glob("*.domcaps.xml"))
    runner = CliRunner()
    r = runner.invoke(app, ["cpu", "baseline", *files])
    assert r.exit_code == 0, r.output
    model = etree.fromstring(r.stdout.encode()).findtext("model")
    assert model == "Skylake-Server"
    # The untouched files still give the closest model.
    r = runner.invoke(app, ["cpu", "baseline", *sorted(
        str(p) for p in GROUP_DIRS["intel-mixed"].glob("*.domcaps.xml"))])
    assert etree.fromstring(r.stdout.encode()).findtext("model") == "Skylake-Server-IBRS"
