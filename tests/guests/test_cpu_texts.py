"""Reading host CPUs from many raw XML documents by their `<cpu>` part only
gives exactly what parsing each whole document gives."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvfleet.discovery.xmlsafe import parse_xml
from hvfleet.guests.cpuxml import cpus_from_document, cpus_from_texts
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import HostCPU

from .conftest import HOSTS

CPU_DOCS = [p.read_text() for p in sorted((HOSTS / "cpus").glob("*.xml"))]
CAPS_DOCS = [p.read_text() for p in sorted(HOSTS.glob("*/*.caps.xml"))] + [
    p.read_text() for p in sorted(HOSTS.glob("groups/*/*.caps.xml"))
]


def _whole(name: str, text: str) -> list[tuple[str, str, list[str], list[str]]]:
    return [(c.vendor, c.model, c.features, c.disabled_features)
            for c in cpus_from_document(parse_xml(text, name), name)]


def _fields(c: HostCPU) -> tuple[str, str, list[str], list[str]]:
    return (c.vendor, c.model, c.features, c.disabled_features)


_BITS = [
    "<microcode version='{n}'/>",
    '<microcode version="{n}"/>',
    "<counter name='tsc' frequency='{n}' scaling='no'/>",
    "<signature family='6' model='{n}' stepping='7'/>",
    "<topology sockets='1' dies='1' cores='{n}' threads='2'/>",
    "<maxphysaddr mode='emulate' bits='{n}'/>",
    "<pages unit='KiB' size='{n}'/>",
    "<cache level='3' mode='emulate'/>",
    # Not plainly well formed: must reach the parser as written.
    "<microcode version={n}/>",
    "<microcode version='&amp;{n}'/>",
    "<!-- <feature name='pku'/> {n} -->",
    "<microcode version='{n}' version='2'/>",
    "<counter name='tsc' frequency='{n}' name='x'/>",
    # Features in every plain and not-so-plain spelling.
    "<feature name='x{n}' policy='disable'/>",
    "<feature policy='disable' name='pku'/>",
    '<feature policy="require" name="x{n}"/>',
    "<feature name='pku' policy='forbid'/>",
    "<feature name='a&amp;b{n}'/>",
    "<feature name='a\tb{n}'/>",
    "<feature name='a' name='b{n}'/>",
    "<feature policy='disable'/>",
    "<feature name=''/>",
    "<feature name='p{n}' policy='disable' policy='require'/>",
    "<feature policy='dis able' name='q{n}'/>",
    "<feature name=\"it's{n}\"/>",
    "<feature name='say \"{n}\"' policy='disable'/>",
    "<feature name='gt>{n}'/>",
    # What only an XML parser knows: its whitespace, names and characters.
    "<microcode\u00a0version='{n}'/>",
    "\u00a0",
    "<microcode v\u00b2='{n}'/>",
    "<microcode v\u00e9='{n}'/>",
    "<feature name='ctl\x01{n}'/>",
    "<model>Has\rwell{n}</model>",
    "<vendor>a]]>b</vendor>",
    "<model>\x0b</model>",
    "<feature name='\uffff{n}'/>",
    "<microcode a:b='{n}'/>",
    "<microcode xmlns:a='urn:a' a:b='{n}'/>",
    "<counter xmlns='urn:x{n}'/>",
    "<model>Haswell</model>",
    "<vendor> AMD </vendor>",
    "<model>\n  Skylake-Client{n}\n</model>",
    "<arch>i686</arch>",
    "<pages unit='KiB' size='{n}'></pages>",
]
_VOLATILE = st.sampled_from(_BITS)


@st.composite
def host_document(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(CPU_DOCS + CAPS_DOCS))
    # Insert volatile children (and a few other things) after random tags
    # inside the <cpu>, with random indentation.
    start = text.index("<cpu")
    end = text.index("</cpu>", start)
    cut = [i + 1 for i in range(start, end) if text[i] == ">"]
    for _ in range(draw(st.integers(0, 4))):
        # After a tag mostly; anywhere (inside text, inside a tag) sometimes.
        at = draw(st.sampled_from(cut) | st.integers(start, end))
        bit = draw(_VOLATILE).format(n=draw(st.integers(0, 10**9)))
        ws = draw(st.sampled_from(["", "\n", "\n  ", "\t", " "]))
        text = text[:at] + ws + bit + text[at:]
        cut = [c + len(ws) + len(bit) if c > at else c for c in cut]
        end += len(ws) + len(bit)
    if draw(st.booleans()):
        text = "<?xml version='1.0'?>\n" + text
    if "<capabilities" not in text:
        # After the root (a <capabilities> document is read by its host <cpu>
        # only, see below).
        text += draw(st.sampled_from(["", "\n", " \n\t", "\u00a0", "\u2028"]))
    return text


@settings(max_examples=300, deadline=None)
@given(docs=st.lists(host_document(), min_size=1, max_size=8))
def test_reading_the_cpu_part_equals_parsing_each_whole_document(docs: list[str]) -> None:
    named = [(f"h{i}", t) for i, t in enumerate(docs)]
    try:
        want: object = [x for n, t in named for x in _whole(n, t)]
    except InvalidInput:
        want = InvalidInput
    try:
        got: object = [_fields(c) for _, c in cpus_from_texts(named)]
    except InvalidInput:
        got = InvalidInput
    assert got == want


def test_documents_of_the_same_hardware_are_parsed_once() -> None:
    base = (HOSTS / "groups" / "intel-mixed" / "clx-1.caps.xml").read_text()
    docs = [(f"h{i}", base.replace("<microcode version=", f"<microcode x='{i}' version=", 1)
             .replace("</uuid>", f"{i}</uuid>", 1)) for i in range(50)]
    assert len({t for _, t in docs}) == 50
    cpus = cpus_from_texts(docs)
    assert len({id(c) for _, c in cpus}) == 1
    assert cpus[0][1].model == "Cascadelake-Server"


def test_refusals_are_the_same_as_for_whole_documents(tmp_path: Path) -> None:
    for bad in (
        "<cpu><model>Haswell</model><feature policy='require'/></cpu>",  # nameless
        "<cpu><model>Haswell</model>",  # truncated
        '<!DOCTYPE cpu [<!ENTITY e "x">]><cpu><model>&e;</model></cpu>',
        "<capabilities><host><cpu><model>Haswell</model></capabilities>",
    ):
        with pytest.raises(InvalidInput):
            cpus_from_texts([("bad", bad)])
        with pytest.raises(InvalidInput):
            _whole("bad", bad)


def test_a_capabilities_document_is_read_by_its_host_cpu_only() -> None:
    # The point of the targeted read: what follows the host <cpu> (NUMA
    # topology, guests, ...) is not parsed, so it is not judged either.
    text = (HOSTS / "groups" / "intel-mixed" / "clx-1.caps.xml").read_text()
    broken = text.replace("</capabilities>", "<oops></capabilities>")
    with pytest.raises(InvalidInput):
        _whole("h", broken)
    ((_, cpu),) = cpus_from_texts([("h", broken)])
    assert _fields(cpu) == _whole("h", text)[0]
    # A malformed host <cpu> itself is still refused.
    with pytest.raises(InvalidInput):
        cpus_from_texts([("h", text.replace("<model>", "<model x>", 1))])


@pytest.mark.parametrize("bit", _BITS)
def test_every_spelling_reads_as_the_xml_parser_reads_it(bit: str) -> None:
    # Each spelling of the strategy above, deterministically, at the places
    # where it matters: first child, between children, last child.
    base = (HOSTS / "cpus" / "Haswell.xml").read_text()
    bit = bit.format(n=7)
    for text in (base.replace("<cpu>", "<cpu>" + bit, 1),
                 base.replace("</model>", "</model>\n  " + bit, 1),
                 base.replace("</cpu>", bit + "</cpu>", 1)):
        try:
            want: object = _whole("h", text)
        except InvalidInput:
            want = InvalidInput
        try:
            got: object = [_fields(c) for _, c in cpus_from_texts([("h", text)])]
        except InvalidInput:
            got = InvalidInput
        assert got == want, text


def test_a_host_cpu_read_from_text_is_the_model_construct_one() -> None:
    # cpuxml builds HostCPUs without model_construct's per-field walk: the
    # result must be the same object in every respect pydantic looks at.
    from hvfleet.guests.cpuxml import _HOST_CPU_PLAIN, _host_cpu

    assert _HOST_CPU_PLAIN  # else the short way is never taken and this proves nothing
    fast = _host_cpu("Intel", "Haswell", ["vmx", "pdpe1gb"], ["pcid"], "h1")
    slow = HostCPU.model_construct(vendor="Intel", model="Haswell", features=["vmx", "pdpe1gb"],
                                   disabled_features=["pcid"], source="h1")
    assert fast == slow
    assert fast.__dict__ == slow.__dict__
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.__pydantic_extra__ == slow.__pydantic_extra__
    assert fast.__pydantic_private__ == slow.__pydantic_private__
    assert fast.to_dict() == slow.to_dict()
    assert HostCPU.model_validate(fast.to_dict()) == fast
    assert fast.model_copy(update={"model": "Broadwell"}).model == "Broadwell"
    fast.model = "Skylake-Client"  # validate_assignment still applies
    assert fast.model == "Skylake-Client" and slow.model == "Haswell"
    with pytest.raises(ValueError):
        fast.features = 3  # type: ignore[assignment]
