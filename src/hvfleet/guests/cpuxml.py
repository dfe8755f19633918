"""Host CPUs read from XML documents: `<cpu>` files (`virsh cpu-baseline`
style), `<capabilities>` and `<domainCapabilities>` documents, and many raw
documents at once for a fleet-wide baseline, where only each document's
`<cpu>` part is read and each distinct CPU definition parsed once.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Sequence

from lxml import etree

from hvfleet.model.errors import InvalidInput
from hvfleet.model.hostcaps import CPUModelInfo, HostCPU

# Only XML's own whitespace, names and characters: Python's \s and \w take
# more (a no-break space, "²"), which an XML parser would refuse or keep.
_WS = r"[ \t\n\r]"
# No ":": a prefixed attribute needs its namespace declared, which the XML
# parser checks (those documents go to it).
_NAME = r"[A-Za-z_][A-Za-z0-9_.-]*"
_BAD = r"\x00-\x1f\ud800-\udfff\ufffe\uffff"  # never in a plain attribute value
# Children of a host <cpu> that differ between hosts of the same hardware and
# say nothing about its features (microcode revision, TSC frequency, topology,
# ...), when self-closing with plainly well-formed attributes, none twice
# (twice is malformed: for the parser to refuse).
_VOLATILE_TAG = r"<(?:microcode|counter|topology|signature|maxphysaddr|cache|pages)"
_ATTRIBUTE = rf"""{_WS}+{_NAME}{_WS}*={_WS}*(?:"[^"<&{_BAD}]*"|'[^'<&{_BAD}]*')"""
# With one attribute (a microcode line), none can be there twice: no
# look-ahead, whose group, once set, costs each later child a save of it.
_VOLATILE_ONE = rf"{_VOLATILE_TAG}(?:{_ATTRIBUTE})?{_WS}*/>"
_VOLATILE = (
    rf"(?:{_VOLATILE_ONE}"
    rf"|{_VOLATILE_TAG}(?![^<>]*?{_WS}(?P<att>{_NAME}){_WS}*=[^<>]*{_WS}(?P=att){_WS}*=)"
    rf"(?:{_ATTRIBUTE})*{_WS}*/>)"
)
# ... removed only with nothing but whitespace between them and the tags
# around them: that changes no element's text.
_VOLATILE_RE = re.compile(rf"(?<=>){_WS}*{_VOLATILE}(?={_WS}*<)")
# Whitespace between tags: indentation differs between libvirt versions and
# tools; values are read stripped, so it never carries meaning here.
_BETWEEN_TAGS_RE = re.compile(rf">{_WS}+<")
# The host CPU of a `virsh capabilities` document: the <cpu> right after
# <host> (and its <uuid>), before the host's NUMA topology with its <cpu id=>s.
_CAPS_HOST_CPU_RE = re.compile(
    rf"(?:<\?xml[^>]*\?>{_WS}*)?<capabilities>{_WS}*<host>{_WS}*(?:<uuid>[^<]*</uuid>{_WS}*)?"
    r"(<cpu>.*?</cpu>)",
    re.S,
)
# A host <cpu> in its plainest form: children arch, model and vendor with
# plain text, features with plainly quoted name (and policy) attributes
# holding no quote character of either kind, and volatile children, with
# whitespace between them; nothing else (no entity, no attribute value or
# text an XML parser would normalise or refuse, no duplicate attribute). Such
# a document means the same to any XML parser, so it is read with regular
# expressions; anything else goes to the XML parser. The quantifiers are
# possessive: every child starts with "<" and ends with ">", so there is
# never anything to backtrack into, and the engine need not keep the places.
_PLAIN_VALUE = rf"""(?:"[^"'<&{_BAD}]*+"|'[^"'<&{_BAD}]*+')"""
# A feature's name is never empty in the plain form: a nameless feature goes
# to the parser's path, which refuses it with its message.
_PLAIN_NAME = rf"""(?:"[^"'<&{_BAD}]++"|'[^"'<&{_BAD}]++')"""
_PLAIN_TEXT = r"[^<&>\r\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]*+"
_PLAIN_CHILD = (
    # The commonest first.
    rf"<feature name={_PLAIN_NAME}(?: policy={_PLAIN_VALUE})?/>"
    rf"|<(?:arch>{_PLAIN_TEXT}</arch|model>{_PLAIN_TEXT}</model|vendor>{_PLAIN_TEXT}</vendor)>"
    rf"|<feature policy={_PLAIN_VALUE} name={_PLAIN_NAME}/>"
)
_PLAIN_CPU_RE = re.compile(
    # The usual head, arch, model and vendor (after a microcode line, say),
    # with model and vendor taken, which are then the first ones; any of
    # those children may also come anywhere in the rest.
    rf"<cpu>(?:{_WS}*+{_VOLATILE_ONE})*+"
    rf"(?:(?:{_WS}*+<arch>{_PLAIN_TEXT}</arch>)?+{_WS}*+<model>({_PLAIN_TEXT})</model>"
    rf"{_WS}*+<vendor>({_PLAIN_TEXT})</vendor>)?+"
    rf"(?:{_WS}*+(?:{_PLAIN_CHILD}|{_VOLATILE}))*+{_WS}*</cpu>{_WS}*"
)
# Once a document is known plain, these read it: every feature is in one of
# the plain spellings above (so either quote ends a value), and nothing else
# in it can look like one (no value or text holds a "<").
_PLAIN_FEATURE_RE = re.compile(
    r"""<feature (?:policy=["']([^"']*)["'] )?name=["']([^"']*)["']"""
    r"""(?: policy=["']([^"']*)["'])?/>"""
)
_PLAIN_NAME_RE = re.compile(r"""<feature name=["']([^"']*)["']/>""")

CPUFields = tuple[str, str, tuple[str, ...], tuple[str, ...]]


def _host_cpu_slice(text: str) -> str:
    """A `<capabilities>` document's host `<cpu>` element; other documents whole."""
    if "<!" not in text:
        m = _CAPS_HOST_CPU_RE.match(text)
        if m and m.group(1).count("<cpu") == 1:
            return m.group(1)
    return text


def _cpu_part(text: str) -> str:
    """The part of a host XML document that the baseline needs: its host
    `<cpu>` (`_host_cpu_slice`), less the children that differ between hosts
    of the same hardware and the whitespace between tags. Documents with
    comments, CDATA or a DOCTYPE are returned whole, to be parsed whole."""
    if "<!" in text:
        return text
    text = _host_cpu_slice(text)
    # Only inside the <cpu> element(s): outside, a removal could turn a
    # malformed document (two roots) into a well-formed one.
    first = text.find("<cpu")
    inside = text.find(">", first)
    last = text.rfind("</cpu>")
    if first >= 0 and 0 <= inside < last:
        text = text[:inside] + _VOLATILE_RE.sub("", text[inside:last + 1]) + text[last + 1:]
    return _BETWEEN_TAGS_RE.sub("><", text)


def _plain_fields(part: str) -> tuple[str, str, list[str], list[str]] | None:
    """(vendor, model, features, disabled) of a plain `<cpu>`, else None."""
    plain = _PLAIN_CPU_RE.fullmatch(part)
    if plain is None:
        return None
    if "policy=" not in part:
        # A host CPU as `virsh capabilities` gives it: every feature present.
        names: list[str] = _PLAIN_NAME_RE.findall(part)
        disabled: list[str] = []
    else:
        found = [(n, p1 or p2) for p1, n, p2 in _PLAIN_FEATURE_RE.findall(part)]
        names = [n for n, p in found if p not in ("disable", "forbid")]
        disabled = [n for n, p in found if p in ("disable", "forbid")]
    model, vendor = plain.group(1, 2)
    if model is None:
        # Not in the usual head: the first <model> and <vendor>, as find()
        # takes; in a plain <cpu> each "<" starts a tag and no text holds
        # one, so the next closing tag is theirs.
        m = part.find("<model>")
        model = part[m + 7:part.index("</model>", m)] if m >= 0 else ""
        v = part.find("<vendor>")
        vendor = part[v + 8:part.index("</vendor>", v)] if v >= 0 else ""
    return (vendor.strip(), model.strip(), names, disabled)


_object_setattr = object.__setattr__
_HOST_CPU_FIELDS = frozenset(("vendor", "model", "features", "disabled_features", "source"))
# What model_construct would do otherwise: the short way only while it is this.
_HOST_CPU_PLAIN = (set(HostCPU.model_fields) == _HOST_CPU_FIELDS
                   and not (HostCPU.__pydantic_post_init__ or HostCPU.__pydantic_root_model__
                            or HostCPU.model_config.get("extra") == "allow"))


def _host_cpu(
    vendor: str, model: str, features: list[str], disabled: list[str], source: str
) -> HostCPU:
    """`HostCPU.model_construct` with every field given, which it then
    fills in just so: without its per-field walk over aliases and defaults,
    a quarter of the time of reading a thousand distinct documents. Every
    field is a str or a list of str by construction: nothing to validate.
    (tests/guests/test_cpu_texts.py checks it against model_construct.)"""
    if not _HOST_CPU_PLAIN:  # a hook or an extra-field rule to honour: the long way
        return HostCPU.model_construct(vendor=vendor, model=model, features=features,
                                       disabled_features=disabled, source=source)
    cpu = HostCPU.__new__(HostCPU)
    _object_setattr(cpu, "__dict__", {"vendor": vendor, "model": model, "features": features,
                                      "disabled_features": disabled, "source": source})
    _object_setattr(cpu, "__pydantic_fields_set__", set(_HOST_CPU_FIELDS))
    _object_setattr(cpu, "__pydantic_extra__", None)
    _object_setattr(cpu, "__pydantic_private__", None)
    return cpu


def cpus_from_texts(docs: Sequence[tuple[str, str]]) -> list[tuple[str, HostCPU]]:
    """(name, HostCPU) for (name, XML text) pairs.

    Only the `<cpu>` element is read, and each distinct CPU definition is
    made once: a fleet's documents are all distinct (a microcode line, a TSC
    frequency, a UUID per host) while its CPU definitions are a few dozen.
    A plain host `<cpu>` is read by regular expressions (`_plain_fields`);
    any other document is cut down to its CPU part (`_cpu_part`) and parsed."""
    # A thousand documents allocate tens of thousands of small acyclic
    # objects: without the cyclic GC scanning everything alive on each burst,
    # a long-lived process (API server, scheduler) reads them about 1.5x
    # faster; reference counting frees them all the same.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _cpus_from_texts(docs)
    finally:
        if enabled:
            gc.enable()


def _cpus_from_texts(docs: Sequence[tuple[str, str]]) -> list[tuple[str, HostCPU]]:
    from hvfleet.discovery.xmlsafe import MAX_XML_BYTES, parse_xml

    # A document's CPU: one for a plain <cpu>, a list from the parser's path.
    by_text: dict[str, HostCPU | list[HostCPU]] = {}
    by_fields: dict[CPUFields, HostCPU] = {}
    by_part: dict[str, list[HostCPU]] = {}
    out: list[tuple[str, HostCPU]] = []
    for name, text in docs:
        found = by_text.get(text)
        if found is None:
            if len(text) > MAX_XML_BYTES:
                raise InvalidInput(f"{name}: document is larger than {MAX_XML_BYTES} bytes")
            # (A <cpu> document is its own host <cpu>.)
            fields = _plain_fields(text if text.startswith("<cpu>") else _host_cpu_slice(text))
            if fields is not None:
                vendor, model, feats, disabled = fields
                key = (vendor, model, tuple(feats), tuple(disabled))
                found = by_fields.get(key)
                if found is None:
                    found = by_fields[key] = _host_cpu(vendor, model, feats, disabled, name)
            else:
                part = _cpu_part(text)
                found = by_part.get(part)
                if found is None:
                    found = by_part[part] = cpus_from_document(parse_xml(part, name), name)
            by_text[text] = found
        if not isinstance(found, list):
            out.append((name, found))
        elif len(found) == 1:
            out.append((name, found[0]))
        else:
            out += [(f"{name}#{i + 1}", c) for i, c in enumerate(found)]
    return out


def cpus_from_document(root: etree._Element, where: str) -> list[HostCPU]:
    """Host CPUs in a `virsh cpu-baseline`-style file, a `<capabilities>` or a
    `<domainCapabilities>` document (its host-model CPU)."""
    from hvfleet.discovery.capabilities import parse_cpu_element

    if root.tag == "cpu":
        return [parse_cpu_element(root, where)]
    if root.tag == "capabilities":
        cpu = root.find("host/cpu")
        if cpu is None:
            raise InvalidInput(f"{where}: <capabilities> without <host><cpu>")
        return [parse_cpu_element(cpu, where)]
    if root.tag == "domainCapabilities":
        for mode in root.findall("cpu/mode"):
            if mode.get("name") == "host-model" and mode.get("supported") == "yes":
                return [parse_cpu_element(mode, where)]
        raise InvalidInput(f"{where}: <domainCapabilities> has no supported host-model CPU")
    found = list(root.iter("cpu"))
    if not found:
        raise InvalidInput(f"{where}: no <cpu> element")
    return [parse_cpu_element(c, f"{where} cpu #{i + 1}") for i, c in enumerate(found)]


def qemu_models_from_document(root: etree._Element) -> list[CPUModelInfo] | None:
    """The CPU models a `<domainCapabilities>` document says its QEMU offers;
    None for other documents (they do not say)."""
    from hvfleet.discovery.capabilities import parse_cpu_models

    return parse_cpu_models(root) if root.tag == "domainCapabilities" else None
