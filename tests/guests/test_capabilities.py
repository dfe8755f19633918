"""The capabilities parsers: real libvirt output, missing parts, hostile input."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvfleet.discovery.capabilities import parse_host_capabilities
from hvfleet.model.errors import InvalidInput

from .conftest import HOSTS

REAL = HOSTS / "real"
CAPS = (REAL / "embed-tcg.caps.xml").read_text()
DOMCAPS_TCG = (REAL / "embed-tcg.domcaps.xml").read_text()
DOMCAPS_KVM = (REAL / "embed-kvm.domcaps.xml").read_text()


def test_real_capture_is_parsed_with_host_model_cpu_and_canonical_machines() -> None:
    caps = parse_host_capabilities(CAPS, DOMCAPS_TCG)
    assert caps.arch == "x86_64"
    assert caps.domcapabilities_available and caps.domcapabilities_domain_type == "qemu"
    assert caps.cpu.source == "domcapabilities host-model"
    assert caps.capabilities_cpu is not None and caps.capabilities_cpu.model
    q35 = next(m for m in caps.machine_types if m.name == "q35")
    assert q35.canonical.startswith("pc-q35-") and q35.canonical != "q35"
    assert {"kvm", "qemu"} <= set(caps.domain_types)
    assert caps.firmware.efi is True and caps.firmware.secure_boot is True
    assert caps.tpm_models and "tpm-crb" in caps.tpm_models
    assert caps.tpm_backends and "emulator" in caps.tpm_backends
    assert caps.video_models and "virtio" in caps.video_models
    assert caps.disk_buses and "virtio" in caps.disk_buses
    assert caps.vmcoreinfo is True and caps.sev is False
    assert caps.hyperv_features is not None and "spinlocks" in caps.hyperv_features
    assert caps.cpu_models and any(m.usable for m in caps.cpu_models)
    assert caps.hypervisor_version  # inferred from the newest machine type


def test_kvm_and_tcg_domcapabilities_differ_in_host_model() -> None:
    kvm = parse_host_capabilities(CAPS, DOMCAPS_KVM)
    tcg = parse_host_capabilities(CAPS, DOMCAPS_TCG)
    assert kvm.domcapabilities_domain_type == "kvm"
    assert kvm.cpu.model != tcg.cpu.model or kvm.cpu.features != tcg.cpu.features


def test_without_domcapabilities_unknown_is_not_absent() -> None:
    caps = parse_host_capabilities(CAPS, None)
    assert caps.domcapabilities_available is False
    assert caps.cpu.source == "capabilities host cpu"
    assert caps.hyperv_features is None and caps.tpm_models is None
    assert caps.vmcoreinfo is None and caps.firmware.efi is None
    assert any("domcapabilities not available" in n for n in caps.notes)


def test_old_libvirt_without_hyperv_element_says_so() -> None:
    old = DOMCAPS_KVM.replace("<hyperv supported='yes'>", "<hyperv-x supported='yes'>").replace(
        "</hyperv>", "</hyperv-x>"
    )
    caps = parse_host_capabilities(CAPS, old)
    assert caps.hyperv_features is None
    assert any("Hyper-V features unknown, not absent" in n for n in caps.notes)


XXE = """<?xml version="1.0"?>
<!DOCTYPE capabilities [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<capabilities><host><cpu><arch>&xxe;</arch></cpu></host></capabilities>"""

LAUGHS = (
    '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
    + "".join(f'<!ENTITY lol{i} "{("&lol" + str(i - 1) + ";") * 10}">' for i in range(1, 10))
    + ']><capabilities><host><cpu><arch>&lol9;</arch></cpu></host></capabilities>'
).replace("&lol0;", "&lol;")


@pytest.mark.parametrize("doc", [XXE, LAUGHS], ids=["xxe", "billion-laughs"])
def test_entity_laden_capabilities_are_refused_without_expansion(doc: str) -> None:
    with pytest.raises(InvalidInput, match="capabilities: DOCTYPE or ENTITY"):
        parse_host_capabilities(doc, None)
    with pytest.raises(InvalidInput, match="domcapabilities: DOCTYPE or ENTITY"):
        parse_host_capabilities(CAPS, doc)


@pytest.mark.parametrize(
    ("caps", "domcaps", "message"),
    [
        ("<capabilities><host>", None, r"capabilities: malformed XML \(line 1\)"),
        ("<domain/>", None, "root element is <domain>, not <capabilities>"),
        ("<capabilities/>", None, r"no <host><cpu>"),
        (CAPS, "<capabilities/>", "not <domainCapabilities>"),
        (CAPS, "<domainCapabilities><arch>aarch64</arch></domainCapabilities>", "differs"),
    ],
)
def test_bad_documents_give_one_line_errors(caps: str, domcaps: str | None, message: str) -> None:
    with pytest.raises(InvalidInput, match=message) as exc:
        parse_host_capabilities(caps, domcaps)
    assert "\n" not in str(exc.value)


names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(
    model=names,
    vendor=st.sampled_from(["Intel", "AMD", "Hygon"]),
    features=st.lists(names, max_size=30, unique=True),
    disabled=st.lists(names, max_size=5, unique=True),
    machines=st.lists(
        st.tuples(st.integers(1, 12), st.integers(0, 12), st.booleans()),
        max_size=8,
        unique_by=lambda m: (m[0], m[1]),
    ),
    hyperv=st.none() | st.lists(names, max_size=10, unique=True),
)
def test_parser_reads_back_what_a_document_says(
    model: str,
    vendor: str,
    features: list[str],
    disabled: list[str],
    machines: list[tuple[int, int, bool]],
    hyperv: list[str] | None,
) -> None:
    dep_attr = {True: " deprecated='yes'", False: ""}
    mach = "".join(
        f"<machine maxCpus='288'{dep_attr[dep]}>pc-q35-{a}.{b}</machine>"
        for a, b, dep in machines
    )
    caps = (
        f"<capabilities><host><cpu><arch>x86_64</arch><model>{model}</model>"
        f"<vendor>{vendor}</vendor>"
        + "".join(f"<feature name='{f}'/>" for f in features)
        + "</cpu></host><guest><os_type>hvm</os_type><arch name='x86_64'>"
        f"<emulator>/usr/bin/qemu</emulator>{mach}<domain type='kvm'/></arch></guest>"
        "</capabilities>"
    )
    hv = (
        ""
        if hyperv is None
        else "<hyperv supported='yes'><enum name='features'>"
        + "".join(f"<value>{h}</value>" for h in hyperv)
        + "</enum></hyperv>"
    )
    domcaps = (
        "<domainCapabilities><domain>kvm</domain><arch>x86_64</arch><cpu>"
        f"<mode name='host-model' supported='yes'><model>{model}</model><vendor>{vendor}</vendor>"
        + "".join(f"<feature policy='require' name='{f}'/>" for f in features)
        + "".join(f"<feature policy='disable' name='{f}'/>" for f in disabled)
        + f"</mode></cpu><features>{hv}</features></domainCapabilities>"
    )
    parsed = parse_host_capabilities(caps, domcaps)
    assert parsed.cpu.model == model and parsed.cpu.vendor == vendor
    assert parsed.cpu.features == features and parsed.cpu.disabled_features == disabled
    assert parsed.capabilities_cpu is not None and parsed.capabilities_cpu.features == features
    assert [m.name for m in parsed.machine_types] == [f"pc-q35-{a}.{b}" for a, b, _ in machines]
    assert [m.deprecated for m in parsed.machine_types] == [d for _, _, d in machines]
    assert parsed.hyperv_features == hyperv
    if machines:
        top = max((a, b) for a, b, _ in machines)
        assert parsed.hypervisor_version == f"{top[0]}.{top[1]}"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_garbage_is_refused_as_invalid_input_only(junk: str) -> None:
    # Anything else (AssertionError, lxml errors, KeyError...) fails the test.
    with contextlib.suppress(InvalidInput):
        parse_host_capabilities(junk, None)
