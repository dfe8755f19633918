"""The CPU baseline against libvirt's own baselineCPU, on many host groups."""

from __future__ import annotations

import random
from pathlib import Path

import libvirt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree

from hvfleet.discovery.xmlsafe import read_xml_file
from hvfleet.guests.cpu import baseline_cpu, cpu_element, expand_cpu
from hvfleet.guests.cpumap import load_cpu_map
from hvfleet.guests.cpuxml import cpus_from_document
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import CPUModelInfo, HostCPU

from .conftest import HOSTS

CPU_FILES = sorted((HOSTS / "cpus").glob("*.xml"))


def _hosts() -> list[tuple[str, str, HostCPU]]:
    """(name, xml, cpu) for every synthesized realistic host and every bare model."""
    cmap = load_cpu_map()
    out = []
    for path in CPU_FILES:
        cpu = cpus_from_document(read_xml_file(str(path)), path.name)[0]
        out.append((path.stem, path.read_text(), cpu))
        bare = HostCPU(vendor=cpu.vendor, model=cpu.model)
        xml = (
            f"<cpu><arch>x86_64</arch><model>{cpu.model}</model>"
            f"<vendor>{cpu.vendor}</vendor></cpu>"
        )
        out.append((f"bare-{path.stem}", xml, bare))
    # Every other x86 model of cpu_map (vendor-neutral and 32-bit ones too),
    # bare, once per vendor.
    done = {c.model for _, _, c in out}
    for m in cmap.models.values():
        if m.name in done:
            continue
        for vendor in [m.vendor] if m.vendor else ["Intel", "AMD"]:
            xml = (
                f"<cpu><arch>x86_64</arch><model>{m.name}</model>"
                f"<vendor>{vendor}</vendor></cpu>"
            )
            out.append((f"bare-{m.name}-{vendor}", xml, HostCPU(vendor=vendor, model=m.name)))
    assert {c.model for _, _, c in out} == set(cmap.models)
    return out


def _groups(n: int, seed: int) -> list[list[tuple[str, str, HostCPU]]]:
    rng = random.Random(seed)
    hosts = _hosts()
    by_vendor: dict[str, list[tuple[str, str, HostCPU]]] = {}
    for h in hosts:
        by_vendor.setdefault(h[2].vendor, []).append(h)
    groups = [[h] for h in hosts]  # every host alone
    for _ in range(n):
        pool = by_vendor[rng.choice(sorted(v for v in by_vendor if len(by_vendor[v]) > 1))]
        groups.append(rng.sample(pool, rng.randint(2, min(6, len(pool)))))
    return groups


def _libvirt_features(conn: libvirt.virConnect, xmls: list[str]) -> set[str]:
    out = conn.baselineCPU(xmls, libvirt.VIR_CONNECT_BASELINE_CPU_EXPAND_FEATURES)
    root = etree.fromstring(out.encode())
    return {
        f.get("name", "")
        for f in root.findall("feature")
        if f.get("policy") in (None, "require", "force")
    }


def test_baseline_is_within_every_host_and_equals_libvirts(test_conn: libvirt.virConnect) -> None:
    cmap = load_cpu_map()
    groups = _groups(150, seed=7)
    for group in groups:
        ours = baseline_cpu([(n, c) for n, _, c in group]).value
        for name, _, cpu in group:
            missing = ours.features - expand_cpu(cpu, cmap, name)
            assert not missing, f"{name} lacks {sorted(missing)}"
        theirs = _libvirt_features(test_conn, [x for _, x, _ in group])
        assert theirs
        # libvirt's test driver cannot drop non-migratable features (no
        # VIR_CONNECT_BASELINE_CPU_MIGRATABLE there); we never require them.
        # Otherwise the two agree feature for feature: hvfleet once had more
        # (monitor, intel-pt), but those were features cpu_map marks removed
        # from the model, which no host of that model has.
        assert ours.features == theirs - cmap.non_migratable, (
            f"{[n for n, _, _ in group]}: hvfleet {sorted(ours.features ^ theirs)} differ"
        )
    assert len(groups) > 250


def test_expanded_output_lists_exactly_the_guest_features() -> None:
    group = _groups(0, seed=1)[:1] + _groups(3, seed=3)[-3:]
    for g in group:
        d = baseline_cpu([(n, c) for n, _, c in g]).value
        el = cpu_element(d, expand=True)
        required = {f.get("name") for f in el.findall("feature") if f.get("policy") == "require"}
        assert required == set(d.features)
        assert el.get("check") == "full" and el.find("model").get("fallback") == "forbid"


def test_non_migratable_features_are_never_required() -> None:
    cpu = HostCPU(vendor="Intel", model="Haswell", features=["invtsc", "xsaves", "vmx"])
    d = baseline_cpu([("h", cpu)]).value
    assert "invtsc" not in d.require and "xsaves" not in d.require
    assert "vmx" in d.require


def test_mixed_vendors_are_refused_with_both_named() -> None:
    a = HostCPU(vendor="Intel", model="Haswell")
    b = HostCPU(vendor="AMD", model="EPYC")
    with pytest.raises(InvalidInput, match=r"different CPU vendors.*AMD: b.*Intel: a"):
        baseline_cpu([("a", a), ("b", b)])


def test_unknown_model_is_an_error_naming_it() -> None:
    with pytest.raises(InvalidInput, match="'Pentium9000'"):
        baseline_cpu([("h", HostCPU(vendor="Intel", model="Pentium9000"))])


def test_intersection_keeps_what_all_share_and_drops_what_one_lacks() -> None:
    a = HostCPU(vendor="Intel", model="Cascadelake-Server", features=["vmx", "ss"])
    b = HostCPU(vendor="Intel", model="Skylake-Server", features=["vmx"])
    d = baseline_cpu([("a", a), ("b", b)]).value
    assert "vmx" in d.features and "ss" not in d.features
    assert "avx512vnni" not in d.features  # Cascadelake only
    assert d.model == "Skylake-Server"


def test_document_kinds_are_all_read(tmp_path: Path) -> None:
    real = HOSTS / "real"
    caps = cpus_from_document(read_xml_file(str(real / "embed-tcg.caps.xml")), "caps")
    dom = cpus_from_document(read_xml_file(str(real / "embed-tcg.domcaps.xml")), "dom")
    assert caps[0].model == "kvm64" and dom[0].model == "EPYC"
    multi = tmp_path / "m.xml"
    multi.write_text(
        "<cpus><cpu><model>Haswell</model><vendor>Intel</vendor></cpu>"
        "<cpu><model>Broadwell</model><vendor>Intel</vendor>"
        "<feature policy='disable' name='rtm'/></cpu></cpus>"
    )
    two = cpus_from_document(read_xml_file(str(multi)), "m")
    assert [c.model for c in two] == ["Haswell", "Broadwell"]
    assert two[1].disabled_features == ["rtm"]


_CMAP = load_cpu_map()
_VENDOR_MODELS = sorted(m.name for m in _CMAP.models.values() if m.vendor == "Intel")
_FEATURES = sorted(_CMAP.features)
_SPELLINGS = {f: sorted({f} | {a for a, c in _CMAP.aliases.items() if c == f}) for f in _FEATURES}


@st.composite
def intel_host(draw: st.DrawFn) -> HostCPU:
    model = draw(st.sampled_from(_VENDOR_MODELS))
    extra = draw(st.lists(st.sampled_from(_FEATURES), max_size=12, unique=True))
    own = sorted(_CMAP.models[model].features)
    missing = draw(st.just([]) | st.lists(st.sampled_from(own), max_size=4, unique=True))
    # Now and then a feature spelled as QEMU may spell it (an alias of cpu_map's name).
    spell = draw(st.booleans())
    return HostCPU(
        vendor="Intel",
        model=model,
        features=[draw(st.sampled_from(_SPELLINGS[f])) if spell else f
                  for f in extra if f not in missing],
        disabled_features=[draw(st.sampled_from(_SPELLINGS[f])) if spell else f
                           for f in missing],
    )


def _as_xml(cpu: HostCPU) -> str:
    feats = "".join(f"<feature policy='require' name='{f}'/>" for f in cpu.features)
    feats += "".join(f"<feature policy='disable' name='{f}'/>" for f in cpu.disabled_features)
    return (
        f"<cpu><arch>x86_64</arch><model>{cpu.model}</model>"
        f"<vendor>{cpu.vendor}</vendor>{feats}</cpu>"
    )


@settings(max_examples=120, deadline=None)
@given(hosts=st.lists(intel_host(), min_size=1, max_size=4))
def test_random_hosts_baseline_is_sound_and_at_least_libvirts(hosts: list[HostCPU]) -> None:
    conn = libvirt.open("test:///default")
    try:
        ours = baseline_cpu([(f"h{i}", c) for i, c in enumerate(hosts)]).value
        sets = [expand_cpu(c, _CMAP, "h") for c in hosts]
        common = frozenset.intersection(*sets)
        assert ours.features <= common
        # Every shared feature is kept, except non-migratable ones not in the model.
        assert common - ours.features <= _CMAP.non_migratable
        if any(c.disabled_features for c in hosts):
            # libvirt's baseline treats every feature of a host CPU as present,
            # policy='disable' included, so it is no reference for those.
            return
        if not all(set(c.features) <= set(_FEATURES) for c in hosts):
            return  # QEMU's spellings, which libvirt's own XML need not accept
        theirs = _libvirt_features(conn, [_as_xml(c) for c in hosts])
        assert not (theirs - ours.features - _CMAP.non_migratable)
    finally:
        conn.close()


# -- libvirt's own expansion of each real host as the reference ---------------
#
# The hosts: every realistic host CPU of examples/hosts/cpus, and the CPUs of
# every host of the example groups and of the captured real hosts, both as
# `virsh capabilities` and as the domcapabilities host-model report them.


def _real_host_cpus() -> dict[str, list[tuple[str, HostCPU]]]:
    from hvfleet.guests.hosts import load_caps_dir

    found: list[tuple[str, HostCPU]] = []
    for path in CPU_FILES:
        found.append((path.stem, cpus_from_document(read_xml_file(str(path)), path.name)[0]))
    for d in [*sorted((HOSTS / "groups").iterdir()), HOSTS / "real"]:
        for name, caps in load_caps_dir(str(d)).hosts:
            found.append((f"{d.name}/{name}", caps.cpu))
            if caps.capabilities_cpu is not None:
                found.append((f"{d.name}/{name}:caps", caps.capabilities_cpu))
    by_vendor: dict[str, list[tuple[str, HostCPU]]] = {}
    for name, cpu in found:
        by_vendor.setdefault(cpu.vendor, []).append((name, cpu))
    return by_vendor


_REAL = _real_host_cpus()
_REAL_VENDORS = sorted(v for v in _REAL if v in ("Intel", "AMD"))
_LIBVIRT = libvirt.open("test:///default")
_EXPANSIONS: dict[str, tuple[frozenset[str], frozenset[str]]] = {}


def _libvirt_expansion(xmls: list[str]) -> tuple[frozenset[str], frozenset[str]]:
    """(required, disabled) features of libvirt's expanded baseline of `xmls`."""
    key = "\0".join(xmls)
    if key not in _EXPANSIONS:
        out = _LIBVIRT.baselineCPU(xmls, libvirt.VIR_CONNECT_BASELINE_CPU_EXPAND_FEATURES)
        root = etree.fromstring(out.encode())
        feats = root.findall("feature")
        _EXPANSIONS[key] = (
            frozenset(f.get("name", "") for f in feats if f.get("policy", "require") in
                      ("require", "force")),
            frozenset(f.get("name", "") for f in feats if f.get("policy") in
                      ("disable", "forbid")),
        )
    return _EXPANSIONS[key]


def _host_has(cpu: HostCPU) -> frozenset[str]:
    """What libvirt says the host CPU has: its expansion less what it disables,
    less what the host itself reports disabled (libvirt's baseline takes a host
    CPU's policy='disable' features as present, so they are taken out here)."""
    required, disabled = _libvirt_expansion([_as_xml(cpu)])
    return required - disabled - {_CMAP.canonical_feature(f) for f in cpu.disabled_features}


def _guest_requires(guest_model: str, vendor: str, require: tuple[str, ...],
                    disable: tuple[str, ...]) -> frozenset[str]:
    """What a `<cpu>` with this model, require and disable asks of a host, the
    model's features as libvirt expands them."""
    model_feats, _ = _libvirt_expansion([_as_xml(HostCPU(vendor=vendor, model=guest_model))])
    return frozenset((model_feats | set(require)) - set(disable))


@st.composite
def real_group(draw: st.DrawFn) -> list[tuple[str, HostCPU]]:
    pool = _REAL[draw(st.sampled_from(_REAL_VENDORS))]
    return draw(st.lists(st.sampled_from(pool), min_size=1, max_size=5,
                         unique_by=lambda h: h[0]))


@settings(max_examples=200, deadline=None)
@given(group=real_group())
def test_baseline_never_requires_what_libvirt_says_a_host_lacks(
    group: list[tuple[str, HostCPU]],
) -> None:
    ours = baseline_cpu(group).value
    asked = _guest_requires(ours.model, ours.vendor, ours.require, ours.disable)
    # Our own account of the guest's features is libvirt's reading of the XML.
    assert asked == ours.features, (
        f"libvirt reads {sorted(asked ^ ours.features)} differently"
    )
    for name, cpu in group:
        lacking = asked - _host_has(cpu)
        assert not lacking, f"{name} lacks {sorted(lacking)}, which the guest requires"


@settings(max_examples=200, deadline=None)
@given(group=real_group())
def test_baseline_covers_libvirts_own_without_non_migratable_features(
    group: list[tuple[str, HostCPU]],
) -> None:
    ours = baseline_cpu(group).value
    theirs, _ = _libvirt_expansion([_as_xml(c) for _, c in group])
    # libvirt counts a host's policy='disable' features as present (see
    # _host_has); they are not shared, so they are not expected.
    host_disabled = {_CMAP.canonical_feature(f) for _, c in group for f in c.disabled_features}
    lacking = theirs - ours.features - _CMAP.non_migratable - host_disabled
    assert not lacking, f"libvirt's baseline has {sorted(lacking)}"


def test_features_removed_from_a_model_are_not_the_models() -> None:
    # Icelake-Server lists intel-pt as removed='yes', EPYC and Opteron_G3 monitor.
    assert "intel-pt" not in _CMAP.models["Icelake-Server"].features
    assert "intel-pt" in _CMAP.models["Icelake-Server"].removed
    assert "monitor" not in _CMAP.models["EPYC"].features
    icx = HostCPU(vendor="Intel", model="Icelake-Server")
    assert "intel-pt" not in expand_cpu(icx, _CMAP, "icx")
    # Like libvirt's baseline, the guest disables it explicitly: the model name
    # alone once meant intel-pt to libvirt and QEMU.
    d = baseline_cpu([("icx", icx)]).value
    assert d.model == "Icelake-Server" and "intel-pt" in d.disable
    assert "intel-pt" not in d.features
    # A host that really has it still passes it on.
    with_pt = HostCPU(vendor="Intel", model="Icelake-Server", features=["intel-pt"])
    d = baseline_cpu([("icx", with_pt)]).value
    assert "intel-pt" in d.features and "intel-pt" not in d.disable


def test_check_warns_of_a_removed_feature_the_guest_leaves_unsaid() -> None:
    from hvfleet.guests.check import check_domain
    from hvfleet.guests.generate import generate
    from hvfleet.guests.hosts import load_caps_dir
    from hvfleet.guests.request import GuestRequest

    group = load_caps_dir(str(HOSTS / "groups" / "single"))
    xml, plan = generate(GuestRequest(os="rhel9.1", name="g", vcpus=1, memory=1 << 30), group)
    assert plan.cpu.value.model == "Icelake-Server"
    dom = etree.fromstring(xml.encode())
    assert not any("removed" in w for v in check_domain(dom, group) for w in v.warnings)
    cpu = dom.find("cpu")
    for f in cpu.findall("feature[@name='intel-pt']"):
        cpu.remove(f)
    (verdict,) = check_domain(dom, group)
    assert verdict.ok  # the host lacks intel-pt and the guest does not ask for it
    assert any("intel-pt" in w and "removed" in w for w in verdict.warnings), verdict.warnings


def test_no_name_cpu_map_uses_is_taken_as_an_alias() -> None:
    # baseline_cpu canonicalises only the features outside a host's model:
    # sound only while no name in a model is an alias of another.
    used = set(_CMAP.features).union(*(m.features | m.removed for m in _CMAP.models.values()))
    assert not used & _CMAP.aliases.keys()
    assert _CMAP.aliases  # (there are aliases to keep apart)


# -- the baseline's shortcuts against the plain definition ---------------------
#
# baseline_cpu intersects per model and only the hosts' own lists, dedupes
# definitions by object and by value, and canonicalises only what lies
# outside a model. The reference below does none of that: every host's full
# feature set, intersected.

_ALL_USABLE = [CPUModelInfo(name=m, usable=True) for m in _CMAP.models]


@st.composite
def fleet(draw: st.DrawFn) -> tuple[list[tuple[str, HostCPU]], dict[str, list[CPUModelInfo]]]:
    kinds = draw(st.lists(intel_host(), min_size=1, max_size=4))
    hosts: list[tuple[str, HostCPU]] = []
    qemu: dict[str, list[CPUModelInfo]] = {}
    for i in range(draw(st.integers(1, 12))):
        cpu = draw(st.sampled_from(kinds))
        if draw(st.booleans()):  # an equal definition in an object of its own
            cpu = cpu.model_copy(deep=True)
        name = f"h{i}"
        hosts.append((name, cpu))
        if draw(st.integers(0, 3)) == 0:  # a QEMU that blocks a few features on this host
            blockers = draw(st.lists(st.sampled_from(_FEATURES), min_size=1, max_size=3))
            victim = draw(st.sampled_from(_VENDOR_MODELS))
            qemu[name] = [m for m in _ALL_USABLE if m.name != victim] + [
                CPUModelInfo(name=victim, usable=False, blockers=blockers)]
    return hosts, qemu


def _reference(hosts: list[tuple[str, HostCPU]],
               qemu: dict[str, list[CPUModelInfo]]) -> tuple[frozenset[str], int, int]:
    """(guest features, distinct definitions, size of the smallest) by the book."""
    canon = _CMAP.canonical_feature
    defs = set()
    for name, c in hosts:
        blocked = frozenset(canon(f) for m in qemu.get(name, ()) if m.usable is False
                            for f in m.blockers or ())
        defs.add((c.model, tuple(c.features), tuple(c.disabled_features), blocked))
    full = [(_CMAP.models[m].features | {canon(f) for f in feats})
            - {canon(f) for f in dis} - blocked for m, feats, dis, blocked in defs]
    common = frozenset.intersection(*full) & frozenset(_CMAP.features)
    return common - _CMAP.non_migratable, len(defs), min(map(len, full))


@settings(max_examples=300, deadline=None)
@given(group=fleet())
def test_baseline_equals_the_intersection_of_every_hosts_full_features(
    group: tuple[list[tuple[str, HostCPU]], dict[str, list[CPUModelInfo]]],
) -> None:
    hosts, qemu = group
    features, distinct, smallest = _reference(hosts, qemu)
    d = baseline_cpu(hosts, _CMAP, qemu_models=qemu)
    assert d.value.features == features
    assert f"({distinct} distinct host CPU definitions, smallest has {smallest})" in d.evidence[1]
